"""The replica groups' report (``--replica-groups K --report PATH``): per group its exit code,
attempts, steps and how long each restart took to step again, with the path of the group's own
node report (``PATH`` with ``-gG`` before the extension). Its own schema: the node report's
(report/model.py) is unchanged, each group writes one. Frozen, written with the one codec."""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc

SCHEMA = "openclaw-replica-groups/2"  # /2: lighthouse_kind


@dataclass(frozen=True)
class GroupProgress:
    """What a group's launcher saw of its own attempts (job/group_progress.py), handed to the
    launcher that runs the groups when the group ends."""

    steps: tuple[int, ...] = field(
        metadata=doc("per attempt: the steps its ranks made (the most of any rank; 0 with --telemetry off)")
    )
    rejoin_s: tuple[float, ...] = field(
        metadata=doc(
            "per restart that stepped again: seconds from the failure (the failed rank's exit seen) to the "
            "restarted group's first step"
        )
    )


@dataclass(frozen=True)
class GroupEntry:
    group: int = field(metadata=doc("REPLICA_GROUP_ID"))
    run_id: str = field(metadata=doc("the group's run id (`RUNID-gG`: its logs, its report)"))
    exit_code: int = field(metadata=doc("the group launcher's exit code"))
    attempts: int = field(metadata=doc("attempts it ran (1 + its restarts)"))
    steps: int = field(metadata=doc("steps over every attempt (`progress.steps` summed)"))
    progress: GroupProgress | None = field(
        metadata=doc("per attempt and restart; null: its launcher wrote none (it did not start its workers, or died)")
    )
    report: str | None = field(metadata=doc("the group's own node report (`--report` with `-gG`); null: none"))


@dataclass(frozen=True)
class ReplicaGroupsReport:
    schema: str = field(metadata=doc(f"`{SCHEMA}`"))
    run_id: str = field(metadata=doc("the job's run id"))
    exit_code: int = field(metadata=doc("the launcher's: 0, 128+N after a signal, else the first failed group's"))
    signal_received: str | None = field(metadata=doc("a stopping signal the launcher received"))
    lighthouse: str = field(metadata=doc("TORCHFT_LIGHTHOUSE of every rank"))
    lighthouse_kind: str = field(
        metadata=doc("whose lighthouse ran: `openclaw` or `torchft` (`--lighthouse`, config/defaults.py's LIGHTHOUSES)")
    )
    lighthouse_failed: str | None = field(
        metadata=doc("how the lighthouse ended while groups ran (they were stopped); null: it was stopped at the end")
    )
    groups: tuple[GroupEntry, ...] = field(metadata=doc("one per replica group, in order"))


def group_report_path(report_path: str, group: int) -> str:
    """Where group G's node report goes: ``report.json`` -> ``report-g0.json``."""
    base, dot, ext = report_path.rpartition(".")
    return f"{base}-g{group}.{ext}" if dot and "/" not in ext else f"{report_path}-g{group}"


def summary_line(entry: GroupEntry) -> str:
    """One line of the exit summary: how the group ended, its restarts, steps and times to step again."""
    restarts = entry.attempts - 1
    text = f"replica group {entry.group}: exit {entry.exit_code}, {entry.attempts} attempt(s)"
    text += f" ({restarts} restart(s))" if restarts else ""
    if entry.progress is None:
        return text + ", no account from its launcher (it did not start its workers, or died)"
    if not entry.steps:  # the statistics count optimizer steps (or telemetry.step())
        return text + ", no step seen (--telemetry off, or no optimizer step)"
    text += f", {entry.steps} step(s)"
    if entry.progress.rejoin_s:
        text += ", stepping again " + ", ".join(f"{s:.1f} s" for s in entry.progress.rejoin_s) + " after a failure"
    elif restarts:
        text += ", no step after its restart"
    return text
