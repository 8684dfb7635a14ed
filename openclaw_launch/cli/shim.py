"""``openclaw-launch install-torchrun-shim``: an opt-in ``torchrun`` command that runs openclaw-launch.

Shell scripts that call ``torchrun ...`` (Slurm batch files, ``run_train.sh``) then run this
launcher unchanged. The shim is a small ``sh`` script, marked so that it is recognised; torch's own
``torchrun`` is never replaced without ``--force``, and then kept beside it to be put back by
``--uninstall``. Tools that call torch's launcher in-process (``tune run``, ``accelerate launch``)
do not go through any ``torchrun`` executable and are not affected.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import click

SHIM_NAME = "torchrun"
#: The line that makes a ``torchrun`` file ours (what ``--uninstall`` and a second install look for).
SHIM_MARKER = "# openclaw-launch torchrun shim"
#: Where ``--force`` keeps the ``torchrun`` it replaced (``--uninstall`` renames it back).
BACKUP_SUFFIX = ".before-openclaw"


#: Python 3.10 has no ``-P``: the shim's interpreter drops the current directory from its path itself.
_NO_CWD = (
    "import runpy, sys; sys.path[:] = [p for p in sys.path[1:]]; "
    "runpy.run_module('openclaw_launch', run_name='__main__', alter_sys=True)"
)


def shim_text(python: str, safe_path: bool = sys.version_info >= (3, 11)) -> str:
    """The shim: torchrun's command line handed to ``python -m openclaw_launch`` unchanged, never
    with the current directory on the interpreter's path (a ``./openclaw_launch`` there, or any
    module a job's directory holds, must not run as the launcher): ``-P`` (``safe_path``, Python
    3.11+), else the same by hand."""
    undo = "(undo: openclaw-launch install-torchrun-shim --uninstall)"
    run = "-P -m openclaw_launch" if safe_path else f"-c {shlex.quote(_NO_CWD)}"
    return f'#!/bin/sh\n{SHIM_MARKER} {undo}\nexec {shlex.quote(python)} {run} "$@"\n'


def is_shim(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(256)
    except OSError:
        return False
    return SHIM_MARKER.encode() in head


def install_shim(bin_dir: Path, python: str, force: bool) -> list[str]:
    """Write ``bin_dir/torchrun``; the lines to print. Refuses (``click.UsageError``) to replace a
    ``torchrun`` that is not ours unless ``force``, which keeps it as ``torchrun.before-openclaw``."""
    target, backup = bin_dir / SHIM_NAME, bin_dir / (SHIM_NAME + BACKUP_SUFFIX)
    if not bin_dir.is_dir():
        raise click.BadParameter(f"{bin_dir} is not a directory", param_hint="--dir")
    lines = []
    if target.exists() and not is_shim(target):
        if not force:
            raise click.UsageError(
                f"{target} exists and is not the shim (torch's own torchrun?); --force replaces it, keeping it "
                f"as {backup.name} for --uninstall to put back"
            )
        if backup.exists():
            raise click.UsageError(f"{backup} exists already: move it away first (it would be overwritten)")
        target.rename(backup)
        lines.append(f"kept the previous {target} as {backup}")
    _write_executable(target, shim_text(python))
    lines.append(f"wrote {target}: `torchrun` now runs openclaw-launch ({python} -m openclaw_launch)")
    found = shutil.which(SHIM_NAME)
    if found is None or Path(found).resolve() != target.resolve():
        lines.append(
            f"warning: `torchrun` on PATH is {found or 'not found'}, not {target}: put {bin_dir} first on PATH"
        )
    return lines


def uninstall_shim(bin_dir: Path) -> list[str]:
    """Remove the shim and put back the ``torchrun`` that ``--force`` kept; the lines to print."""
    target, backup = bin_dir / SHIM_NAME, bin_dir / (SHIM_NAME + BACKUP_SUFFIX)
    if target.exists() and not is_shim(target):
        raise click.UsageError(f"{target} is not the shim; nothing was changed")
    lines = []
    if target.exists():
        target.unlink()
        lines.append(f"removed the shim {target}")
    if backup.exists():
        backup.rename(target)
        lines.append(f"put back {target} (from {backup.name})")
    return lines or [f"no shim in {bin_dir}; nothing to undo"]


def _write_executable(path: Path, text: str) -> None:
    """Atomically (a temporary file in the same directory, then rename), mode 0755."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@click.command("install-torchrun-shim")
@click.option(
    "--dir",
    "bin_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write `torchrun` (default: the active environment's scripts directory, "
    f"{sysconfig.get_path('scripts')}).",
)
@click.option("--force", is_flag=True, help="Replace a `torchrun` that is not the shim (kept for --uninstall).")
@click.option("--uninstall", is_flag=True, help="Remove the shim and put back the `torchrun` --force replaced.")
def install_torchrun_shim(bin_dir: Path | None, force: bool, uninstall: bool) -> None:
    """Put a `torchrun` executable that runs openclaw-launch into the environment (opt-in).

    Shell scripts calling `torchrun` then run openclaw-launch with the same command line. In-process
    callers of torch's launcher (`tune run`, `accelerate launch`) still use torch's own.
    """
    where = bin_dir or Path(sysconfig.get_path("scripts"))
    try:
        lines = uninstall_shim(where) if uninstall else install_shim(where, sys.executable, force)
    except OSError as e:
        raise click.ClickException(f"cannot change {where}: {e.strerror or e}") from None
    for line in lines:
        click.echo(f"openclaw-launch: {line}", err=line.startswith("warning"))
