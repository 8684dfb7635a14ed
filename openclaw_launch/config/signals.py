"""Signal lists (``--signals-to-handle``, ``--forward-signals``): the one parser.

torchrun 2.13 reads its list with ``getattr(signal, name.strip())`` and skips, with a logged
warning, any item that is not an exact name (``SIGUSR1``). Here every spelling of a signal is
accepted: ``SIGUSR1``, ``USR1``, ``usr1`` or its number (``10``), and an item that is no signal is
an error before anything starts, listing the names that are. Workers get the canonical names.
"""

from __future__ import annotations

import signal

#: Signals that cannot be caught (SIGKILL, SIGSTOP) or that the launcher itself lives on (SIGCHLD).
UNFORWARDABLE: frozenset[str] = frozenset({"SIGKILL", "SIGSTOP", "SIGCHLD"})


def forwardable_names() -> tuple[str, ...]:
    """Every signal a list may name, canonical spelling, by number."""
    return tuple(s.name for s in sorted(signal.Signals) if s.name not in UNFORWARDABLE)


def parse_signals(text: str, allow_none: bool = False) -> tuple[str, ...]:
    """``"usr1, SIGTERM,15"`` -> ``("SIGUSR1", "SIGTERM")`` (canonical names, each once, in order).

    ``allow_none``: ``none`` or an empty text mean no signal (``--forward-signals none``).
    Raises ValueError with the message for the user.
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    if allow_none and (not items or [i.lower() for i in items] == ["none"]):
        return ()
    if not items:
        raise ValueError("give at least one signal, like SIGTERM")
    names: dict[str, None] = {}
    for item in items:
        names[_signal(item).name] = None
    return tuple(names)


def signal_numbers(names: tuple[str, ...]) -> tuple[int, ...]:
    """Canonical names (from ``parse_signals``) -> signal numbers."""
    return tuple(int(signal.Signals[name]) for name in names)


def _signal(item: str) -> signal.Signals:
    sig: object
    if item.isdigit():
        try:
            sig = signal.Signals(int(item))
        except ValueError:
            sig = None
    else:
        upper = item.upper()
        sig = getattr(signal, upper if upper.startswith("SIG") else "SIG" + upper, None)
    if not isinstance(sig, signal.Signals):
        raise ValueError(
            f"{item!r} is not a signal; use a name (SIGUSR1, USR1 or usr1) or a number, one of: "
            + ", ".join(forwardable_names())
        )
    if sig.name in UNFORWARDABLE:
        raise ValueError(f"{sig.name} cannot be forwarded (it cannot be caught, or the launcher needs it)")
    return sig
