"""One small exception tree. Every message tells the user what to do next.

Errors raised before any process was started exit with code 2 (usage/config),
as torchrun does for bad arguments; the CLI turns them into one clean message,
never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from openclaw_launch.exit_codes import BAD_INPUT


class OpenclawError(Exception):
    """Base of every error the launcher reports to the user."""

    exit_code: int = BAD_INPUT


@dataclass(frozen=True)
class Problem:
    """One finding about the input: where it is and what is wrong."""

    path: str  # key path such as "cluster.nodes[1].gpus[0].uuid"
    line: int | None  # 1-based YAML line, None when unknown
    message: str

    def __str__(self) -> str:
        where = f"{self.path} (line {self.line})" if self.line is not None else self.path
        return f"{where}: {self.message}" if where else self.message


class ConfigError(OpenclawError):
    """The YAML config is invalid. Holds every problem found, not just the first."""

    def __init__(self, source: str, problems: Sequence[Problem]):
        self.source = source
        self.problems = tuple(problems)
        lines = [f"{source}: {len(self.problems)} problem(s) in the config:"]
        lines += [f"  {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class TopologyError(OpenclawError):
    """The machine (or snapshot) does not match what the config asks for."""


class PlanError(OpenclawError):
    """The config and topology are valid but no launch plan satisfies them."""


class LaunchError(OpenclawError):
    """Something needed to start the job (MPS daemon, numactl, a port) failed."""
