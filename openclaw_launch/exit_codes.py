"""The launcher's exit codes, one table: what each means, and the two that ``--exit-code-classes``
adds for a Slurm ``--requeue`` script (docs/failures.md; its table is rendered from ``EXIT_CODES``).

70 and 75 are sysexits.h's EX_SOFTWARE and EX_TEMPFAIL ("temporary failure; retry"): no other
code here uses them, and 75 sorts above 70, so ``srun``, which exits with the highest code of its
tasks, says "requeue" when any node does.
"""

from __future__ import annotations

from dataclasses import dataclass

OK = 0
NODE_LOST = 1  # the nodes left, when a node of the job was lost (agents/fate.py)
BAD_INPUT = 2  # usage, config or input error, nodes that disagree: nothing started
TAKEN_OUT = 3  # elastic: this node was taken out of the job for good (agents/exclusions.py); the job goes on
SCRIPT_FAILED = 70  # --exit-code-classes: the script's own failure (a restart may or cannot help): do not requeue
REQUEUE = 75  # --exit-code-classes: a node, a GPU, the fabric failed, or a hang: requeue
HANG = 124  # --hang-timeout-s fired, as timeout(1)
NOT_EXECUTABLE = 126  # a --no-python command that is not executable, as a shell says
NOT_FOUND = 127  # a --no-python command that is not there
SIGNAL_BASE = 128  # 128+N: the launcher received signal N (or, by default, a worker was killed by it)


@dataclass(frozen=True)
class ExitCode:
    code: str
    meaning: str


EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(str(OK), "every worker of the last attempt succeeded"),
    ExitCode(
        "the worker's",
        "a worker failed: its exit code, or 128+signal if it was killed (torchrun exits 1); "
        "with `--exit-code-classes`: 70 or 75",
    ),
    ExitCode(str(NODE_LOST), "a node of a multi-node job was lost: on the nodes left (`--exit-code-classes`: 75)"),
    ExitCode(str(BAD_INPUT), "bad usage, config or input, nodes that disagree: nothing started"),
    ExitCode(
        str(TAKEN_OUT),
        "an elastic job took this node out for good (a failing node, GPU memory not freed, a straggler: "
        "[`elastic.md`](elastic.md#nodes-taken-out-for-good)); the job went on without it: **do not requeue** "
        "for it (with `--exclude-file`, it is in that file)",
    ),
    ExitCode(
        str(SCRIPT_FAILED),
        "`--exit-code-classes`: the job failed and its failure class is the script's own (a restart may or "
        "cannot help), or a restart storm: **do not requeue**",
    ),
    ExitCode(
        str(REQUEUE),
        "`--exit-code-classes`: a node, a GPU or the fabric failed, or a rank hung (a class where a restart "
        "can help): **requeue**",
    ),
    ExitCode(str(HANG), "a rank hung (`--hang-timeout-s`; `--exit-code-classes`: 75)"),
    ExitCode(f"{NOT_EXECUTABLE}, {NOT_FOUND}", "a `--no-python` command that is not executable / not there"),
    ExitCode(f"{SIGNAL_BASE}+N", "the launcher received signal N and stopped the job (with `--exit-code-classes` too)"),
)


def class_exit_code(restart_helps: bool) -> int:
    """``--exit-code-classes``: the job's code for a failure of a class where a restart helps, or not."""
    return REQUEUE if restart_helps else SCRIPT_FAILED
