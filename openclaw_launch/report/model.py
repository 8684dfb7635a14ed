"""The run report's types: a node's report, the job's (several nodes), and what they hold (the
statistics' parts are stats/result.py's, which the statistics session produces).

Frozen and built once from final data (report/build.py for a node, agents/merge.py for the job);
``codec.to_json`` writes them and ``codec.from_json`` reads and checks them. Each field's ``doc`` is
its row in docs/report-format.md, its ``job`` text the job report's meaning where the job's value
aggregates the nodes', its ``since`` the schema that added it (tools/report_docs.py renders the
tables; a test holds the file to them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc
from openclaw_launch.report.failure import AttemptFailure
from openclaw_launch.report.membership import AttemptMembership, Exclusion
from openclaw_launch.report.preflight import PreflightVerdict
from openclaw_launch.report.rank import RankEntry, RankOutcome
from openclaw_launch.stats import imbalance
from openclaw_launch.stats.result import Hang, MemoryAsymmetry, RunStatistics, StepImbalance, Straggler

SCHEMA_VERSION = 8
SCHEMA = f"openclaw-report/{SCHEMA_VERSION}"
# Every schema ``report`` reads -> its version; in an older one, a field whose ``since`` is later
# reads as absent (codec.doc).
READ_SCHEMAS = {f"openclaw-report/{version}": version for version in range(1, SCHEMA_VERSION + 1)}
JOB_SCOPE = "job"


@dataclass(frozen=True)
class AttemptEntry:
    attempt: int = field(metadata=doc("0-based"))
    root_cause: RankOutcome | None = field(
        metadata=doc(
            "as the top-level one; null when the attempt succeeded or was stopped by a signal",
            job="the failed rank of that attempt's fate, from its node",
        )
    )
    ranks: tuple[RankOutcome, ...] = field(
        metadata=doc(
            "the launcher's view of every rank (as in `ranks[]`, without the plan, statistics and GPU fields)",
            job="every node's ranks of that attempt, in rank order",
        )
    )
    failure: AttemptFailure | None = field(
        default=None,
        metadata=doc(
            "why the attempt stopped, classified (see `attempt_history[].failure`); null when it succeeded or "
            "a signal stopped it",
            job="the failure of that attempt's fate, from its node",
            since=5,
        ),
    )
    membership: AttemptMembership | None = field(
        default=None,
        metadata=doc(
            "an elastic job's (`--nnodes MIN:MAX`) world in that attempt (see `attempt_history[].membership`); "
            "null: a fixed-size job",
            job="null (each node's report has its own)",
            since=5,
        ),
    )


@dataclass(frozen=True)
class Report:
    """What a node's report and the job's have in common."""

    schema: str = field(metadata=doc(f"`{SCHEMA}`"))
    run_id: str | None = field(
        metadata=doc("the job id (`--run-id`, `$SLURM_JOB_ID`, else random; `none` for several nodes)")
    )
    node: str = field(metadata=doc("this launcher's node", job="the first node (which wrote it)"))
    world_size: int = field(metadata=doc("ranks in the whole job"))
    master_port: int | None = field(
        metadata=doc(
            "the workers' MASTER_PORT: the given one, else (and for port 0, `--standalone`) the free port a "
            "one-node launcher drew and held at start",
            since=4,
        )
    )
    exit_code: int = field(
        metadata=doc("the launcher's exit code (several nodes: the job's, the same on every node)", job="the job's")
    )
    attempts: int = field(
        metadata=doc(
            "attempts run (1 + restarts)",
            job="the most attempts any node ran (the same on every node: restarts are lockstep)",
        )
    )
    signal_received: str | None = field(
        metadata=doc(
            "a signal sent to the launcher (`SIGTERM`, ...)", job="the first node's in `nodes` order that received one"
        )
    )
    root_cause: RankOutcome | None = field(
        metadata=doc(
            "the first failed rank, as a `ranks` entry without the plan, statistics and GPU fields",
            job="the failed rank of the last attempt's fate, from its node's report",
        )
    )
    attempt_history: tuple[AttemptEntry, ...] = field(
        metadata=doc(
            "one per attempt, in order (see `attempt_history[]`)",
            job="the job's attempts, each with every node's ranks (see `attempt_history[]`)",
            since=3,
        )
    )
    log_errors: tuple[str, ...] = field(
        metadata=doc(
            "worker log files that could not be written (full disk, quota; at most 64): the job went on "
            "without them, the console kept showing the output",
            job="every node's, as `NODE: text`",
            since=3,
        )
    )
    console_dropped_lines: int = field(
        metadata=doc(
            "lines not shown on the console because its reader did not keep up (the per-rank logs of "
            "`--log-dir` have them)",
            job="the sum over the nodes",
            since=3,
            absent=0,
        )
    )
    guardian_lost: str | None = field(
        metadata=doc(
            "why the guardian (which cleans up after a SIGKILLed launcher) stopped working during the job, "
            "e.g. `guardian pid 123 killed by signal 9`",
            job="`NODE: why` for each node whose guardian stopped working, joined by `; `; null when none did",
            since=3,
        )
    )
    statistics: RunStatistics | None = field(
        metadata=doc(
            "null with `--telemetry off`; otherwise see `statistics`",
            job="judged over every rank of every node; null when no node had statistics",
            since=2,
        )
    )
    stragglers: tuple[Straggler, ...] = field(
        metadata=doc(
            "the verdict: empty when no rank holds the others back (see `stragglers[]`)",
            job="judged over every rank of every node: a straggler's `node` and `rank` name it",
            since=2,
        )
    )
    hang: Hang | None = field(
        metadata=doc(
            "`--hang-timeout-s` fired: the ranks, what they were doing, their stacks (see `hang`); null "
            "otherwise (also when the option is off)",
            job="the hang of the node that detected it (its `ranks[]` name their node); null when no node's fired",
            since=3,
        )
    )
    ranks: tuple[RankEntry, ...] = field(
        metadata=doc(
            "one per local rank of the last attempt (see `ranks[]`)",
            job="every node's ranks, in rank order; their `statistics` recomputed over all ranks",
        )
    )
    step_imbalance: StepImbalance | None = field(
        default=None,
        kw_only=True,
        metadata=doc(
            "per-step imbalance: how often each rank was the slowest and what the spread costs per step (see "
            "`step_imbalance`); its `variance` is the finding; null: telemetry off, one rank, or fewer than "
            f"{imbalance.MIN_STEPS} steps every rank sent",
            job=(
                "every node's ranks aligned by step number over each rank's last "
                f"{imbalance.RECENT_STEPS} steps; null: fewer than {imbalance.MIN_STEPS} such steps every rank sent"
            ),
            since=6,
        ),
    )
    memory_asymmetry: tuple[MemoryAsymmetry, ...] = field(
        default=(),
        kw_only=True,
        metadata=doc(
            "ranks whose peak GPU memory differs from their role's: the partitioning/sharding is uneven (see "
            "`memory_asymmetry[]`); empty: none, or no GPU memory sampled",
            job="every node's ranks compared by role (a pipeline stage's ranks across nodes too)",
            since=6,
        ),
    )
    exclusions: tuple[Exclusion, ...] = field(
        default=(),
        kw_only=True,
        metadata=doc(
            "the nodes an elastic job took out for good, in order (see `exclusions[]`): never re-admitted, and "
            "in `--exclude-file`; empty: none",
            job="every node's, each once",
            since=7,
        ),
    )


@dataclass(frozen=True)
class NodeReport(Report):
    """One launcher's report (``--report``)."""

    unkillable_pids: tuple[int, ...] = field(metadata=doc("processes still alive after SIGKILL and `--kill-timeout-s`"))
    containment: str = field(
        metadata=doc(
            "how the job's processes are kept from outliving it: `cgroup2:<dir>+process-groups+subreaper+"
            "guardian` when the workers ran in a per-job cgroup v2 (`<dir>`, e.g. `/sys/fs/cgroup/system.slice/"
            "x.scope/openclaw-<run_id>-<pid>`, created under the launcher's own cgroup, emptied with "
            "`cgroup.kill` after each attempt and by the guardian if the launcher is SIGKILLed, then removed), "
            "otherwise `process-groups+subreaper+guardian` (no cgroup2 hierarchy, not writable or not "
            "permitted, no `cgroup.kill` before Linux 5.14): a `setsid` grandchild then outlives a SIGKILLed "
            "launcher",
            since=3,
            absent="unrecorded",
        )
    )
    preflight: PreflightVerdict | None = field(
        metadata=doc(
            "`openclaw-launch preflight --report`: its verdict, as `preflight --json` prints it "
            "([`docs/preflight.md`](preflight.md), see `preflight`); null for `run`",
            since=3,
        )
    )


@dataclass(frozen=True)
class NodeSummary:
    node: str = field(metadata=doc("a node that reported"))
    exit_code: int = field(metadata=doc("its launcher's exit code"))
    attempts: int = field(metadata=doc("the attempts it ran"))
    signal_received: str | None = field(metadata=doc("a signal its launcher received"))


@dataclass(frozen=True)
class JobReport(Report):
    """The whole job's report, written by the first node (``--job-report``)."""

    scope: str = field(metadata=doc(f"`{JOB_SCOPE}` (absent in a node's report)"))
    nodes: tuple[NodeSummary, ...] = field(metadata=doc("per node that reported (see `nodes[]`)"))
    missing_nodes: tuple[str, ...] = field(metadata=doc("config nodes that sent no report (lost, or too late)"))
    unkillable_pids: tuple[str, ...] = field(metadata=doc("`NODE:PID` for every node's unkillable processes"))
    containment: dict[str, str] = field(metadata=doc("per node that reported: its `containment`", since=3))
    preflight: dict[str, PreflightVerdict] = field(
        metadata=doc("per node that ran one: its `preflight` verdict (empty for `run`)", since=3)
    )
