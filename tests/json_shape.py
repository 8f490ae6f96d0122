"""Hold a JSON document against its declared TypedDict: every required key present,
no key the declaration lacks, and each value of the declared type (recursively
through TypedDicts, ``list[...]``, ``dict[str, ...]``, unions, ``Literal`` and
:data:`~spherecal.coordinator.summary_schema.JsonValue`).

mypy checks the keys our code writes and reads; this checks what a real run
actually wrote, so a writer that adds, drops or retypes a key without the
declaration (or a ``**spread`` that mypy cannot see into) fails a test.
"""

from __future__ import annotations

import collections.abc
import sys
import types
import typing
from typing import Any, ForwardRef, Literal, Union, get_args, get_origin, get_type_hints

__all__ = ["shape_errors"]


def _is_json(value: object) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _is_typeddict(hint: object) -> bool:
    return isinstance(hint, type) and typing.is_typeddict(hint)


def shape_errors(value: object, hint: Any, where: str = "$") -> list[str]:
    """Every way ``value`` departs from ``hint``, one line each (empty: it conforms)."""
    if isinstance(hint, ForwardRef):  # a recursive alias: only JsonValue is one
        if hint.__forward_arg__ != "JsonValue":
            raise TypeError(f"unresolved annotation {hint.__forward_arg__} at {where}")
        return [] if _is_json(value) else [f"{where}: not JSON: {type(value).__name__}"]
    if hint is Any or hint is object:
        return [] if _is_json(value) else [f"{where}: not JSON: {type(value).__name__}"]
    if hint is None or hint is type(None):
        return [] if value is None else [f"{where}: {value!r} is not null"]
    if _is_typeddict(hint):
        return _typeddict_errors(value, hint, where)
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        options = get_args(hint)
        failures = [shape_errors(value, option, where) for option in options]
        if any(not f for f in failures):
            return []
        return [f"{where}: {_brief(value)} matches none of {_name(hint)}: " + "; ".join(
            f[0] for f in failures if f
        )]
    if origin is Literal:
        return [] if value in get_args(hint) else [f"{where}: {value!r} not in {get_args(hint)}"]
    if origin is list or origin is collections.abc.Sequence:
        if not isinstance(value, list):
            return [f"{where}: {_brief(value)} is not a list"]
        (item,) = get_args(hint)
        return [e for k, v in enumerate(value) for e in shape_errors(v, item, f"{where}[{k}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {_brief(value)} is not an object"]
        _, item = get_args(hint)
        return [e for k, v in value.items() for e in shape_errors(v, item, f"{where}.{k}")]
    if hint is float:  # JSON has one number type: an integral float is written as 1.0 or 1
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint in (str, bool):
        ok = isinstance(value, hint)
    else:
        raise TypeError(f"no rule for {hint!r} at {where}")
    return [] if ok else [f"{where}: {_brief(value)} is not {hint.__name__}"]


def _typeddict_errors(value: object, shape: type, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: {_brief(value)} is not an object ({shape.__name__})"]
    module = sys.modules[shape.__module__]
    # with postponed annotations Python 3.11 cannot see ``NotRequired`` when it
    # builds ``__required_keys__``: read it from the evaluated hints instead
    hints = get_type_hints(shape, globalns=vars(module), include_extras=True)
    required = {k for k, h in hints.items() if get_origin(h) is not typing.NotRequired}
    name = shape.__name__
    errors = [f"{where}.{k}: missing ({name} requires it)" for k in sorted(required - value.keys())]
    errors += [f"{where}.{k}: not declared in {name}" for k in sorted(value.keys() - hints.keys())]
    for key in sorted(value.keys() & hints.keys()):
        errors += shape_errors(value[key], _strip(hints[key]), f"{where}.{key}")
    return errors


def _strip(hint: Any) -> Any:
    """``NotRequired[X]`` / ``Required[X]`` → ``X`` (presence is checked by key)."""
    while get_origin(hint) in (typing.NotRequired, typing.Required):
        (hint,) = get_args(hint)
    return hint


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or repr(hint)


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
