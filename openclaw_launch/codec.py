"""The one JSON codec of the frozen types: the reports, the statistics they hold and the messages
of the helpers' links (run/helper.py); with it, the schema check. In the ground, so that stats/
(below report/) and run/ encode with it too.

``to_json`` writes every field of a frozen dataclass in declaration order. ``from_json`` walks the
same fields and their type hints: a value of the wrong type (or a missing key) is one
``ReportShapeError`` naming its path (``ranks[2].exit_code: expected int or null, found 'x'``),
never a traceback. So the check is generated from the types: there is no second description of
the shape to keep in step. Keys the types do not know are ignored (a newer writer may add some).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

T = TypeVar("T")
# metadata keys of a report field (see ``doc``)
DOC = "doc"
JOB_DOC = "job"
SINCE = "since"
ABSENT = "absent"


class ReportShapeError(ValueError):
    pass


def doc(
    text: str, *, job: str | None = None, since: int | None = None, absent: object = dataclasses.MISSING
) -> dict[str, object]:
    """A field's metadata: its meaning for docs/report-format.md; ``job``: its meaning in the job
    report where that is an aggregation over nodes; ``since``: for a field added after the object
    that holds it, the first report schema whose every report has it (a field added while schema N
    was current is missing from the older reports of N: its ``since`` is N + 1); ``absent``: what a
    report of an older schema reads for it where that is not null (a field that admits null) or
    empty (a list or an object). Reading old reports and docs/report-format.md both use these."""
    return {DOC: text, JOB_DOC: job, SINCE: since, ABSENT: absent}


def to_json(value: Any) -> Any:
    """The JSON form (dicts, lists, scalars) of a report type or anything nested in one."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def from_json(cls: type[T], data: Any, *, schema: int | None = None) -> T:
    """``data`` checked against ``cls`` and built into it. ``schema``: the version of an older
    report's schema, in which a field whose ``since`` is later may be missing (it takes its
    ``absent_value``); None: data of the types as they are, every field present."""
    return typing.cast(T, _decode(cls, data, "", schema))


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved type of each field of a report type."""
    return typing.get_type_hints(cls)


def optional_part(tp: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None``, else ``(tp, False)``."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0], True
        raise TypeError(f"report fields take one type or null, not {tp}")
    return tp, False


def _decode(tp: Any, value: Any, path: str, schema: int | None) -> Any:
    inner, nullable = optional_part(tp)
    if value is None and nullable:
        return None
    origin = get_origin(inner)
    if origin is tuple:
        if not isinstance(value, list):
            raise _wrong(path, tp, value)
        args = get_args(inner)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: a list of one type
            return tuple(_decode(args[0], v, f"{path}[{i}]", schema) for i, v in enumerate(value))
        if len(value) != len(args):  # tuple[X, Y]: a pair, one type per place
            raise ReportShapeError(f"{path}: expected a list of {len(args)}, found {len(value)} item(s)")
        return tuple(_decode(a, v, f"{path}[{i}]", schema) for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise _wrong(path, tp, value)
        item = get_args(inner)[1]
        return {k: _decode(item, v, f"{path}.{k}" if path else k, schema) for k, v in value.items()}
    if dataclasses.is_dataclass(inner):
        if not isinstance(value, dict):
            raise _wrong(path, tp, value)
        return _decode_fields(typing.cast(type, inner), value, path, schema)
    if inner is Any:
        return value
    if origin is Literal:  # one of the listed values, of their type (True is not 1)
        if not any(type(value) is type(a) and value == a for a in get_args(inner)):
            choices = ", ".join(repr(a) for a in get_args(inner))
            raise ReportShapeError(f"{path or 'the report'}: expected one of {choices}, found {_show(value)}")
        return value
    if inner is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _wrong(path, tp, value)
        return float(value)
    if isinstance(value, bool) != (inner is bool) or not isinstance(value, inner):
        raise _wrong(path, tp, value)
    return value


def _decode_fields(cls: type, value: dict[str, Any], path: str, schema: int | None) -> Any:
    types_of = hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        if f.name in value:
            kwargs[f.name] = _decode(types_of[f.name], value[f.name], where, schema)
            continue
        since = f.metadata.get(SINCE)
        if schema is None or since is None or schema >= since:
            raise ReportShapeError(f"{where}: missing")
        kwargs[f.name] = absent_value(f, types_of[f.name])
    return cls(**kwargs)


def absent_value(f: dataclasses.Field[Any], tp: Any) -> Any:
    """What a report of a schema before the field's ``since`` reads for it: its ``absent`` value,
    else null where ``tp`` admits it, else empty for a list or an object."""
    if f.metadata.get(ABSENT, dataclasses.MISSING) is not dataclasses.MISSING:
        return f.metadata[ABSENT]
    inner, nullable = optional_part(tp)
    if nullable:
        return None
    empty = {tuple: (), dict: {}, Mapping: {}}.get(get_origin(inner), dataclasses.MISSING)
    if empty is dataclasses.MISSING:
        raise TypeError(f"{f.name} ({type_name(tp)}) has a since but no absent value")
    return empty


def type_name(tp: Any) -> str:
    """How docs/report-format.md and the errors name a field's type: ``int``, ``[string]``,
    ``object or null``."""
    inner, nullable = optional_part(tp)
    origin = get_origin(inner)
    if origin is tuple:
        args = get_args(inner)
        fixed = not (len(args) == 2 and args[1] is Ellipsis)
        name = f"[{', '.join(type_name(a) for a in args)}]" if fixed else f"[{type_name(args[0])}]"
    elif origin in (dict, Mapping) or dataclasses.is_dataclass(inner):
        name = "object"
    elif origin is Literal:
        name = " or ".join(f"`{a}`" for a in get_args(inner))
    else:
        name = {int: "int", float: "number", str: "string", bool: "bool"}.get(inner, "any")
    return f"{name} or null" if nullable else name


def _wrong(path: str, tp: Any, value: Any) -> ReportShapeError:
    inner, nullable = optional_part(tp)
    name = "a list" if get_origin(inner) is tuple else "an object" if type_name(inner) == "object" else type_name(inner)
    return ReportShapeError(
        f"{path or 'the report'}: expected {name}{' or null' if nullable else ''}, found {_show(value)}"
    )


def _show(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else text[:40] + "..."
