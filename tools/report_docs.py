"""The tables of docs/report-format.md, rendered from the report types' fields.

Each table follows a marker ``<!-- table: NAME -->`` (tools/markdown_tables.py: the rule of every
generated table). A field added after its object says from which schema every report has it and what
an older report reads instead, from its ``since`` (codec.doc), the declaration the reader uses.
``python -m tools.report_docs [--write] [FILE]`` prints what differs (or rewrites FILE);
tests/test_report_format.py holds the file to the fields.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from openclaw_launch.codec import DOC, JOB_DOC, SINCE, absent_value, hints, type_name
from openclaw_launch.report.failure import AttemptFailure
from openclaw_launch.report.membership import AttemptMembership, Exclusion
from openclaw_launch.report.model import AttemptEntry, JobReport, NodeReport, NodeSummary, Report
from openclaw_launch.report.preflight import (
    NetworkExpectation,
    PreflightDecision,
    PreflightExclusion,
    PreflightGemm,
    PreflightPair,
    PreflightTier,
    PreflightVerdict,
)
from openclaw_launch.report.rank import RankEntry, SectionTimes, StepStatistics, StepTimes
from openclaw_launch.stats.result import (
    DroppedDatagrams,
    GpuStats,
    Hang,
    HangCause,
    HangRank,
    MemoryAsymmetry,
    RunStatistics,
    StepImbalance,
    Straggler,
)
from tools.markdown_tables import check_or_write, update_tables

DOCS_FILE = Path(__file__).resolve().parents[1] / "docs" / "report-format.md"
# table name in the docs -> the type whose fields it lists
TABLES: dict[str, type] = {
    "report": NodeReport,
    "statistics": RunStatistics,
    "statistics.dropped_datagrams": DroppedDatagrams,
    "stragglers[]": Straggler,
    "step_imbalance": StepImbalance,
    "memory_asymmetry[]": MemoryAsymmetry,
    "exclusions[]": Exclusion,
    "hang": Hang,
    "hang.ranks[]": HangRank,
    "hang.cause": HangCause,
    "attempt_history[]": AttemptEntry,
    "attempt_history[].membership": AttemptMembership,
    "attempt_history[].failure": AttemptFailure,
    "ranks[]": RankEntry,
    "ranks[].statistics": StepStatistics,
    "step_time_s": StepTimes,
    "sections": SectionTimes,
    "ranks[].gpu": GpuStats,
    "preflight": PreflightVerdict,
    "preflight.tiers[]": PreflightTier,
    "preflight.network[]": NetworkExpectation,
    "preflight.decision": PreflightDecision,
    "preflight.decision.gemm[]": PreflightGemm,
    "preflight.decision.pairs[]": PreflightPair,
    "preflight.decision.excluded[]": PreflightExclusion,
    "job report": JobReport,
    "nodes[]": NodeSummary,
}


def render(name: str) -> str:
    """The markdown table ``name``: a row per field (key, type, meaning). The job report's lists
    only what differs from a node's: its own keys and the aggregations."""
    cls = TABLES[name]
    types_of = hints(cls)
    rows = ["| key | type | meaning |", "|---|---|---|"]
    shared = {f.name for f in dataclasses.fields(Report)}
    for f in dataclasses.fields(cls):
        text = f.metadata[DOC]
        if cls is JobReport:
            if f.name in shared and not f.metadata[JOB_DOC]:
                continue
            text = f.metadata[JOB_DOC] or text
        if f.metadata[SINCE] is not None:
            absent = plain(absent_value(f, types_of[f.name]))
            text += f" (absent before schema {f.metadata[SINCE]}: read as {absent})"
        rows.append(f"| `{f.name}` | {type_name(types_of[f.name])} | {text} |")
    return "\n".join(rows) + "\n"


def plain(value: object) -> str:
    """A value as the docs say it: null, false, 0, `unrecorded`; an empty list or object: empty."""
    if isinstance(value, str):
        return f"`{value}`"
    return "empty" if value in ((), {}) else json.dumps(value)


def update(text: str) -> str:
    """``text`` with every marked table rendered afresh."""
    return update_tables(text, render)


def main(argv: list[str]) -> int:
    path = Path(next((a for a in argv if a != "--write"), DOCS_FILE))
    return check_or_write(path, render, "the report types", "--write" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
