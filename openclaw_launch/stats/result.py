"""What a job's statistics hand the report: the session's result (``StatsSession.finish``) and the
parts of it a report holds as they are: its ``statistics``, ``stragglers[]``, ``hang`` and each
rank's ``gpu``.

Frozen, and defined here since stats/ produces them and report/, above it, only reads them: one
definition for the session, the report and the statistics helper's link, all written and read by
the one codec (openclaw_launch/codec.py). Each field's ``doc`` is its row in docs/report-format.md
(tools/report_docs.py renders the tables).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc
from openclaw_launch.stats import imbalance
from openclaw_launch.stats.collect import RankSummary
from openclaw_launch.stats.imbalance import RankSteps
from openclaw_launch.stats.judged import PCT_OF_STEP, PctOf
from openclaw_launch.telemetry import wire

# A rank whose peak GPU memory differs from the median of its role (in a role of two: the other rank)
# by more than this share of it is named (stats/memory.py: the one definition; the report's docs print it).
MEMORY_ASYMMETRY_SHARE = 0.10


@dataclass(frozen=True)
class DroppedDatagrams:
    """A rank's statistics datagrams the launcher did not take (the channel is untrusted input)."""

    invalid: int = field(
        metadata=doc("failed the check: types, finite numbers, bounds, sizes, names, or another rank's number")
    )
    not_rank_process: int = field(
        metadata=doc(
            "sent by a process other than the one the launcher started for the rank (a forked child), or without "
            "the run's token (`OPENCLAW_TELEMETRY_TOKEN`: credentials forged with CAP_SYS_ADMIN)"
        )
    )
    over_rate: int = field(metadata=doc("above the rank's rate limit (stats/inbox.py: `RATE_PER_S`, `BURST`)"))

    @property
    def total(self) -> int:
        return self.invalid + self.not_rank_process + self.over_rate


@dataclass(frozen=True)
class RunStatistics:
    """The statistics of the run as a whole: the threshold, the wait signal, what went missing."""

    threshold_pct: float | None = field(metadata=doc("`--straggler-threshold-pct`"))
    wait_source: str = field(
        metadata=doc(
            "`nccl-flight-recorder`: waiting measured as NCCL collective time from torch's flight recorder; "
            "`cpu-phases`: as time in `sync` sections, blocking `torch.distributed` calls and DDP's "
            "`backward` on a group whose backend blocks the host (gloo), the host's waits on the GPU "
            "(`device-wait`) under NCCL; `none`",
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
            since=5,
        )
    )
    bad_datagrams: int = field(metadata=doc("statistics datagrams dropped: the sum of `dropped_datagrams` (not fatal)"))
    dropped_datagrams: dict[str, DroppedDatagrams] = field(
        metadata=doc("per rank (the key) with any dropped: why (see `statistics.dropped_datagrams`)", since=5)
    )
    waits_by_group: dict[str, float] = field(
        default_factory=dict,
        metadata=doc(
            "per process group (the key: `dp`, `tp`, `pp` where the plan laid the group out, a DeviceMesh "
            "dimension's name, `world`, or `ranks 0,2,...`), the median rank's share of its step spent waiting "
            "in the group's collective and point-to-point calls on the host (gloo; under NCCL the host does "
            "not wait in them: empty)",
            since=7,
        ),
    )


@dataclass(frozen=True)
class Straggler:
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
    excess_pct: float = field(
        metadata=doc("`excess_s` as % of `pct_of_s`: the job's median step, or a pipeline stage's own work (`pct_of`)")
    )
    busy_s: float = field(metadata=doc("per step, the straggler's time not spent waiting for other ranks"))
    peers_busy_s: float = field(metadata=doc("the median of the other ranks' `busy_s`"))
    peers_wait_s: float = field(metadata=doc("per step, how much longer the other ranks waited than the straggler"))
    wait_source: str = field(metadata=doc("as in `statistics`"))
    hints: tuple[str, ...] = field(
        metadata=doc(
            "evidence for why: input-wait share, binding in force differing from the plan, lower SM clock "
            "than the other GPUs, clock-event (throttle) reasons, GPU memory differing by more than "
            f"{100 * MEMORY_ASYMMETRY_SHARE:g} % (as `memory_asymmetry[]`)"
        )
    )
    pct_of: PctOf = field(
        default=PCT_OF_STEP,
        metadata=doc(
            "what `excess_pct` is a share of, and what the threshold is judged against: `step` (the job's median "
            "step), or `own work` when every rank is a pipeline stage (its waits are point-to-point calls): the "
            "straggler's own work per step, its step less those waits (the bubble among them), the median over "
            "5-step windows: stages are compared by their own work",
            since=8,
            absent=PCT_OF_STEP,
        ),
    )
    pct_of_s: float | None = field(default=None, metadata=doc("that time per step", since=8))


@dataclass(frozen=True)
class StepImbalance:
    """Per-step imbalance (stats/imbalance.py): the ranks' steps aligned by number; at each, the
    slowest rank's work (its step outside the phases that wait for peers) against the others' median."""

    variance: bool = field(
        metadata=doc(
            f"true: a finding, per-batch cost variance: the spread costs at least {imbalance.MIN_COST_PCT:g} % of "
            "the step (its mean and its median over steps) and no rank is the slowest in more than halfway between "
            f"chance and always (two ranks: {100 * imbalance.fixed_rank_share(2):g} %, eight: "
            f"{100 * imbalance.fixed_rank_share(8):.0f} %), so the cost moves between ranks from step to step; "
            "false: measured only (a rank that is always the slowest is a straggler, in `stragglers[]`)"
        )
    )
    steps: int = field(
        metadata=doc("steps judged: every rank's, after the warm-up, until a rank lost a statistics batch")
    )
    slowest_share: dict[str, float] = field(
        metadata=doc("per rank (the key): the share of the judged steps in which it was the slowest")
    )
    cost_s: float = field(
        metadata=doc(
            "what the spread costs per step: the mean over steps of the slowest rank's work minus the median "
            "of the other ranks' (how long they wait for it at that step)"
        )
    )
    cost_pct: float = field(metadata=doc("`cost_s` as % of `step_s`"))
    median_cost_s: float = field(metadata=doc("the median over steps of the same difference"))
    step_s: float = field(metadata=doc("the mean step (each step: the median rank's step time)"))
    work_s: float = field(metadata=doc("the mean over steps of the other ranks' median work"))
    excess_s: dict[str, float] = field(
        metadata=doc(
            "per rank (the key): the mean over steps of its work minus the other ranks' median: a fixed "
            "straggler's offset holds at every step, per-batch variance averages out (a rank the window "
            "verdict would name under `variance` without a significant offset here is not a straggler)"
        )
    )
    work_source: str = field(
        metadata=doc(
            "`cpu`: a step's work is its time outside the `sync_sections`, every step; `gpu`: its GPU work "
            "timed with CUDA events on every 5th step (GPU ranks; the CPU does not see the kernels), taken "
            "when its spread costs more; `steps` then counts sampled steps"
        )
    )
    hints: tuple[str, ...] = field(metadata=doc("what to do about it (with `variance` only): balance batches by cost"))

    @classmethod
    def of(cls, found: imbalance.Judged) -> StepImbalance:
        """The report's entry: times to the microsecond, shares to 0.01 %, the hint with the finding."""
        return cls(
            variance=found.variance,
            steps=found.steps,
            slowest_share={str(rank): round(share, 4) for rank, share in found.slowest_share.items()},
            cost_s=round(found.cost_s, 6),
            cost_pct=round(found.cost_pct, 1),
            median_cost_s=round(found.median_cost_s, 6),
            step_s=round(found.step_s, 6),
            work_s=round(found.work_s, 6),
            excess_s={str(rank): round(e, 6) for rank, e in found.excess_s.items()},
            work_source=found.work_source,
            hints=(imbalance.BALANCE_HINT,) if found.variance else (),
        )


@dataclass(frozen=True)
class MemoryAsymmetry:
    """A rank whose peak GPU memory differs from the median of its role by more than
    ``MEMORY_ASYMMETRY_SHARE`` of it (stats/memory.py)."""

    rank: int = field(metadata=doc("the rank"))
    node: str = field(metadata=doc("its node"))
    role: str = field(
        metadata=doc(
            "the ranks it is compared with: `all` (no pipeline stages), or `pp=N` (the pipeline stage in the "
            "plan's `parallel` layout: stages hold different layers by design)"
        )
    )
    memory_gib: float = field(metadata=doc("its peak GPU memory (NVML's most used; a GPU of n ranks counts 1/n each)"))
    peers_gib: float = field(metadata=doc("the median of its role's ranks (in a role of two: the other rank)"))
    excess_gib: float = field(
        metadata=doc(
            f"`memory_gib` minus `peers_gib`, beyond {100 * MEMORY_ASYMMETRY_SHARE:g} % of `peers_gib`: negative "
            "when it holds less (named only in a role of three or more; of two, the one that holds more)"
        )
    )
    text: str = field(metadata=doc("the console's line"))


@dataclass(frozen=True)
class HangRank:
    """One rank at the moment of the verdict."""

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
        metadata=doc("steps it made (one per `optimizer.step()` or `telemetry.step()`), as in `ranks[].statistics`")
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

    def describe(self) -> str:
        """The rank on the console's hang lines."""
        what = self.phase
        if self.phase == wire.COLLECTIVE and self.collective:
            what = f"collective {self.collective}"
        text = f"rank {self.rank} (local rank {self.local_rank}, node {self.node}"
        text += f", pid {self.pid})" if self.pid else ")"
        if self.in_phase_s is not None:
            text += f" in {what} for {self.in_phase_s:.1f} s"
        else:
            text += f" in {what}"
        if self.no_step_s is None:
            text += ", no step yet"
        else:
            text += f", last step {self.no_step_s:.1f} s ago (step {self.steps})"
        if self.collective and self.phase != wire.COLLECTIVE:
            text += f", last collective {self.collective}"
        return text


@dataclass(frozen=True)
class HangCause:
    """Whom the others wait for, and how that is known."""

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
    """A hang: judged by the watch (stats/hang.py), its stacks added by the monitor (hang_monitor.py)."""

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
        default=None, metadata=doc("the start-up allowance in force (`--startup-timeout-s`); null: none", since=5)
    )
    startup: bool = field(
        default=False, metadata=doc("true: judged by the start-up allowance (no first step)", since=5, absent=False)
    )
    cause: HangCause | None = field(
        default=None, metadata=doc("whom the others wait for, and how that is known (see `hang.cause`)", since=5)
    )

    @property
    def stuck(self) -> tuple[HangRank, ...]:
        return tuple(r for r in self.ranks if r.stuck)


@dataclass(frozen=True)
class GpuStats:
    """NVML sampled once a second over the run; a metric the GPU does not give is null."""

    samples: int = field(metadata=doc("samples taken"))
    util_pct_mean: float | None = field(metadata=doc("mean GPU utilisation, %", since=3))
    sm_clock_mhz_mean: float | None = field(metadata=doc("mean SM clock", since=3))
    sm_clock_mhz_min: float | None = field(metadata=doc("lowest SM clock seen", since=3))
    power_w_mean: float | None = field(metadata=doc("mean power draw", since=3))
    temp_c_max: float | None = field(metadata=doc("highest temperature", since=3))
    memory_used_mib_max: float | None = field(metadata=doc("most GPU memory in use", since=3))
    clock_event_reasons: tuple[str, ...] = field(
        metadata=doc(
            "names of the throttle reasons seen: `sw_power_cap`, `hw_slowdown`, `sw_thermal_slowdown`, "
            "`hw_thermal_slowdown`, `hw_power_brake_slowdown`"
        )
    )
    pcie_rx_mbps_mean: float | None = field(
        metadata=doc("mean PCIe receive throughput (read every 30th sample: the call blocks about 20 ms)", since=3)
    )
    pcie_tx_mbps_mean: float | None = field(
        metadata=doc("mean PCIe transmit throughput (as `pcie_rx_mbps_mean`)", since=3)
    )
    sm_activity_pct_mean: float | None = field(
        metadata=doc("mean SM activity (GPUs with GPM: Hopper and newer)", since=3)
    )
    tensor_activity_pct_mean: float | None = field(metadata=doc("mean tensor core activity, with GPM", since=3))


@dataclass(frozen=True)
class SessionResult:
    """One job's statistics at its end: what the node's report holds of them, and the ranks'
    summaries, which the job report judges again over every node's ranks (agents/merge.py)."""

    statistics: RunStatistics
    stragglers: tuple[Straggler, ...]  # the verdict over this node's ranks, as found (the report rounds)
    hang: Hang | None  # --hang-timeout-s fired
    summaries: tuple[RankSummary, ...]  # per rank, of the last attempt
    gpus: dict[str, GpuStats]  # per sampled GPU, by UUID
    imbalance: StepImbalance | None = None  # per-step imbalance, once enough steps aligned (stats/imbalance.py)
    recent_steps: tuple[RankSteps, ...] = ()  # each rank's last steps, for the job's alignment
