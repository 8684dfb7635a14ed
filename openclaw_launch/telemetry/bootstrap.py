"""Runs the user's script as ``python`` would, with the zero-code hooks armed.

The launcher starts ``python -u -m openclaw_launch.telemetry.bootstrap SCRIPT ARGS`` (or
``... bootstrap -m MODULE ARGS``). ``sys.argv``, ``sys.path[0]`` (the directory of the script's
real path, symlinks resolved, as python's own ``realpath``; untouched under ``-P``) and the
``__main__`` module (absolute ``__file__``, a ``SourceFileLoader``, no ``__package__``) are what a
plain ``python SCRIPT`` gives; a directory or zip file as SCRIPT runs through ``runpy`` (its
``__main__.py``). An uncaught exception's traceback is python's own: the bootstrap's frames, and
the torch hooks' wrappers' anywhere in it or its chained exceptions, are cut from it before
``sys.excepthook`` prints it (under ``-m`` runpy's two frames stay, as
``python -m`` prints them), the exit code is 1. Nothing heavy is imported here: the torch
hooks are installed right after the script itself imports torch, and a script that never does
pays nothing. Any failure of ours is one warning on stderr, never the job's end.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import os
import runpy
import sys
import types
from types import FrameType, ModuleType, TracebackType
from typing import NoReturn

import openclaw_launch.telemetry.wire as wire
from openclaw_launch.telemetry.after_import import AfterImport


def _install_torch_hooks(torch: ModuleType) -> None:
    try:
        import openclaw_launch.telemetry.torch_hooks as torch_hooks

        torch_hooks.install(torch)
    except Exception as exc:  # a torch we do not know: statistics off, the job goes on
        sys.stderr.write(f"openclaw-launch: warning: per-step statistics off in this rank ({exc!r})\n")


def arm() -> None:
    """Hook torch's import when this process reports to a launcher and hooks are wanted."""
    if not os.environ.get(wire.SOCKET_ENV) or os.environ.get(wire.HOOKS_ENV) == "0":
        return
    if "torch" in sys.modules:
        _install_torch_hooks(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, AfterImport("torch", _install_torch_hooks))


_stacks_file: object = None


def arm_stack_dump() -> None:
    """With hang detection on: ``wire.dump_signal()`` makes faulthandler write every thread's stack
    to the file the launcher named (it reads it, shows it, and puts it in the rank's log). C-level
    and GIL-free: it works while the main thread is blocked in a collective or a system call."""
    path = os.environ.get(wire.STACKS_ENV)
    if not path:
        return
    try:
        import faulthandler
        import signal

        import openclaw_launch.telemetry.recorder as recorder

        sig = wire.dump_signal()
        global _stacks_file
        _stacks_file = open(path, "w", buffering=1)  # noqa: SIM115 - faulthandler writes to it for the process's life
        faulthandler.register(sig, file=_stacks_file, all_threads=True, chain=False)
        signal.siginterrupt(sig, False)  # SA_RESTART: the hung rank's blocking C calls go on, no EINTR
        recorder.DUMP_SIGNAL = sig
    except (OSError, ValueError, RuntimeError, AttributeError) as exc:
        sys.stderr.write(f"openclaw-launch: warning: no stack dump on hang in this rank ({exc!r})\n")


def arm_sigterm_flush() -> None:
    """A rank the launcher stops keeps its statistics: SIGTERM flushes the recorder's batch, then
    acts as before (telemetry/recorder.py ``watch_sigterm``); a handler the script installs wins."""
    if os.environ.get(wire.SOCKET_ENV):
        import openclaw_launch.telemetry.recorder as recorder

        recorder.get(watch_sigterm=True)


def main(argv: list[str], hooks: bool = True) -> None:
    """Run ``argv`` as python runs it; ``hooks``: arm the telemetry (the prewarm zygote's worker
    runs a plan's ``python -u SCRIPT`` through here too, without them: run/zygote.py)."""
    if not argv or argv[:1] == ["-m"] and len(argv) < 2:
        sys.exit("usage: python -m openclaw_launch.telemetry.bootstrap (SCRIPT | -m MODULE) [ARGS...]")
    if hooks:
        arm_stack_dump()
        arm_sigterm_flush()
        arm()
    try:
        _run(argv)
        return
    except SystemExit:
        raise
    except BaseException as exc:
        uncaught = exc
    by_runpy = argv[0] == "-m" or not _is_source(argv[0])  # python shows runpy's frames then
    _end_as_python(uncaught, sys._getframe() if by_runpy else None)  # out of the except: no exc_info in the hook


def _run(argv: list[str]) -> None:
    # Under -P / PYTHONSAFEPATH python puts nothing in front of sys.path, and neither do we.
    own_path0 = not getattr(sys.flags, "safe_path", False)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        if own_path0:
            sys.path[0] = os.getcwd()  # as `python -m MODULE`
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    if not os.path.exists(script):  # python's own words and exit code
        missing = os.path.abspath(script)
        sys.stderr.write(f"{sys.executable}: can't open file {missing!r}: [Errno 2] No such file or directory\n")
        sys.exit(2)
    sys.argv = list(argv)
    if own_path0:
        sys.path[0] = os.path.dirname(os.path.realpath(script))  # as `python SCRIPT`
    if _is_source(script):
        _run_source_as_main(script)
    else:
        runpy.run_path(script, run_name="__main__")


def _is_source(script: str) -> bool:
    """A source file (run as python runs one); else a module, directory or zip file (by runpy)."""
    return os.path.isfile(script) and not script.endswith((".pyc", ".pyz", ".zip"))


def _end_as_python(exc: BaseException, runpy_frame: FrameType | None) -> NoReturn:
    """What python does with an uncaught exception, minus our frames: ``sys.excepthook`` (the
    user's if they set one) prints the user's part of the traceback, the exit code is 1, and a
    KeyboardInterrupt still ends the process by SIGINT (python does that itself when it sees one
    escape ``-m``, here with the hook silenced: it was printed). ``runpy_frame``: where runpy's
    frames above us are, for a module, directory or zip file (python shows them for those)."""
    ours = {_end_as_python.__code__.co_filename, runpy.run_path.__code__.co_filename}
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    if tb is None:  # nothing of the user's ran: runpy could not find the module
        if runpy_frame is not None and isinstance(exc, ImportError):
            sys.exit(f"{sys.executable}: {exc}")  # python -m's words and exit code
        raise exc
    frame = runpy_frame
    while frame is not None:
        if frame.f_code.co_filename == runpy.run_path.__code__.co_filename:
            tb = TracebackType(tb, frame, frame.f_lasti, frame.f_lineno)
        frame = frame.f_back
    tb = _without_hooks(tb)
    _cut_hooks(exc, {id(exc)})
    exc.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    try:
        sys.excepthook(type(exc), exc, tb)
    except Exception as hook_exc:  # as python reports a failing hook
        sys.stderr.write("Error in sys.excepthook:\n")
        sys.__excepthook__(type(hook_exc), hook_exc, hook_exc.__traceback__)
        sys.stderr.write("\nOriginal exception was:\n")
        sys.__excepthook__(type(exc), exc, tb)
    if isinstance(exc, KeyboardInterrupt):
        sys.excepthook = _printed_already
        raise exc
    sys.exit(1)


_HOOKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _without_hooks(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without the frames of the torch hooks' wrappers (this package's files): an error
    raised inside a hooked torch call (``loss.backward()``, ``dist.all_reduce``) reads as under
    plain python, from the caller's line into torch's own frames."""
    entries: list[TracebackType] = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_HOOKS_DIR):
            entries.append(tb)
        tb = tb.tb_next
    out: TracebackType | None = None
    for entry in reversed(entries):
        out = TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def _cut_hooks(exc: BaseException, seen: set[int]) -> None:
    """The same for the exceptions chained to ``exc`` (``__cause__``, ``__context__``), once each."""
    for chained in (exc.__cause__, exc.__context__):
        if chained is not None and id(chained) not in seen:
            seen.add(id(chained))
            chained.__traceback__ = _without_hooks(chained.__traceback__)
            _cut_hooks(chained, seen)


def _printed_already(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """The hook once the exception was printed (a KeyboardInterrupt left to python to end with)."""


def _run_source_as_main(script: str) -> None:
    """Run a source file as python runs SCRIPT: in a fresh ``__main__`` whose ``__file__`` is the
    absolute path (not resolved), ``sys.argv`` left as given (``runpy.run_path`` would rewrite
    ``argv[0]`` and keep the path relative)."""
    path = os.path.abspath(script)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)


if __name__ == "__main__":
    main(sys.argv[1:])
