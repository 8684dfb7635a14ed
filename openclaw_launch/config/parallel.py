"""The config's ``parallel:`` section (and ``--tp/--pp/--dp``): the requested sizes and the rule they
must satisfy. The groups themselves are computed by the plan (``plan/parallel.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: The layout's dimensions: config keys ``parallel.*``, flags ``--tp/--pp/--dp``, env names.
PARALLEL_DIMS: tuple[str, ...] = ("tp", "pp", "dp")


@dataclass(frozen=True)
class ParallelSpec:
    """Requested sizes; None = not given (``dp`` then fills the world, ``tp``/``pp`` are 1).

    ``where`` names each given size for messages: ``--tp`` or ``parallel.tp (line 12)``.
    """

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    where: Mapping[str, str] = field(default_factory=dict)

    @property
    def given(self) -> bool:
        return any(getattr(self, d) is not None for d in PARALLEL_DIMS)

    def overridden_by(self, other: ParallelSpec) -> ParallelSpec:
        """Each size ``other`` gives (the command line) replaces this one's (the config)."""
        values = {d: getattr(other, d) if getattr(other, d) is not None else getattr(self, d) for d in PARALLEL_DIMS}
        where = {d: other.where.get(d) or self.where.get(d, f"parallel.{d}") for d in PARALLEL_DIMS}
        return ParallelSpec(**values, where=where)

    def name(self, dim: str) -> str:
        return self.where.get(dim, f"--{dim}")


def size_problems(spec: ParallelSpec, world_size: int, node_ranks: Mapping[str, int]) -> list[str]:
    """Why ``spec`` cannot lay out ``world_size`` ranks on nodes of ``node_ranks`` ranks each.

    The one rule used by the config check, the plan and ``--suggest-parallel``: tp*pp*dp is the
    world size, and TP groups stay on one node (tp divides every node's rank count).
    """
    tp, pp = spec.tp or 1, spec.pp or 1
    given = ", ".join(f"{spec.name(d)} {getattr(spec, d)}" for d in PARALLEL_DIMS if getattr(spec, d) is not None)
    problems: list[str] = []
    dp = spec.dp if spec.dp is not None else max(1, world_size // (tp * pp))
    if tp * pp * dp != world_size:
        problems.append(f"tp x pp x dp must be the world size {world_size}, but {given} make {tp * pp * dp}")
    for node, ranks in node_ranks.items():
        if ranks % tp:
            problems.append(
                f"{spec.name('tp')} {tp} does not divide the {ranks} ranks of node {node}: a TP group must "
                "stay on one node"
            )
    return problems
