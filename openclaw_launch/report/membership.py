"""The report's record of an elastic job's world in one attempt (agents/elastic_agent.py), and of
each node the job left out (agents/exclude_file.py writes the same into the exclude file)."""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc

#: The reason kinds of an exclusion besides a failure class (run/failure_class.py's node classes:
#: ``gpu-xid``, ``gpu-ecc``, ``node-lost``, ``host-oom``): the job-wide straggler verdict, and a GPU
#: whose used memory did not fall back to its level before the job after a failed attempt.
STRAGGLER = "straggler"
GPU_MEMORY_HELD = "gpu-memory-held"


@dataclass(frozen=True)
class Exclusion:
    """A node taken out of an elastic job for good: never re-admitted, and in the exclude file."""

    node: str = field(metadata=doc("the config's node name; with no config, the host name"))
    host: str = field(metadata=doc("the name in the exclude file (`--exclude-file`): the node name, else the host"))
    reason: str = field(
        metadata=doc(
            f"`{STRAGGLER}` (the job-wide straggler verdict), `{GPU_MEMORY_HELD}` (its GPUs' used memory did not "
            "fall back to the level before the job), or the node's failure class (`gpu-xid`, `gpu-ecc`, "
            "`node-lost`, `host-oom`; [`docs/failures.md`](failures.md#classes))"
        )
    )
    evidence: str = field(metadata=doc("what named it, e.g. `NVML: XID 79 on GPU-...`, `GPU-...: 1200 MiB held`"))
    world: int = field(metadata=doc("the world (the job's attempt) after which it was taken out"))
    time_s: float = field(metadata=doc("when (Unix time)"))
    step_time_before_s: float | None = field(
        default=None, metadata=doc("the job's step time before it was taken out; null: not measured")
    )
    step_time_after_s: float | None = field(
        default=None, metadata=doc("the job's step time in the world after; null: not measured")
    )

    @property
    def line(self) -> str:
        """The console's and the report's words for it."""
        who = self.node if self.node == self.host else f"{self.node} (host {self.host})"
        text = f"node {who} excluded after world {self.world}: {self.reason} ({self.evidence})"
        if self.step_time_before_s is not None and self.step_time_after_s is not None:
            text += f"; step {1000 * self.step_time_before_s:.1f} -> {1000 * self.step_time_after_s:.1f} ms"
        return text


@dataclass(frozen=True)
class AttemptMembership:
    world: int = field(metadata=doc("the world's number: the job's attempt (`TORCHELASTIC_RESTART_COUNT`)"))
    nodes: tuple[str, ...] = field(metadata=doc("each node's launcher (`host pid N`), by node rank"))
    node_rank: int = field(metadata=doc("this node's rank in that world (`GROUP_RANK`)"))
    world_size: int = field(metadata=doc("ranks in that world (`WORLD_SIZE`)"))
    excluded: tuple[Exclusion, ...] = field(
        default=(),
        metadata=doc(
            "the nodes taken out for good at the re-forming before this world (see `exclusions[]`); empty: none",
            since=7,
        ),
    )
