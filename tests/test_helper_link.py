"""The helpers' link speaks typed messages (run/helper.py): frozen dataclasses of one vocabulary,
each going one way, through the one codec. A message it does not know, a dict, or one sent the
wrong way is an error where it is sent or read, never one dropped; the launcher's end never blocks."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from guards import GUARD_S

from openclaw_launch.agents.elastic_link import ELASTIC_VOCABULARY
from openclaw_launch.agents.store_messages import VOCABULARY as AGENT_VOCABULARY
from openclaw_launch.codec import ReportShapeError, hints
from openclaw_launch.run import helper
from openclaw_launch.run.failure_class import GpuEvent
from openclaw_launch.run.helper import Link, LinkCodec, Message, Vocabulary
from openclaw_launch.stats.helper import VOCABULARY as STATS_VOCABULARY


@dataclass(frozen=True)
class Ask(Message):
    attempt: int
    events: tuple[GpuEvent, ...]


@dataclass(frozen=True)
class Answer(Message):
    text: str | None


@dataclass(frozen=True)
class Stray(Message):
    pass


TEST_VOCABULARY = Vocabulary(to_helper=(Ask,), to_launcher=(Answer,))


@pytest.fixture
def ends() -> Iterator[tuple[Link, Link, socket.socket]]:
    """(the launcher's end, a helper's end, the helper's raw socket: bytes the codec did not write)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    launcher = Link(ours, blocking=False, codec=LinkCodec(TEST_VOCABULARY.to_helper, TEST_VOCABULARY.to_launcher))
    helper_end = Link(theirs, blocking=True, codec=LinkCodec(TEST_VOCABULARY.to_launcher, TEST_VOCABULARY.to_helper))
    yield launcher, helper_end, theirs
    launcher.close()
    helper_end.close()


def test_messages_cross_typed_both_ways_with_nested_types(ends: tuple[Link, Link, socket.socket]) -> None:
    launcher, helper_end, _ = ends
    ask = Ask(3, (GpuEvent("xid", "GPU-1", 79), GpuEvent("ecc", "GPU-2")))
    assert launcher.send(ask)
    assert helper_end.wait(GUARD_S) == [ask]
    assert helper_end.send(Answer(None)) and helper_end.send(Answer("done"))
    assert launcher.wait(GUARD_S) == [Answer(None), Answer("done")]


def test_a_message_the_link_does_not_send_is_a_type_error_at_the_send(ends: tuple[Link, Link, socket.socket]) -> None:
    launcher, helper_end, _ = ends
    with pytest.raises(TypeError, match="Stray is no message this end of the link sends"):
        launcher.send(Stray())
    with pytest.raises(TypeError, match="Answer is no message this end"):  # the other way's message
        launcher.send(Answer("x"))
    with pytest.raises(TypeError, match="dict is no message"):
        launcher.send({"op": "ask", "attempt": 3})  # type: ignore[arg-type]
    assert helper_end.wait(0.1) == []  # nothing went out


def test_what_a_link_end_does_not_receive_is_an_error_not_a_drop(ends: tuple[Link, Link, socket.socket]) -> None:
    launcher, _, raw = ends
    raw.sendall(b'{"message":"Ask","fields":{"attempt":1,"events":[]}}\n')  # the launcher never receives Ask
    with pytest.raises(TypeError, match="'Ask' is no message this end of the link receives"):
        launcher.wait(GUARD_S)
    raw.sendall(b'{"message":"Answer","fields":{"text":7}}\n')
    with pytest.raises(ReportShapeError, match="text: expected string or null, found 7"):
        launcher.wait(GUARD_S)


def test_the_launchers_end_never_blocks_and_counts_what_it_drops(
    ends: tuple[Link, Link, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper that does not read: the launcher keeps a bounded buffer, then drops whole messages."""
    monkeypatch.setattr(helper, "PENDING_MAX_BYTES", 1 << 16)
    launcher, _, _ = ends
    big = Ask(0, tuple(GpuEvent("xid", f"GPU-{i}", i) for i in range(500)))  # ~20 KiB each
    sent = [launcher.send(big) for _ in range(100)]  # more than the socket's buffer and ours
    assert not all(sent) and launcher.dropped == sent.count(False) > 0


@pytest.mark.parametrize(
    "vocabulary", [STATS_VOCABULARY, AGENT_VOCABULARY, ELASTIC_VOCABULARY], ids=["stats", "agent", "elastic"]
)
def test_every_helpers_vocabulary_is_one_codec_can_read(vocabulary: Vocabulary) -> None:
    """Both ends can be built (frozen dataclasses, one name each) and every field's type resolves at
    run time, as the codec needs to read it back (a type only imported for the type checker would
    fail on the first message)."""
    LinkCodec(vocabulary.to_helper, vocabulary.to_launcher)
    LinkCodec(vocabulary.to_launcher, vocabulary.to_helper)
    for cls in (*vocabulary.to_helper, *vocabulary.to_launcher):
        hints(cls)
