"""The run report's types: a node's report, the job's (several nodes), and what they hold.

Frozen and built once from final data (report/build.py for a node, agents/merge.py for the job);
``codec.to_json`` writes them and ``codec.from_json`` reads and checks them. Each field's ``doc`` is
its row in docs/report-format.md, its ``job`` text the job report's meaning where the job's value
aggregates the nodes' (report/docs.py renders the tables; a test holds the file to them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc
from openclaw_launch.report.failure import AttemptFailure
from openclaw_launch.report.membership import AttemptMembership
from openclaw_launch.report.preflight import PreflightVerdict
from openclaw_launch.report.rank import RankEntry, RankOutcome

SCHEMA = "openclaw-report/5"
# Schemas ``report`` still reads: a key added since takes its legacy value (codec.doc).
LEGACY_SCHEMAS = ("openclaw-report/1", "openclaw-report/2", "openclaw-report/3", "openclaw-report/4")
JOB_SCOPE = "job"


@dataclass(frozen=True)
class DroppedDatagrams:
    """A rank's statistics datagrams the launcher did not take (the channel is untrusted input)."""

    invalid: int = field(
        metadata=doc("failed the check: types, finite numbers, bounds, sizes, names, or another rank's number")
    )
    not_rank_process: int = field(
        metadata=doc("sent by a process other than the one the launcher started for the rank (a forked child)")
    )
    over_rate: int = field(metadata=doc("above the rank's rate limit (stats/inbox.py: `RATE_PER_S`, `BURST`)"))


@dataclass(frozen=True)
class RunStatistics:
    threshold_pct: float | None = field(metadata=doc("`--straggler-threshold-pct`"))
    wait_source: str = field(
        metadata=doc(
            "`nccl-flight-recorder`: waiting measured as NCCL collective time from torch's flight recorder; "
            "`cpu-phases`: as time in `sync` sections, blocking `torch.distributed` calls and DDP's "
            "`backward` on a group whose backend blocks the host (gloo), the host's waits on the GPU "
            "(`device-wait`) under NCCL; `none`",
            legacy="none",
        )
    )
    sync_bound_share: float | None = field(
        metadata=doc(
            "set when every rank waits at least 30 % of its step: the collectives themselves are slow, not one rank"
        )
    )
    gpu_error: str | None = field(metadata=doc("why GPU sampling stopped or never started"))
    stats_file_error: str | None = field(
        metadata=doc(
            "the first error writing `--stats-file` (a full disk; the console said it once, the job went on, "
            "later lines may be lost); null: none",
            legacy=None,
        )
    )
    bad_datagrams: int = field(
        metadata=doc("statistics datagrams dropped: the sum of `dropped_datagrams` (not fatal)", legacy=0)
    )
    dropped_datagrams: dict[str, DroppedDatagrams] = field(
        metadata=doc("per rank (the key) with any dropped: why (see `statistics.dropped_datagrams`)")
    )


@dataclass(frozen=True)
class StragglerEntry:
    """A rank that holds the others back."""

    rank: int = field(metadata=doc("the straggler"))
    node: str = field(metadata=doc("its node"))
    phase: str = field(
        metadata=doc(
            "`input` (the input/host stage: the DataLoader and the time before the step's first forward) or `compute`"
        )
    )
    section: str = field(
        metadata=doc(
            'the measured phase carrying the excess: `input` (the DataLoader, `section("data")`), `host` (from '
            "the step boundary to the first forward: batches sliced in the loop, copies, logging), `forward`, "
            "`backward`, `optimizer`, a section name of the API, `other` (loop code outside every hooked phase) "
            "or `gpu` (its GPU work: timed with CUDA events on every 5th step, or with the flight recorder "
            "the wait signal says it is late and its input stage does not)"
        )
    )
    excess_s: float = field(
        metadata=doc(
            "per step, the straggler's time in `section` (for `input`/`host`: in the whole input/host stage) "
            "over the median of the other ranks, as the median over 5-step windows (for `gpu`: its GPU work "
            "per sampled step over the others', or with the flight recorder and no GPU samples how much longer "
            "the others wait in NCCL than it does)"
        )
    )
    excess_pct: float = field(metadata=doc("`excess_s` as % of the job's median step"))
    busy_s: float = field(metadata=doc("per step, the straggler's time not spent waiting for other ranks"))
    peers_busy_s: float = field(metadata=doc("the median of the other ranks' `busy_s`"))
    peers_wait_s: float = field(metadata=doc("per step, how much longer the other ranks waited than the straggler"))
    wait_source: str = field(metadata=doc("as in `statistics`"))
    hints: tuple[str, ...] = field(
        metadata=doc(
            "evidence for why: input-wait share, binding in force differing from the plan, lower SM clock "
            "than the other GPUs, clock-event (throttle) reasons, GPU memory differing by more than 10 %"
        )
    )


@dataclass(frozen=True)
class HangRank:
    rank: int = field(metadata=doc("a rank without a step for the timeout"))
    local_rank: int = field(metadata=doc("its local rank"))
    node: str = field(metadata=doc("its node"))
    pid: int | None = field(
        metadata=doc("the worker process the launcher spawned for the rank (never a pid a datagram names)")
    )
    stuck: bool = field(
        metadata=doc(
            "true: the others wait for it (it is not in a collective or `sync` section, or every silent rank "
            "is); false: it waits for a peer"
        )
    )
    steps: int = field(
        metadata=doc("steps it made (a step ends at each boundary after the first), as in `ranks[].statistics`")
    )
    no_step_s: float | None = field(metadata=doc("seconds since its last step at the verdict; null: it never stepped"))
    phase: str = field(
        metadata=doc(
            "what it was doing: `input`, `forward`, `backward`, `optimizer`, `collective`, a section name, or "
            "`other` outside every phase"
        )
    )
    in_phase_s: float | None = field(metadata=doc("for how long"))
    collective: str | None = field(
        metadata=doc("the last blocking collective it called from Python, e.g. `all_reduce`, when known")
    )
    stack: tuple[str, ...] = field(
        metadata=doc(
            "the first 40 lines of its stack dump, the main thread first (the whole dump is in the rank's "
            "`stderr.log` under `--log-dir`)"
        )
    )


@dataclass(frozen=True)
class HangCause:
    kind: str = field(
        metadata=doc(
            "`not-entered`: with torch's flight recorder, `ranks` never entered collective `seq` that `waiting` "
            "wait in; `outside`: `ranks` in their own code (`phase`) while `waiting` wait in a collective; "
            "`gpu-behind`: every host waits, but the GPU of `ranks` never passed a mark of the step (`phase`: "
            "the GPU work before it) that the GPUs of `waiting` passed (a kernel that does not end); "
            "`all-waiting`: every silent rank waits (mismatched collectives, a peer lost on another node); "
            "`no-first-step`: the start-up allowance ran out before `ranks` made a first step"
        )
    )
    ranks: tuple[int, ...] = field(metadata=doc("the ranks the others wait for (the `stuck` ones)"))
    waiting: tuple[int, ...] = field(metadata=doc("the ranks that wait for them"))
    collective: str | None = field(metadata=doc("what the waiting ranks wait in, e.g. `all_reduce`"))
    seq: int | None = field(metadata=doc("the flight recorder's `collective_seq_id` of it (`not-entered`)"))
    phase: str | None = field(
        metadata=doc(
            "what `ranks` were doing: a phase name, `other` outside every phase, or their GPU's work (`gpu-behind`)"
        )
    )
    text: str = field(metadata=doc("the console's `cause:` line"))


@dataclass(frozen=True)
class Hang:
    timeout_s: float = field(metadata=doc("the timeout in force"))
    exit_code: int = field(metadata=doc("124, the launcher's exit code for a hang"))
    all_silent: bool = field(
        metadata=doc("true: no rank of this node made a step for the timeout; false: other ranks kept stepping")
    )
    stack_source: str | None = field(
        metadata=doc(
            "`py-spy` (installed on the launcher's PATH), `faulthandler` (the bootstrap's handler, triggered "
            "by SIGRTMIN+7), or null: no stack could be taken"
        )
    )
    ranks: tuple[HangRank, ...] = field(
        metadata=doc(
            "every rank without a step for the timeout (at start-up: without a first step), stuck ones first "
            "(see `hang.ranks[]`)"
        )
    )
    startup_timeout_s: float | None = field(
        default=None, metadata=doc("the start-up allowance in force (`--startup-timeout-s`); null: none")
    )
    startup: bool = field(
        default=False, metadata=doc("true: judged by the start-up allowance (no first step)", legacy=False)
    )
    cause: HangCause | None = field(
        default=None, metadata=doc("whom the others wait for, and how that is known (see `hang.cause`)")
    )


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
            legacy=None,
        ),
    )
    membership: AttemptMembership | None = field(
        default=None,
        metadata=doc(
            "an elastic job's (`--nnodes MIN:MAX`) world in that attempt (see `attempt_history[].membership`); "
            "null: a fixed-size job",
            job="null (each node's report has its own)",
            legacy=None,
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
            "one-node launcher drew and held at start; null in reports before schema 4"
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
        )
    )
    log_errors: tuple[str, ...] = field(
        metadata=doc(
            "worker log files that could not be written (full disk, quota; at most 64): the job went on "
            "without them, the console kept showing the output",
            job="every node's, as `NODE: text`",
        )
    )
    console_dropped_lines: int = field(
        metadata=doc(
            "lines not shown on the console because its reader did not keep up (the per-rank logs of "
            "`--log-dir` have them)",
            job="the sum over the nodes",
            legacy=0,
        )
    )
    guardian_lost: str | None = field(
        metadata=doc(
            "why the guardian (which cleans up after a SIGKILLed launcher) stopped working during the job, "
            "e.g. `guardian pid 123 killed by signal 9`",
            job="`NODE: why` for each node whose guardian stopped working, joined by `; `; null when none did",
        )
    )
    statistics: RunStatistics | None = field(
        metadata=doc(
            "null with `--telemetry off`; otherwise see `statistics`",
            job="judged over every rank of every node; null when no node had statistics",
        )
    )
    stragglers: tuple[StragglerEntry, ...] = field(
        metadata=doc(
            "the verdict: empty when no rank holds the others back (see `stragglers[]`)",
            job="judged over every rank of every node: a straggler's `node` and `rank` name it",
        )
    )
    hang: Hang | None = field(
        metadata=doc(
            "`--hang-timeout-s` fired: the ranks, what they were doing, their stacks (see `hang`); null "
            "otherwise (also when the option is off)",
            job="the hang of the node that detected it (its `ranks[]` name their node); null when no node's fired",
        )
    )
    ranks: tuple[RankEntry, ...] = field(
        metadata=doc(
            "one per local rank of the last attempt (see `ranks[]`)",
            job="every node's ranks, in rank order; their `statistics` recomputed over all ranks",
        )
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
            legacy="unrecorded",
        )
    )
    preflight: PreflightVerdict | None = field(
        metadata=doc(
            "`openclaw-launch preflight --report`: its verdict, as `preflight --json` prints it "
            "([`docs/preflight.md`](preflight.md), see `preflight`); null for `run`"
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
    containment: dict[str, str] = field(metadata=doc("per node that reported: its `containment`"))
    preflight: dict[str, PreflightVerdict] = field(
        metadata=doc("per node that ran one: its `preflight` verdict (empty for `run`)")
    )
