"""``openclaw-launch preflight``: run the real plan with the preflight worker, then judge each tier.

The workers go through ``launch`` exactly as a job does (binding, environment, MPS, supervision,
the run report), so a preflight fails where the job would. The launcher side never imports torch.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openclaw_launch.agents.exclude_file import write_exclude_file
from openclaw_launch.codec import to_json
from openclaw_launch.config.defaults import GRACE_PERIOD_S, PREFLIGHT_ITERS, PREFLIGHT_SLOW_PCT
from openclaw_launch.config.model import PreflightSettings
from openclaw_launch.errors import OpenclawError
from openclaw_launch.files import check_output_path, write_atomic
from openclaw_launch.limits import MAX_RECORD_BYTES
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.preflight.decide import GEMM_MATMULS, GEMM_N, GEMM_REPS, Floors, decide, format_decision
from openclaw_launch.preflight.decide import exit_code as decision_exit_code
from openclaw_launch.preflight.record import Recording, decision_floors, record, recorded_floors, usable_floors
from openclaw_launch.preflight.tiers import (
    PREFLIGHT_SCHEMA,
    WARMUP_ITERS,
    default_size_bytes,
    expectations,
    format_line,
    judge,
    network_expectations,
    plan_tiers,
)
from openclaw_launch.report.preflight import PreflightDecision, PreflightTier, PreflightVerdict
from openclaw_launch.topology.model import Topology

if TYPE_CHECKING:
    from openclaw_launch.run.supervise import SuperviseOptions

WORKER_MODULE = "openclaw_launch.preflight.worker"
#: The launcher's exit code when the workers themselves failed (a crash, a hang killed by a signal
#: to the launcher keeps 128+N): distinct from 1, "measured and found slow or wrong".
WORKERS_FAILED = 3


#: How the probe's plan runs: (plan, supervision options, report path, verdict) -> exit code.
Launch = Callable[[LaunchPlan, "SuperviseOptions", "str | None", Callable[[int], PreflightVerdict]], int]


@dataclass(frozen=True)
class PreflightOptions:
    size_mib: int | None = None
    iters: int | None = None
    record_path: str | None = None
    expect_path: str | None = None
    as_json: bool = False
    report_path: str | None = None
    grace_period_s: float = GRACE_PERIOD_S
    timeout_s: float = 300.0  # a collective that hangs this long fails its worker
    slow_pct: float | None = None  # None: PREFLIGHT_SLOW_PCT of the backend
    exclude_path: str | None = None
    scope: str = "job"  # "job": every node together (GEMMs compared, node pairs); "node": this one alone
    host_names: bool = False  # the exclude list names hosts (no config: nodes are node0, node1, ...)


def run_preflight(
    make_plan: Callable[[tuple[str, ...]], LaunchPlan],
    read_topology: Callable[[bool], Topology],
    settings: PreflightSettings,
    options: PreflightOptions,
    launch: Launch,
) -> int:
    """The whole command; returns its exit code (docs/preflight.md). ``make_plan(script)`` plans
    ``python -m SCRIPT...`` as ``run`` would; ``read_topology(with_gpus)`` reads the same host;
    ``launch`` runs the probe's plan through the job's own machinery (job/launch.py, a stage above)."""
    outputs = (
        ("--record", options.record_path),
        ("--report", options.report_path),
        ("--exclude-file", options.exclude_path),
    )
    for option, path in outputs:
        problem = check_output_path(path) if path else None
        if problem is not None:  # before minutes of measuring, not after
            raise OpenclawError(f"{option} {path}: {problem}")
    recording = _read_expect(options.expect_path) if options.expect_path else None
    work = Path(tempfile.mkdtemp(prefix="openclaw-preflight-"))
    try:
        spec_path, out_dir = work / "spec.json", work / "results"
        out_dir.mkdir()
        plan = make_plan((WORKER_MODULE, str(spec_path), str(out_dir)))
        topology = read_topology(plan.backend == "nccl")
        tiers = plan_tiers(plan, topology)
        size = default_size_bytes(plan, settings, options.size_mib)
        recorded, record_warnings = _compare(recording, options.expect_path or "", tiers, plan, size)
        expected = expectations(tiers, plan, topology, settings, recorded, options.expect_path or "")
        iters = options.iters or settings.iters or PREFLIGHT_ITERS
        kind = "gpu" if plan.backend == "nccl" else "cpu"
        slow_pct = options.slow_pct if options.slow_pct is not None else PREFLIGHT_SLOW_PCT[kind]
        floors, floor_warnings = (
            decision_floors(recording, options.expect_path or "", GEMM_N[kind], size)
            if recording
            else (Floors({}, {}), [])
        )
        job = options.scope == "job" and plan.nnodes > 1
        _write_spec(spec_path, plan, tiers, size, iters, options, job)
        for w in (*plan.warnings, *record_warnings, *floor_warnings):
            print(f"openclaw-launch: warning: {w}", file=sys.stderr)
        gpus = {r.rank: r.gpu_index for r in plan.ranks}
        judged: list[PreflightVerdict] = []

        def verdict(launch_code: int) -> PreflightVerdict:
            """Judged once the workers ended, before the run report is built (it holds the verdict)."""
            per_rank = _read_results(out_dir)
            results = [
                judge(
                    t,
                    per_rank,
                    expected[t.name],
                    size,
                    iters,
                    tuple(sorted({g for r in t.ranks if (g := gpus[r]) is not None})),
                )
                for t in tiers
            ]
            world = next((d["world"] for d in per_rank.values() if d.get("world")), None)
            decision = decide(world, size, iters, slow_pct, floors) if world else None
            judged.append(_document(plan, topology, results, decision, size, iters, launch_code, job))
            return judged[-1]

        launch_code = _launch(plan, options, verdict, launch)
        doc = judged[-1] if judged else verdict(launch_code)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _output(doc, options.as_json)
    if options.record_path:
        text = json.dumps(to_json(record(doc.tiers, plan, doc.decision)), indent=2) + "\n"
        _write("--record", options.record_path, lambda path: write_atomic(path, text), doc.exit_code)
    if options.exclude_path:  # also when nothing is excluded: a stale list must not stay behind
        hosts = [x.host for x in doc.decision.excluded] if doc.decision else []
        _write("--exclude-file", options.exclude_path, lambda path: write_exclude_file(path, hosts), doc.exit_code)
    return doc.exit_code


def _read_expect(path: str) -> Recording:
    """Through the bounded reader: a FIFO, /dev/zero or deep JSON is one line, exit 2."""
    from openclaw_launch.safe_read import InputFileError, read_json

    try:
        return recorded_floors(read_json(path, "preflight recording", MAX_RECORD_BYTES))
    except InputFileError as e:
        raise OpenclawError(f"--expect: {e}") from None
    except ValueError as e:
        raise OpenclawError(f"--expect {path}: {e}") from None


def _compare(
    recording: Recording | None, source: str, tiers: list[Any], plan: LaunchPlan, size: int
) -> tuple[dict[str, float] | None, list[str]]:
    if recording is None:
        return None, []
    try:
        return usable_floors(recording, source, tiers, plan, size)
    except ValueError as e:
        raise OpenclawError(f"--expect {source}: {e}") from None


def _write_spec(
    path: Path, plan: LaunchPlan, tiers: list[Any], size: int, iters: int, options: PreflightOptions, job: bool
) -> None:
    import socket

    from openclaw_launch.plan.context import free_port

    kind = "gpu" if plan.backend == "nccl" else "cpu"
    firsts: dict[str | None, Any] = {}
    for r in plan.ranks:  # one GEMM per GPU (its first rank), one per CPU rank
        firsts.setdefault(r.gpu_uuid or f"rank{r.rank}", r)
    gemm_ranks = {str(r.rank): {"gpu_index": r.gpu_index, "gpu_uuid": r.gpu_uuid} for r in firsts.values()}

    spec = {
        "ranks": [r.rank for r in plan.ranks],
        "port": free_port(),
        "device": "cuda" if plan.backend == "nccl" else "cpu",
        "size_bytes": size,
        "iters": iters,
        "warmup": WARMUP_ITERS,
        "timeout_s": options.timeout_s,
        "tiers": [{"name": t.name, "ranks": list(t.ranks)} for t in tiers],
        "node": plan.node,
        "node_rank": plan.node_rank,
        "host": socket.gethostname().split(".")[0] if options.host_names else plan.node,
        "job": job,
        "gemm": {"n": GEMM_N[kind], "reps": GEMM_REPS[kind], "matmuls": GEMM_MATMULS[kind], "ranks": gemm_ranks},
    }
    path.write_text(json.dumps(spec))


def _launch(
    plan: LaunchPlan, options: PreflightOptions, verdict: Callable[[int], PreflightVerdict], launch: Launch
) -> int:
    """The workers' console goes to stderr so that stdout holds only the verdict (or the JSON).
    ``verdict`` goes into the run report ``launch`` writes."""
    from openclaw_launch.run.supervise import SuperviseOptions

    supervise = SuperviseOptions(grace_period_s=options.grace_period_s, stdout=sys.stderr, error_files_kept=False)
    return launch(plan, supervise, options.report_path, verdict)


def _read_results(out_dir: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for f in out_dir.glob("rank-*.json"):
        try:
            doc = json.loads(f.read_text())
            out[int(doc["rank"])] = doc
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written or foreign file: that rank counts as missing
    return out


def _document(
    plan: LaunchPlan,
    topology: Topology,
    results: list[PreflightTier],
    decision: PreflightDecision | None,
    size: int,
    iters: int,
    launch_code: int,
    job: bool,
) -> PreflightVerdict:
    failed = any(r.status == "fail" for r in results)
    code = (
        decision_exit_code(failed, decision)
        if launch_code == 0
        else launch_code
        if launch_code >= 128
        else WORKERS_FAILED
    )
    return PreflightVerdict(
        schema=PREFLIGHT_SCHEMA,
        node=plan.node,
        backend=plan.backend,
        scope="job" if job else "node",
        size_bytes=size,
        iters=iters,
        tiers=tuple(results),
        network=tuple(network_expectations(topology)),
        decision=decision,
        workers_exit_code=launch_code,
        exit_code=code,
    )


def _output(doc: PreflightVerdict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(to_json(doc), indent=2))
        return
    for r in doc.tiers:
        print(format_line(r))
    if not doc.tiers:
        print("INFO  node  one rank: nothing to all-reduce")
    for line in format_decision(doc.decision) if doc.decision else ():
        print(line)
    for n in doc.network:
        print(
            f"INFO  {n.port}  {n.rate}: expected busbw >= {n.expected_busbw_gbps:g} GB/s "
            "(not compared: node pairs are judged against each other and --expect)"
        )
    counts = {s: sum(r.status == s for r in doc.tiers) for s in ("pass", "warn", "fail", "info")}
    tail = f"; the workers failed (exit {doc.workers_exit_code})" if doc.workers_exit_code else ""
    if doc.decision is not None:
        d = doc.decision
        slow = sum(g.status != "pass" for g in d.gemm) + sum(p.status != "pass" for p in d.pairs)
        out = f"exclude {d.exclude_hostlist}" if d.excluded else "nothing to exclude"
        tail += f"; {len(d.gemm)} GEMMs and {len(d.pairs)} node pairs ({d.rounds} rounds), {slow} slow: {out}"
    print(
        f"preflight on {doc.node}: {counts['pass']} passed, {counts['warn']} warnings, "
        f"{counts['fail']} failed, {counts['info']} without expectation{tail}"
    )


def _write(option: str, path: str, write: Callable[[str], object], code: int) -> None:
    """An output, once measured: a failed write (a full disk) is said, the verdict's code stands."""
    try:
        write(path)
    except OSError as e:
        print(
            f"openclaw-launch: error: {option} {path}: cannot write it ({e.strerror or e}); "
            f"the exit code {code} stands",
            file=sys.stderr,
        )
