"""The shape of a saved run report, checked before it is rendered: a field of the wrong type (or
missing) is one clear error naming the field, never a traceback.

Only the fields ``report.format_report`` reads are required; anything else may be absent (reports of
schema 1 lack the statistics) or carry extra keys.
"""

from __future__ import annotations

from typing import Any

_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_INT = (int, type(None))
_OPT_STR = (str, type(None))

_STEP_STATS: dict[str, Any] = {
    "steps": (int,),
    "measured_steps": (int,),
    "step_time_s": {"p50": _NUM, "p90": _NUM, "mean": _NUM},
    "input_wait_share": _NUM,
    "wait_share": _NUM,
}
_RANK: dict[str, Any] = {
    "rank": (int,),
    "node": (str,),
    "exit_code": _OPT_INT,
    "signal": _OPT_STR,
    "wall_s": _OPT_NUM,
    "cpu_s": _OPT_NUM,
    "max_rss_kib": _OPT_NUM,
    "bound_cpus": _OPT_STR,
    "bound_mems": _OPT_STR,
    "?binding_warning": _OPT_STR,
    "?statistics": ("optional", _STEP_STATS),
}
_STRAGGLER: dict[str, Any] = {
    "rank": (int,),
    "node": (str,),
    "phase": (str,),
    "section": (str,),
    "excess_s": _NUM,
    "excess_pct": _NUM,
}
REPORT: dict[str, Any] = {
    "run_id": _OPT_STR,
    "node": (str,),
    "exit_code": (int,),
    "attempts": (int,),
    "ranks": [_RANK],
    "?statistics": (
        "optional",
        {"threshold_pct": _OPT_NUM, "?sync_bound_share": _OPT_NUM, "?gpu_error": _OPT_STR},
    ),
    "?stragglers": [_STRAGGLER],
}


class ReportShapeError(ValueError):
    pass


def check(value: Any, spec: Any, path: str = "") -> None:
    """Raise ``ReportShapeError("ranks[2].exit_code: expected ...")`` for the first wrong field."""
    if isinstance(spec, tuple) and spec and spec[0] == "optional":
        if value is not None:
            check(value, spec[1], path)
        return
    if isinstance(spec, tuple):
        if isinstance(value, bool) or not isinstance(value, spec):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in spec)
            raise ReportShapeError(f"{path or 'the report'}: expected {names}, found {_show(value)}")
        return
    if isinstance(spec, list):
        if not isinstance(value, list):
            raise ReportShapeError(f"{path}: expected a list, found {_show(value)}")
        for i, item in enumerate(value):
            check(item, spec[0], f"{path}[{i}]")
        return
    if not isinstance(value, dict):
        raise ReportShapeError(f"{path or 'the report'}: expected an object, found {_show(value)}")
    for key, sub in spec.items():
        optional = key.startswith("?")
        key = key.lstrip("?")
        where = f"{path}.{key}" if path else key
        if key not in value:
            if optional:
                continue
            raise ReportShapeError(f"{where}: missing")
        check(value[key], sub, where)


def _show(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else text[:40] + "..."
