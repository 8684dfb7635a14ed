"""Nodes taken out of an elastic job for good (docs/elastic.md, "Nodes taken out for good").

The rendezvous's side (the first node's agent helper, agents/elastic.py): at a re-forming, every
member of the ending world first says whether it leaves (``ready/<world>/<member id>``: its own
verdict, a failure of a node class, run/failure_class.NODE_CLASSES, or GPU memory it did not free,
run/gpu_memory.py); the first node waits for each, takes out those, the lost nodes and the ones its
launcher named (``Leave``: the straggler policy), and refuses each of them at admission for the rest
of the job. A node is its config node's name, else its launcher's host.

The launcher's side (``ExclusionLog``): each exclusion published with a world is said on the console
(one line), counted, kept for the report, and the first node adds it to ``--exclude-file``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from openclaw_launch.agents.exclude_file import ExcludeFileError, append_exclusion
from openclaw_launch.agents.membership import Member
from openclaw_launch.agents.store import AgentStore
from openclaw_launch.report.membership import Exclusion

_POLL_S = 0.05
_NOTE_S = 5.0  # while the first node waits for a member's word, a line this often


@dataclass(frozen=True)
class Fault:
    """Why a node leaves the job: a reason kind (report/membership.py) and what named it."""

    reason: str
    evidence: str


@dataclass(frozen=True)
class Leave:
    """A node the first node's launcher takes out at the next re-forming, by its node rank in the
    ending world (the straggler policy)."""

    node_rank: int
    reason: str
    evidence: str
    step_time_before_s: float | None = None


def ready_key(world: int, member_id: int) -> str:
    """Where a member of world ``world`` asks for the next one, with its own fault (or none)."""
    return f"ready/{world}/{member_id}"


def say_ready(store: AgentStore, world: int, member_id: int, fault: Fault | None) -> None:
    """A member's word at the end of ``world``: its fault, or null."""
    store.set(ready_key(world, member_id), json.dumps(fault.__dict__ if fault is not None else None))


def host_of(token: str) -> str:
    """A launcher's host, from its token (``host pid N #random``)."""
    return token.split(" ")[0]


def name_of(member: Member) -> str:
    """A node's name in the exclude file: its config node, else its launcher's host."""
    return member.node or host_of(member.token)


def members_faults(
    store: AgentStore,
    world: int,
    members: Collection[int],
    gone: Callable[[int], bool],
    timeout_s: float,
    say: Callable[[str], None],
) -> dict[int, Fault]:
    """(The first node.) Each member's word at the end of ``world``; a member that is gone (its link
    closed) is not waited for; one silent for ``timeout_s`` (``--agent-timeout-s``) counts as
    without a fault. One look a poll at every word still awaited (one store request, whatever the
    number of members), and one read of all once they are there."""
    waiting = set(members)
    faults: dict[int, Fault] = {}
    start = noted = time.monotonic()
    while waiting:
        if store.has([ready_key(world, m) for m in waiting]):
            _read_words(store, world, sorted(waiting), faults)
            break
        for member_id in sorted(m for m in waiting if gone(m)):  # its word if it said one
            waiting.discard(member_id)
            if store.has([ready_key(world, member_id)]):
                _read_words(store, world, [member_id], faults)
        now = time.monotonic()
        if waiting and now - start > timeout_s:
            said = [m for m in sorted(waiting) if store.has([ready_key(world, m)])]
            _read_words(store, world, said, faults)
            waiting -= set(said)
            if waiting:
                silent = sorted(waiting)
                say(f"no word from member(s) {silent} in {timeout_s:g} s (--agent-timeout-s): re-forming without")
            break
        if waiting and now - noted >= _NOTE_S:
            noted = now
            say(f"waiting for member(s) {sorted(waiting)} to finish their checks (GPU memory freed)")
        if waiting:
            time.sleep(_POLL_S)
    return faults


def _read_words(store: AgentStore, world: int, member_ids: list[int], faults: dict[int, Fault]) -> None:
    """The words of ``member_ids`` (each one set) in one read; their faults into ``faults``."""
    if not member_ids:
        return
    for member_id, text in zip(member_ids, store.get_many([ready_key(world, m) for m in member_ids]), strict=True):
        said = json.loads(text)
        if said is not None:
            faults[member_id] = Fault(**said)


class Exclusions:
    """(The first node.) The nodes taken out of this job, by name: never admitted again."""

    def __init__(self) -> None:
        self.by_name: dict[str, Exclusion] = {}

    def take_out(self, member: Member, fault: Fault, world: int, step_time_before_s: float | None = None) -> Exclusion:
        name = name_of(member)
        x = Exclusion(name, name, fault.reason, fault.evidence, world, time.time(), step_time_before_s)
        self.by_name.setdefault(name, x)
        return x

    def of(self, node: str, token: str) -> Exclusion | None:
        """An arriving launcher's node (its config ``node``, else its host), if it was taken out."""
        return self.by_name.get(node or host_of(token))


def refused_text(x: Exclusion) -> str:
    """What a launcher of a node taken out is told at admission (it exits 2)."""
    return (
        f"node {x.node} was taken out of this job after world {x.world} ({x.reason}: {x.evidence}): it is not "
        "admitted again; the running job is untouched, started nothing (docs/elastic.md)"
    )


class ExclusionLog:
    """(Every node's launcher.) The exclusions this node heard of, in order: said, counted, kept for
    the report; the first node adds each to the exclude file (``path``)."""

    def __init__(self, path: str | None, say: Callable[[str], None], count: Callable[[str], None] | None = None):
        self.path, self.say, self.count = path, say, count
        self.exclusions: list[Exclusion] = []

    def record(self, found: tuple[Exclusion, ...], first_node: bool) -> None:
        for x in found:
            if x in self.exclusions:
                continue
            self.exclusions.append(x)
            self.say(f"openclaw-launch: {x.line}: not admitted again in this job")
            if self.count is not None:
                self.count(x.reason)
            if first_node and self.path:
                try:
                    line = append_exclusion(self.path, x)
                except (OSError, ExcludeFileError) as e:
                    self.say(f"openclaw-launch: error: --exclude-file {self.path}: cannot add {x.host} ({e})")
                else:
                    self.say(f"openclaw-launch: --exclude-file {self.path}: {line}")

    def excluded_before(self, world: int) -> tuple[Exclusion, ...]:
        """The nodes taken out at the re-forming before ``world``."""
        return tuple(x for x in self.exclusions if x.world + 1 == world)


def exclusions_of(data: Mapping[str, Any]) -> tuple[Exclusion, ...]:
    """The exclusions a world's record (``w/<n>``) publishes."""
    from openclaw_launch.codec import from_json

    return tuple(from_json(Exclusion, x) for x in data.get("excluded", ()))
