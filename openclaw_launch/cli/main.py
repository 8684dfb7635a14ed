"""Command line: ``run`` (the default), ``plan``, ``preflight``, ``discover``, ``validate``, ``report``,
``compare``, ``install-torchrun-shim``.

Thin: parse options, gather inputs (config, topology), call the pure planner,
hand the plan to the effects (MPS, supervisor). Every user error exits 2 with
one message and no traceback, before anything is started.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

import click

from openclaw_launch.cli.common import fail
from openclaw_launch.cli.torchrun_resolve import misspelled_command
from openclaw_launch.errors import OpenclawError
from openclaw_launch.exit_codes import BAD_INPUT

SUBCOMMANDS = ("run", "plan", "preflight", "discover", "validate", "report", "compare", "install-torchrun-shim")


def _load(name: str) -> click.Command | None:
    """The command ``name``, its module imported only now (click's lazy subcommands): ``run`` starts
    the job without importing the other commands and what they need."""
    if name == "run":
        from openclaw_launch.cli.run import run

        return run
    if name == "install-torchrun-shim":
        from openclaw_launch.cli.shim import install_torchrun_shim

        return install_torchrun_shim
    if name not in SUBCOMMANDS:
        return None
    from openclaw_launch.cli import tools

    return {
        "plan": tools.plan,
        "preflight": tools.preflight,
        "discover": tools.discover,
        "validate": tools.validate,
        "report": tools.report,
        "compare": tools.compare,
    }[name]


class _DefaultRun(click.Group):
    """``openclaw-launch [run options] train.py`` is ``openclaw-launch run ...`` (torchrun's shape)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return _load(cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in SUBCOMMANDS and args[0] not in ("--help", "-h", "--version"):
            meant = misspelled_command(args[0], SUBCOMMANDS, os.path.exists(args[0]))
            if meant:
                raise click.UsageError(f"no command {args[0]!r} and no such file; did you mean {meant!r}?")
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultRun, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="openclaw-launch")
def cli() -> None:
    """Topology-aware launcher: every rank on its GPU by UUID, on that GPU's NUMA node.

    Run a job as with torchrun, with torchrun's flags: `openclaw-launch [OPTIONS] train.py [ARGS]...`
    is `openclaw-launch run ...` (see `openclaw-launch run --help`, docs/torchrun-compat.md).
    """


def _standard_streams() -> None:
    """Started with fd 0, 1 or 2 closed (``2>&-``): /dev/null in their place, so no file we open
    becomes a worker's stderr and no message raises."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the process's stdout, open until exit
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115


def main() -> None:
    """Every usage error is one line on stderr and exit 2, before anything starts (no click banner).
    Ctrl-C before the job's signal handling is in place exits 130, as a shell expects. The process
    then ends at once (``_exit_now``)."""
    try:
        _guarded_main()
    except SystemExit as e:
        _exit_now(e.code)


def _exit_now(code: object) -> None:
    """End the process as ``sys.exit(code)`` would, less the interpreter's teardown: the atexit
    handlers run and the standard streams are flushed, then ``os._exit``. Freeing every module and
    object one by one took 15-60 ms on the 2-core box (the floor launcher's whole clean exit is 11 ms),
    and the kernel frees the memory, closes the descriptors and tells the parent all the same."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("text"): the text on stderr, exit 1
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"{code}\n")
        status = 1
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except OSError as e:  # what is left of our output cannot be written (`> /dev/full`)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"openclaw-launch: error: cannot write the output: {e.strerror or e}\n")
        status = status or 1
    except ValueError:  # closed
        pass
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(status & 0xFF)


def _guarded_main() -> None:
    try:
        _standard_streams()
        _main()
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("openclaw-launch: interrupted\n")
        sys.exit(130)
    except OSError as e:  # our own output failed (`plan --json > /dev/full`, a closed pipe)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - nothing more can reach the old one
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"openclaw-launch: error: cannot write the output: {e.strerror or e}\n")
        sys.exit(1)


def _main() -> None:
    try:
        rv = cli.main(prog_name="openclaw-launch", standalone_mode=False)
    except click.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare command: its help (click >= 8.2)
            click.echo(e.format_message(), err=True)
            sys.exit(BAD_INPUT)
        hint = f" (see openclaw-launch {e.ctx.info_name} --help)" if e.ctx and e.ctx.parent else ""
        click.echo(f"openclaw-launch: error: {e.format_message()}{hint}", err=True)
        sys.exit(BAD_INPUT)
    except click.ClickException as e:
        click.echo(f"openclaw-launch: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.Abort:
        sys.exit(130)
    except OpenclawError as e:  # raised outside a command's own handler
        fail(e)
    sys.exit(rv if isinstance(rv, int) else 0)
