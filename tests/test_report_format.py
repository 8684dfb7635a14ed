"""The report's types are its schema: docs/report-format.md's tables are rendered from their fields,
the JSON codec round-trips them, a wrong field is named, older schemas still read."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest

from openclaw_launch.codec import DOC, SINCE, ReportShapeError, absent_value, from_json, hints, to_json
from openclaw_launch.errors import OpenclawError
from openclaw_launch.report.build import load_report, write_report
from openclaw_launch.report.format import format_report
from openclaw_launch.report.model import READ_SCHEMAS, SCHEMA, SCHEMA_VERSION, JobReport, NodeReport
from tests.report_samples import EXCLUSION, HANG, PREFLIGHT, STRAGGLER, node_report
from tools import report_docs as docs
from tools.markdown_tables import marked_tables


def test_docs_tables_are_the_generated_ones() -> None:
    """Edit the fields' doc text, then `python -m tools.report_docs --write`."""
    text = docs.DOCS_FILE.read_text()
    assert marked_tables(text) == list(docs.TABLES)
    assert docs.update(text) == text


def test_docs_name_the_schemas_still_read() -> None:
    text = docs.DOCS_FILE.read_text()
    assert text.startswith(f"# Run report (`--report PATH`, schema `{SCHEMA}`)")
    assert list(READ_SCHEMAS.values()) == list(range(1, SCHEMA_VERSION + 1))
    assert f"earlier schemas, `openclaw-report/1` to `/{SCHEMA_VERSION - 1}`, still render" in text


def _nested_types(cls: type) -> set[type]:
    found = {cls}
    for tp in hints(cls).values():
        for t in (tp, *typing.get_args(tp), *(a for arg in typing.get_args(tp) for a in typing.get_args(arg))):
            if dataclasses.is_dataclass(t) and t not in found:
                found |= _nested_types(typing.cast(type, t))
    return found


def test_every_type_in_a_report_has_a_table_and_every_field_a_meaning() -> None:
    types = _nested_types(NodeReport) | _nested_types(JobReport)
    documented = set(docs.TABLES.values())
    assert {t.__name__ for t in types - documented} == {"RankOutcome"}  # the first fields of ranks[]
    for t in types:
        assert all(f.metadata.get(DOC) for f in dataclasses.fields(t)), t


def test_a_full_report_round_trips_through_the_file(tmp_path: Path) -> None:
    report = node_report(
        stragglers=(STRAGGLER,), hang=HANG, preflight=PREFLIGHT, exit_code=124, exclusions=(EXCLUSION,)
    )
    path = tmp_path / "run.json"
    write_report(path, report)
    assert load_report(path) == report
    data = json.loads(path.read_text())
    assert list(data) == [f.name for f in dataclasses.fields(NodeReport)]
    text = format_report(report)
    assert "hang: no step for 3.0 s; stuck: rank 1 in compute (exit code 124)" in text
    assert "straggler: rank 1 on node n0: its input/host stage (the DataLoader) +10.0 ms/step" in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["ranks"][1].update(exit_code="x"), "ranks[1].exit_code: expected int or null, found 'x'"),
        (lambda d: d.pop("containment"), "containment: missing"),
        (lambda d: d["ranks"][0]["statistics"]["step_time_s"].pop("p99"), "ranks[0].statistics.step_time_s.p99"),
        (lambda d: d.update(attempt_history={}), "attempt_history: expected a list, found {}"),
        (lambda d: d["ranks"][0].update(gpu=[]), "ranks[0].gpu: expected an object or null, found []"),
        (lambda d: d.update(exit_code=True), "exit_code: expected int, found True"),
    ],
)
def test_a_wrong_field_is_one_error_naming_it(tmp_path: Path, change: typing.Any, message: str) -> None:
    data = to_json(node_report())
    change(data)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    with pytest.raises(OpenclawError, match="not a well-formed report") as e:
        load_report(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_every_field_added_later_says_since_which_schema_and_what_an_older_report_reads() -> None:
    """One declaration per field (``since``), which the reader and the docs' text both use."""
    added = 0
    for t in _nested_types(NodeReport) | _nested_types(JobReport):
        for f in dataclasses.fields(t):
            if f.metadata[SINCE] is not None:
                assert 1 < f.metadata[SINCE] <= SCHEMA_VERSION, (t, f.name)
                absent_value(f, hints(t)[f.name])  # a TypeError without one
                added += 1
    assert added > 0


def test_schema_2_reports_still_read_with_the_keys_added_since_as_absent(tmp_path: Path) -> None:
    """A node report of schema 2, before containment, the preflight, the history or the port existed."""
    data = to_json(node_report())
    data["schema"] = "openclaw-report/2"
    for key in ("master_port", "attempt_history", "log_errors", "console_dropped_lines", "guardian_lost"):
        del data[key]
    for key in ("containment", "hang", "preflight"):
        del data[key]
    for rank in data["ranks"]:
        del rank["nic"], rank["statistics"]["gpu_longest_collective_s"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = load_report(path)
    assert isinstance(old, NodeReport)
    assert (old.attempt_history, old.console_dropped_lines, old.containment, old.hang) == ((), 0, "unrecorded", None)
    assert old.ranks[0].statistics is not None and old.ranks[0].statistics.gpu_longest_collective_s is None
    assert "run job1 on n0: exit 0" in format_report(old)
    with pytest.raises(ReportShapeError, match="attempt_history: missing"):  # schema 3 has it
        from_json(NodeReport, data, schema=3)


def test_a_key_an_older_schema_had_is_still_required(tmp_path: Path) -> None:
    """Schema 4 added the port; 5 the failure class: a schema 4 report without its port is not one."""
    data = to_json(node_report())
    data["schema"] = "openclaw-report/4"
    for attempt in data["attempt_history"]:
        del attempt["failure"], attempt["membership"]
    path = tmp_path / "v4.json"
    path.write_text(json.dumps(data))
    assert all(a.failure is None for a in load_report(path).attempt_history)
    del data["master_port"]
    path.write_text(json.dumps(data))
    with pytest.raises(OpenclawError, match="master_port: missing"):
        load_report(path)


def test_a_schema_1_report_renders_without_statistics(tmp_path: Path) -> None:
    rank = {"rank": 0, "local_rank": 0, "node": "n", "attempt": 0, "pid": 5, "exit_code": 0, "signal": None}
    rank |= {"wall_s": 1.0, "cpu_s": 0.5, "max_rss_kib": 1, "bound_cpus": "0", "bound_mems": "0"}
    rank |= {"binding_warning": None, "gpu_uuid": None, "pci_bus_id": None, "numa_node": 0, "planned_cpus": "0"}
    old = {"schema": "openclaw-report/1", "run_id": "r", "node": "n", "world_size": 1, "exit_code": 0}
    old |= {"attempts": 1, "signal_received": None, "root_cause": None, "unkillable_pids": [], "ranks": [rank]}
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    report = load_report(path)
    assert report.statistics is None and report.ranks[0].statistics is None
    assert "run r on n: exit 0, 1 attempt(s)" in format_report(report)


@pytest.mark.parametrize(
    "path", sorted((docs.DOCS_FILE.parents[1] / "benchmarks" / "results").glob("*/*.json")), ids=lambda p: p.name
)
def test_recorded_reports_render(path: Path) -> None:
    """Reports the H200 runs wrote (benchmarks/results), of any schema still read, read and render."""
    if json.loads(path.read_text()).get("schema") not in READ_SCHEMAS:
        pytest.skip("not a run report")
    report = load_report(path)
    assert report.ranks and "straggler" in format_report(report)
