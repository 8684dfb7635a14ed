"""The workers' terminal: when the launcher writes to a terminal each rank writes to a pty of its own
(run/terminal.py), so it sees a terminal of the launcher's window size as torchrun's workers do;
redraws reach the terminal with the rank prefix and the log as written; SIGWINCH resizes every
rank's pty; Ctrl-C reaches the launcher, not the workers; pipes when the launcher's output is not a
terminal. Real launchers on a real pty (the test holds its master side), under torchrun too: what
its workers saw from the recording (tests/torchrun_recording.py), the interactive cases under the
``torchrun_live`` marker."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for
from torchrun_recording import SIDES, torchrun_side

if importlib.util.find_spec("torch") is None:
    pytest.skip("torchrun (torch) is compared in every test here", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "terminal_worker.py")
LAUNCHERS = {
    "openclaw": [sys.executable, "-m", "openclaw_launch"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}
# each launcher, torchrun's under the marker (a test of it alone, against no recording)
EACH_LAUNCHER = ["openclaw", pytest.param("torchrun", marks=pytest.mark.torchrun_live)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "MASTER_"))}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}


def _set_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def _take_terminal() -> None:
    """In the launcher before exec: its stdin (the pty) becomes its controlling terminal, as in a shell."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class OnTerminal:
    """A launcher started on a pty of ``rows`` x ``columns`` (stdin, stdout and, unless
    ``stderr_pipe``, stderr): its controlling terminal, the test reading its master side."""

    def __init__(self, args: list[str], rows: int = 24, columns: int = 80, stderr_pipe: bool = False) -> None:
        self.master, worker_side = os.openpty()
        _set_size(worker_side, rows, columns)
        self.output = b""
        self.proc = subprocess.Popen(
            args,
            stdin=worker_side,
            stdout=worker_side,
            stderr=subprocess.PIPE if stderr_pipe else worker_side,
            start_new_session=True,
            preexec_fn=_take_terminal,
            env=_env(),
            cwd=ROOT,
        )
        os.close(worker_side)

    def _read(self, timeout_s: float) -> bool:
        """Read what is there (waiting at most ``timeout_s``); False at the end (EIO: no writer left)."""
        ready, _, _ = select.select([self.master], [], [], timeout_s)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:
            return False
        self.output += data
        return bool(data)

    def wait_for(self, text: bytes, times: int = 1) -> None:
        """Read until ``text`` was written ``times`` times."""

        def came() -> bool:
            if self.output.count(text) >= times:
                return True
            assert self._read(1.0), f"ended before it came: {text!r}\n{self.text()}"
            return False

        wait_for(came, lambda: f"never came: {text!r}\n{self.text()}", poll_s=0)

    def finish(self) -> int:
        code = self.proc.wait(timeout=GUARD_S)
        while self._read(1.0):
            pass
        os.close(self.master)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code

    def text(self) -> str:
        return self.output.decode(errors="replace")


def _probes(out: Path) -> list[dict[str, object]]:
    """What terminal_worker.probe wrote for each rank, in rank order."""
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))]


def _probe_on_terminal(
    launcher: list[str], out: Path, *args: str, rows: int = 24, columns: int = 80, stderr_pipe: bool = False
) -> list[dict[str, object]]:
    """The probes of a launcher's ranks (``args`` before the worker), the launcher on a pty."""
    out.mkdir()
    term = OnTerminal([*launcher, *args, WORKER, "probe", str(out)], rows, columns, stderr_pipe)
    assert term.finish() == 0, term.text()
    return _probes(out)


def _view(stdout: bool, stderr: bool, columns: int = 80, rows: int = 24) -> dict[str, object]:
    """What terminal_worker.probe writes for a worker whose terminals are ``columns`` x ``rows``."""
    size = [columns, rows]
    return {
        "stdout_isatty": stdout,
        "stderr_isatty": stderr,
        "stdout_size": size if stdout else None,
        "stderr_size": size if stderr else None,
    }


PREFIX_COLUMNS = len("[rank 0] ")  # the default prefix: a worker's line is the window less it


@pytest.mark.parametrize("side", SIDES)
def test_workers_see_the_launchers_terminal_and_its_size_as_under_torchrun(tmp_path: Path, side: str) -> None:
    """The launcher's window less the rank prefix, so that a full-width bar fits after the prefix;
    with ``--prefix ''`` exactly the window, as under torchrun."""

    def probes(out: str, *launcher: str) -> list[dict[str, object]]:
        return _probe_on_terminal(list(launcher), tmp_path / out, "--nproc-per-node", "2", rows=33, columns=101)

    full = _view(True, True, 101, 33)
    theirs = torchrun_side("terminal/window_size", side, lambda: probes("torchrun", *LAUNCHERS["torchrun"]))
    assert theirs == probes("no-prefix", *LAUNCHERS["openclaw"], "--prefix", "") == [full, full]
    narrower = _view(True, True, 101 - PREFIX_COLUMNS, 33)
    assert probes("openclaw", *LAUNCHERS["openclaw"]) == [narrower, narrower]


@pytest.mark.parametrize("side", SIDES)
def test_with_the_launchers_output_a_pipe_the_workers_see_pipes_as_under_torchrun(tmp_path: Path, side: str) -> None:
    def probes(which: str) -> list[dict[str, object]]:
        out = tmp_path / which
        out.mkdir()
        done = subprocess.run(
            [*LAUNCHERS[which], "--nproc-per-node", "2", WORKER, "probe", str(out)],
            capture_output=True,
            env=_env(),
            cwd=ROOT,
            timeout=GUARD_S,
        )
        assert done.returncode == 0, done.stderr
        return _probes(out)

    pipes = [_view(False, False), _view(False, False)]
    assert torchrun_side("terminal/pipes", side, lambda: probes("torchrun")) == pipes
    assert probes("openclaw") == pipes


@pytest.mark.parametrize("side", SIDES)
def test_each_stream_gets_a_pty_only_where_the_launchers_is_a_terminal(tmp_path: Path, side: str) -> None:
    """The launcher's stdout a terminal, its stderr a pipe: the worker's stdout a tty, its stderr a pipe."""

    def probes(which: str) -> list[dict[str, object]]:
        return _probe_on_terminal(LAUNCHERS[which], tmp_path / which, "--nproc-per-node", "1", stderr_pipe=True)

    assert torchrun_side("terminal/stderr_a_pipe", side, lambda: probes("torchrun")) == [_view(True, False)]
    assert probes("openclaw") == [_view(True, False, 80 - PREFIX_COLUMNS)]


@pytest.mark.parametrize("side", SIDES)
def test_a_stream_kept_off_the_console_is_a_pipe_as_under_torchrun(tmp_path: Path, side: str) -> None:
    """``--redirects 2``: the rank's stderr goes to its log only, so it is no terminal (torchrun's
    goes to a file)."""

    def probes(which: str) -> list[dict[str, object]]:
        args = ["--nproc-per-node", "1", "--log-dir", str(tmp_path / f"logs-{which}"), "--redirects", "2"]
        return _probe_on_terminal(LAUNCHERS[which], tmp_path / which, *args)

    assert torchrun_side("terminal/stderr_to_the_log", side, lambda: probes("torchrun")) == [_view(True, False)]
    assert probes("openclaw") == [_view(True, False, 80 - PREFIX_COLUMNS)]


def test_a_redrawn_bar_reaches_the_terminal_as_redraws_with_the_prefix_and_the_log_as_written(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    term = OnTerminal([*LAUNCHERS["openclaw"], "--nproc-per-node", "1", "--log-dir", str(logs), WORKER, "bar", "3"])
    assert term.finish() == 0, term.text()
    drawn = [f"step {i}/3 \x1b[32m{'#' * i}\x1b[0m" for i in range(4)]
    # each redraw goes back to the line's start and draws the prefix again; colours untouched
    assert "\r".join(f"[rank 0] {d}" for d in drawn) + "\r\n" in term.text()
    (log,) = logs.glob("*/attempt-0/rank-0/stderr.log")
    assert log.read_bytes() == ("".join(f"\r{d}" for d in drawn) + "\n").encode()  # no \r\n: bytes as written


@pytest.mark.parametrize("which", EACH_LAUNCHER)
def test_tqdm_draws_on_the_launchers_terminal_and_not_into_a_pipe_as_under_torchrun(which: str) -> None:
    """``tqdm(disable=None)``: a live bar on a terminal (each redraw with the rank prefix here),
    nothing at all into a pipe, under both launchers."""
    pytest.importorskip("tqdm")
    args = [*LAUNCHERS[which], "--nproc-per-node", "1", WORKER, "tqdm", "3"]
    term = OnTerminal(args)
    assert term.finish() == 0, term.text()
    piped = subprocess.run(args, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=GUARD_S)
    assert piped.returncode == 0 and "3/3" not in piped.stderr + piped.stdout, piped.stderr
    text = term.text()  # a full-width bar, which fits the line after the prefix too
    last = [drawing for drawing in text.split("\r") if "100%|" in drawing][-1]
    assert "| 3/3 [" in last and last.startswith("[rank 0] 100%|" if which == "openclaw" else "100%|"), text
    assert len(last) == 79, text  # tqdm leaves the last column free
    if which == "openclaw":
        assert text.count("\r[rank 0] ") >= 3  # 0/3 first, then one redraw per step


def test_a_line_on_stdout_never_lands_inside_a_bar_on_stderr_of_the_same_terminal() -> None:
    """stdout and stderr on one terminal share one open line: the bar's line ends before the other
    stream's line is shown, and the next redraw starts a line of its own."""
    term = OnTerminal([*LAUNCHERS["openclaw"], "--nproc-per-node", "1", WORKER, "mixed", "3"])
    assert term.finish() == 0, term.text()
    lines = term.text().split("\r\n")
    assert [line for line in lines if "loss" in line] == [f"[rank 0] loss {i}" for i in range(4)], lines
    assert all(line.startswith("[rank 0] step") for line in lines if "/3" in line), lines
    assert "[rank 0] " not in lines  # the bar's last end is the one the line of stdout gave it


@pytest.mark.parametrize("which", EACH_LAUNCHER)
def test_a_resized_terminal_resizes_every_ranks_terminal(tmp_path: Path, which: str) -> None:
    term = OnTerminal([*LAUNCHERS[which], "--nproc-per-node", "2", WORKER, "resize", str(tmp_path)])
    prefixes = ["[rank 0] ", "[rank 1] "] if which == "openclaw" else [""]  # torchrun's workers: no prefix
    margin = PREFIX_COLUMNS if which == "openclaw" else 0
    for prefix in prefixes:
        term.wait_for(f"{prefix}size {80 - margin}x24".encode(), times=2 // len(prefixes))
    _set_size(term.master, 30, 100)  # the kernel sends SIGWINCH to the launcher (the terminal's foreground)
    for prefix in prefixes:
        term.wait_for(f"{prefix}size {100 - margin}x30".encode(), times=2 // len(prefixes))
    (tmp_path / "stop").write_text("")
    assert term.finish() == 0, term.text()


@pytest.mark.parametrize("which", EACH_LAUNCHER)
def test_ctrl_c_on_the_terminal_reaches_the_launcher_which_stops_the_workers(tmp_path: Path, which: str) -> None:
    """The workers are in their own session: the terminal's SIGINT goes to the launcher alone, and
    the workers hear of it from the launcher (the sender's pid), as under torchrun."""
    term = OnTerminal([*LAUNCHERS[which], "--nproc-per-node", "2", WORKER, "interrupt", str(tmp_path)])
    for prefix in ["[rank 0] ", "[rank 1] "] if which == "openclaw" else [""]:
        term.wait_for(f"{prefix}ready for ctrl-c".encode(), times=1 if prefix else 2)
    os.write(term.master, b"\x03")  # Ctrl-C: the line discipline sends SIGINT to the foreground group
    code = term.finish()
    for rank in (0, 1):
        assert (tmp_path / f"signal-{rank}.json").exists(), term.text()
        got = json.loads((tmp_path / f"signal-{rank}.json").read_text())
        assert got["pid"] == term.proc.pid and got["signo"] in (signal.SIGINT, signal.SIGTERM), got
    if which == "openclaw":
        assert code == 128 + signal.SIGINT, term.text()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_without_ptys_to_be_had_the_workers_get_pipes_and_run(tmp_path: Path) -> None:
    """No pty for the workers (/dev/ptmx unusable in the launcher's mount namespace): pipes, not a failure."""
    out = tmp_path / "out"
    out.mkdir()
    launch = " ".join([*LAUNCHERS["openclaw"], "--nproc-per-node", "1", WORKER, "probe", str(out)])
    term = OnTerminal(["unshare", "--mount", "sh", "-c", f"mount --bind /dev/null /dev/ptmx && exec {launch}"])
    assert term.finish() == 0, term.text()
    assert _probes(out) == [_view(False, False)]
