"""The entry point (``openclaw-launch``, ``python -m openclaw_launch``): the start-up signal
handlers (startup.py) go in before the command line's modules are imported, and this process, the
launcher, has every fork and spawn checked for a second thread (single_thread.py)."""

from __future__ import annotations

from openclaw_launch import single_thread, startup


def main() -> None:
    startup.install()
    single_thread.arm()
    try:
        from openclaw_launch.cli.main import main as cli_main

        startup.arm()
        cli_main()
    except startup.StartSignal as e:
        startup.exit_for(e.signum)


if __name__ == "__main__":
    main()
