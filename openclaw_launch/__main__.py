"""The entry point (``openclaw-launch``, ``python -m openclaw_launch``): the start-up signal
handlers (startup.py, which loads nothing from disk) go in first, before this process's other
imports, then this process, the launcher, has every fork and spawn checked for a second thread
(single_thread.py) and the command line's modules load. The package's ``__init__`` stays free of
imports too (no ``typing``): under the console script and under ``-m`` it loads before this module.

Earliest of all, before the interpreter's ``site`` import (its ``.pth`` files: 3-20 ms, far more on
a loaded host, in which Python's own SIGINT handler would raise ``KeyboardInterrupt`` and a PID 1
would drop a SIGTERM): ``python3 -S .../openclaw_launch/__main__.py`` (or a symlink to it, as the
Dockerfile's ENTRYPOINT). Run by its path, this file finds the package in the directory above its
own, installs the handlers, and only then runs ``site`` (``site.main()``: the site-packages that
``-S`` left out, the ``.pth`` files, ``sitecustomize``), as a plain start would have.
"""

import sys

if __name__ == "__main__" and not __package__ and sys.path and sys.path[0].endswith("/openclaw_launch"):
    sys.path[0] = sys.path[0][: -len("/openclaw_launch")]  # run by path (symlinks resolved): the package's parent

from openclaw_launch import startup  # noqa: E402 (after the path's fix-up, for a run by path)


def main() -> None:
    startup.install()
    try:
        from openclaw_launch import single_thread

        single_thread.arm()
        from openclaw_launch.cli.main import main as cli_main

        startup.arm()
        cli_main()
    except startup.StartSignal as e:
        startup.exit_for(e.signum)


def _site_after_handlers() -> None:
    """Started with ``-S``: the handlers, then the ``site`` import that ``-S`` skipped (a signal
    meanwhile is recorded and ends the launcher once ``main`` arms)."""
    startup.install()
    import site

    site.main()


if __name__ == "__main__":
    if sys.flags.no_site:
        _site_after_handlers()
    main()
