"""Draw a saved run report: where each rank's step went, and how its step time spreads.

The table says *which* rank straggles; a picture makes *why* obvious at a glance (one rank's input
bar where the others have a long grey "waiting" bar). matplotlib is an optional extra, imported
only here, with the Agg canvas so no display, no pyplot and no global backend switch is involved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from openclaw_launch.errors import OpenclawError

if TYPE_CHECKING:
    from openclaw_launch.report.model import JobReport, NodeReport

_STRAGGLER = "tab:red"
_WAIT = "0.78"


def plot_report(report: NodeReport | JobReport, path: str) -> None:
    """Write a PNG (or any format matplotlib knows from the suffix) of ``report`` (as ``load_report``
    reads it) to ``path``."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        from matplotlib.transforms import offset_copy
    except ImportError:
        raise OpenclawError("--plot needs matplotlib: pip install 'openclaw-launch[plot]'") from None

    ranks = [r for r in report.ranks if r.statistics is not None and r.statistics.measured_steps]
    if report.statistics is None or not ranks:
        raise OpenclawError(
            "--plot: this report has no step statistics (run with a telemetry-enabled worker: "
            "telemetry.step(), or torch with an optimizer or DataLoader)"
        )
    ranks.sort(key=lambda r: r.rank)
    steps = {r.rank: r.statistics for r in ranks if r.statistics is not None}
    stragglers = {s.rank: s for s in report.stragglers}
    multi_node = len({r.node for r in ranks}) > 1
    labels = [f"rank {r.rank}" + (f"\n{r.node}" if multi_node else "") for r in ranks]

    # Section order: input first, the rest as first seen, the synchronisation (waiting) sections last.
    sync = {name for st in steps.values() for name in st.sync_sections}
    names: list[str] = []
    for st in steps.values():
        names += [n for n in st.sections if n not in names]
    names = sorted(names, key=lambda n: (n in sync, n != "input", names.index(n)))
    palette = ["tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink"]
    colours = {n: palette[i % len(palette)] for i, n in enumerate(n for n in names if n not in sync)}

    height = max(3.0, 0.45 * len(ranks) + 1.8)
    fig = Figure(figsize=(12, height), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})

    widest = 0.0
    for y, st in enumerate(steps.values()):
        x = 0.0
        for name in names:
            sec = st.sections.get(name)
            if sec is None:
                continue
            width = 1000 * sec.mean
            if name in sync:
                left.barh(y, width, left=x, color=_WAIT, hatch="///", edgecolor="0.45", linewidth=0.5)
            else:
                left.barh(y, width, left=x, color=colours[name], edgecolor="white", linewidth=0.5)
            x += width
        widest = max(widest, x)
    handles = [Patch(color=colours[n], label=n) for n in names if n not in sync]
    handles += [
        Patch(facecolor=_WAIT, hatch="///", edgecolor="0.45", label=f"{n} (waiting)") for n in names if n in sync
    ]
    below = offset_copy(left.transAxes, fig=fig, y=-30, units="points")  # under the tick labels and x label
    left.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0),
        bbox_transform=below,
        frameon=False,
        ncol=min(len(handles), 6),
        fontsize="small",
    )
    left.set_xlim(0, 1.04 * widest or 1.0)
    left.set_xlabel("mean time per step by section (ms)")
    left.set_title("where the step goes", fontsize="medium")

    for y, (rank, st) in enumerate(steps.items()):
        p50, p90, p99 = (1000 * st.step_time_s.p50, 1000 * st.step_time_s.p90, 1000 * st.step_time_s.p99)
        colour = _STRAGGLER if rank in stragglers else "tab:blue"
        right.hlines(y, p90, p99, color=colour, linewidth=1.2)
        right.hlines(y, p50, p90, color=colour, linewidth=4, alpha=0.6)
        right.plot([p99], [y], marker="|", markersize=10, color=colour)
        right.plot([p50], [y], marker="o", color=colour)
    right.set_xlim(left=0)
    right.set_xlabel("step time (ms): p50 dot, p90 thick bar, p99 whisker")
    right.set_title("step time spread", fontsize="medium")
    right.grid(axis="x", alpha=0.3)

    left.set_yticks(range(len(ranks)), labels)
    left.invert_yaxis()  # rank 0 on top, as in the table
    for tick, r in zip(left.get_yticklabels(), ranks, strict=True):
        if r.rank in stragglers:
            tick.set_color(_STRAGGLER)
            tick.set_fontweight("bold")

    if stragglers:
        verdict = "; ".join(
            f"straggler rank {s.rank} ({s.node}): {s.phase} +{s.excess_pct:.0f} %" for s in stragglers.values()
        )
    else:
        verdict = "no straggler"
    fig.suptitle(
        f"run {report.run_id}, {report.world_size} ranks: {verdict}",
        color=_STRAGGLER if stragglers else "black",
    )
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as e:
        raise OpenclawError(f"cannot write plot {path}: {getattr(e, 'strerror', None) or e}") from None
