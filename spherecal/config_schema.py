"""The TOML shape of the settings dataclasses — read, written and documented from one source.

Every key of a coordinator or participant config file is a field of a frozen
dataclass (``spherecal.coordinator.settings``, ``spherecal.participant.settings``,
``spherecal.spherefed.privacy.settings``): its TOML type comes from the field's annotation, its
default from the field's default, its meaning from the field's docstring. A
:class:`Table` only says how a dataclass maps onto one TOML table where the two
differ (a renamed key, a nested dataclass flattened under a prefix, bytes written as
MiB, a field that is not in the file). From that one description:

- :func:`read_table` parses a table strictly (``spherecal.config``): unknown keys and
  wrong types are one-line errors naming file, table and key;
- :func:`write_table` turns settings back into a table (``spherecal simulate`` writes
  its configs this way, serialised by ``tomli-w``);
- :func:`markdown_table` renders the key reference of ``docs/deployment.md``
  (``python -m spherecal.config_docs``; a test keeps the committed page current).
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, Union, cast

__all__ = [
    "ConfigError",
    "Extra",
    "Key",
    "Section",
    "Table",
    "did_you_mean",
    "field_docs",
    "markdown_table",
    "read_table",
    "table_keys",
    "write_table",
]

T = TypeVar("T")
MIB = 1 << 20


class ConfigError(ValueError):
    """A configuration file that cannot be used as written."""


# ----------------------------------------------------------------------------- strict access


class Section:
    """Typed, strict access to one TOML table (every error names file, table and key)."""

    def __init__(self, source: str, name: str, table: Any, base: Path) -> None:
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: [{name}] must be a table")
        self.source, self.name, self.base = source, name, base
        self._table = dict(table)
        self._used: set[str] = set()

    def where(self, key: str) -> str:
        return f"{self.source}: [{self.name}] {key}"

    def has(self, key: str) -> bool:
        return key in self._table

    def get(self, key: str, kind: type[T] | tuple[type, ...], default: T) -> T:
        self._used.add(key)
        if key not in self._table:
            return default
        value = self._table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if bool not in kinds and isinstance(value, bool):
            raise ConfigError(f"{self.where(key)} must be {_kind_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise ConfigError(
                f"{self.where(key)} must be {_kind_names(kinds)}, got {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{self.where(key)} must be finite")
        return cast(T, value)

    def optional(self, key: str, kind: type[T]) -> T | None:
        return cast("T | None", self.get(key, (kind,), None))

    def path(self, key: str, default: Path | None = None) -> Path | None:
        """A path; relative paths are resolved against the config file's directory."""
        text = self.optional(key, str)
        if text is None:
            return default
        p = Path(text).expanduser()
        return p if p.is_absolute() else (self.base / p)

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.get(key, list, list(default))
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.where(key)} must be a list of strings")
        return tuple(value)

    def finish(self) -> None:
        """Refuse every key nobody read: a typo must not be silently ignored."""
        unknown = sorted(set(self._table) - self._used)
        if unknown:
            raise ConfigError(
                f"{self.source}: [{self.name}] unknown key(s) {unknown}"
                f"{did_you_mean(unknown, self._used)}; see docs/deployment.md"
            )


def did_you_mean(unknown: Iterable[str], known: Iterable[str]) -> str:
    """`` (did you mean 'coordinator'?)`` for the unknown names with a close known one
    (case and ``-``/``_`` ignored), else ``""``: a typo's message names the fix."""
    import difflib

    by_norm = {k.lower().replace("-", "_"): k for k in known}
    guesses = []
    for name in unknown:
        close = difflib.get_close_matches(name.lower().replace("-", "_"), list(by_norm), n=1)
        if close:
            guesses.append(f"{name!r}: did you mean {by_norm[close[0]]!r}?")
    return f" ({'; '.join(guesses)})" if guesses else ""


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true/false",
        list: "a list",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


# ----------------------------------------------------------------------------- the mapping


@dataclass(frozen=True)
class Codec:
    """A field type TOML has no word for, stored as a list of strings."""

    parse: Callable[[str], Any]
    show: Callable[[Any], str] = str


@dataclass(frozen=True)
class Extra:
    """A key of the file that is not a field of the table's dataclass."""

    key: str
    kind: type
    default: Any
    help: str


@dataclass(frozen=True)
class Table:
    """How one dataclass maps onto one TOML table."""

    name: str
    cls: type
    rename: Mapping[str, str] = field(default_factory=dict)
    """field → TOML key."""
    skip: frozenset[str] = frozenset()
    """Fields that live elsewhere (another table, or nowhere in the file)."""
    flatten: Mapping[str, str] = field(default_factory=dict)
    """Nested dataclass field → key prefix (``ccvr`` → ``ccvr_lr`` …)."""
    mebibytes: frozenset[str] = frozenset()
    """Byte counts written as (fractional) MiB under the renamed key."""
    paths: frozenset[str] = frozenset()
    """``str`` fields that are paths (resolved against the config file's directory)."""
    codecs: Mapping[str, Codec] = field(default_factory=dict)
    hidden: frozenset[str] = frozenset()
    """Keys that are read but left out of the docs (test hooks)."""
    help: Mapping[str, str] = field(default_factory=dict)
    """TOML key → meaning, where the field's docstring is missing or not for this file."""
    default_text: Mapping[str, str] = field(default_factory=dict)
    """TOML key → how the docs state a default computed at read time."""
    extras: tuple[Extra, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class Key:
    """One key of a table, with what the docs say about it."""

    key: str
    path: tuple[str, ...]  # field names from the table's dataclass down
    kind: Any  # the (optional-stripped) annotation
    optional: bool
    default: Any
    owner: type  # the dataclass declaring the field (its docstring is the key's help)
    table: Table

    @property
    def help(self) -> str:
        """What the docs say of the key: the table's own text for it, else the
        docstring under its field. Looked up only when asked — the docs tables and the
        tests ask; reading a config never does, and finding a class's source parses
        its whole module (about 0.1 s of processor per process for the coordinator's
        tables, paid by every coordinator and site start before this was lazy)."""
        return self.table.help.get(self.key, field_docs(self.owner).get(self.path[-1], ""))


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstrings written under the fields of a dataclass (``x: int = 0`` then
    ``\"\"\"…\"\"\"``), whitespace collapsed — the meaning column of the docs."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = cast(ast.ClassDef, ast.parse(source).body[0]).body
    out: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def _unwrap_optional(kind: Any) -> tuple[Any, bool]:
    if typing.get_origin(kind) in (Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(kind)) == 2:
            return args[0], True
    return kind, False


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def table_keys(table: Table) -> list[Key]:
    """Every key of ``table``, in field order (flattened nests in place)."""
    out: list[Key] = []

    def walk(cls: type, prefix: str, path: tuple[str, ...], defaults: Any) -> None:
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if not path and f.name in table.skip:
                continue
            kind, optional = _unwrap_optional(hints[f.name])
            default = getattr(defaults, f.name) if defaults is not None else _default(f)
            if not path and f.name in table.flatten:
                walk(kind, table.flatten[f.name], (f.name,), default)
                continue
            name = prefix + table.rename.get(f.name, f.name) if not path else prefix + f.name
            out.append(Key(name, (*path, f.name), kind, optional, default, cls, table))

    walk(table.cls, "", (), None)
    return out


# ----------------------------------------------------------------------------- reading


def _read_value(section: Section, key: Key, default: Any) -> Any:
    kind, name, table = key.kind, key.key, key.table
    field_name = key.path[-1]
    if field_name in table.mebibytes:
        mib = section.get(name, float, default / MIB if default is not None else None)
        return None if mib is None else int(mib * MIB)
    if kind is Path or field_name in table.paths:
        path = section.path(name, default if isinstance(default, Path) else None)
        if kind is Path:
            return path
        return str(path) if section.has(name) else default
    if field_name in table.codecs:
        codec = table.codecs[field_name]
        texts = section.strings(name, ())
        if not section.has(name):
            return default
        try:
            return tuple(codec.parse(t) for t in texts)
        except ValueError as exc:
            raise ConfigError(f"{section.where(name)}: {exc}") from None
    origin = typing.get_origin(kind)
    if origin is tuple:
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis and args[0] is str:
            return section.strings(name, default)
        if len(args) == 2 and args[1] is Ellipsis and args[0] is float:
            value = section.get(name, list, list(default) if default is not None else None)
            if value is None:
                return None
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                raise ConfigError(f"{section.where(name)} must be a list of numbers")
            return tuple(float(v) for v in value)
        if all(a is int for a in args):
            value = section.get(name, list, list(default) if default is not None else None)
            if value is None:
                return None
            if len(value) != len(args) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
            ):
                raise ConfigError(
                    f"{section.where(name)} must be a list of {len(args)} positive integers"
                )
            return tuple(int(v) for v in value)
        raise TypeError(f"no TOML reading for {kind!r}")  # pragma: no cover - schema bug
    if kind in (bool, int, float, str):
        if key.optional and default is None:
            return section.optional(name, kind)
        return section.get(name, kind, default)
    raise TypeError(f"no TOML reading for {kind!r}")  # pragma: no cover - schema bug


def read_table(
    section: Section, table: Table, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The constructor arguments of ``table.cls`` (nested dataclasses built) from
    ``section``; ``defaults`` overrides field defaults computed from other keys (by
    TOML key). Extras come back under their key."""
    defaults = defaults or {}
    kwargs: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key in table_keys(table):
        value = _read_value(section, key, defaults.get(key.key, key.default))
        if len(key.path) == 1:
            kwargs[key.path[0]] = value
        else:
            nested.setdefault(key.path[0], {})[key.path[1]] = value
    hints = typing.get_type_hints(table.cls)
    for name, values in nested.items():
        kwargs[name] = hints[name](**values)
    for extra in table.extras:
        kwargs[extra.key] = section.get(
            extra.key, extra.kind, defaults.get(extra.key, extra.default)
        )
    return kwargs


# ----------------------------------------------------------------------------- writing


def _toml_value(key: Key, value: Any) -> Any:
    if value is None:
        return None
    field_name = key.path[-1]
    if field_name in key.table.mebibytes:
        return value / MIB
    if field_name in key.table.codecs:
        return [key.table.codecs[field_name].show(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def write_table(
    table: Table, settings: Any, extras: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``settings`` (an instance of ``table.cls``) as one TOML table (``None`` left out)."""
    out: dict[str, Any] = {}
    for key in table_keys(table):
        value: Any = settings
        for name in key.path:
            value = getattr(value, name)
        shown = _toml_value(key, value)
        if shown is not None:
            out[key.key] = shown
    for name, value in (extras or {}).items():
        if name not in {e.key for e in table.extras}:
            raise KeyError(f"[{table.name}] has no extra key {name!r}")
        if value is not None:
            out[name] = value
    return out


# ----------------------------------------------------------------------------- docs


def _type_text(key: Key) -> str:
    kind, field_name = key.kind, key.path[-1]
    if field_name in key.table.mebibytes:
        text = "number (MiB)"
    elif field_name in key.table.codecs:
        text = "list of strings"
    elif kind is Path or field_name in key.table.paths:
        text = "path"
    elif typing.get_origin(kind) is tuple:
        args = typing.get_args(kind)
        if args[-1] is Ellipsis:
            text = "list of numbers" if args[0] is float else "list of strings"
        else:
            text = f"[{', '.join('int' for _ in args)}]"
    else:
        text = {bool: "boolean", int: "integer", float: "number", str: "string"}[kind]
    return text


def _default_text(key: Key) -> str:
    if key.key in key.table.default_text:
        return key.table.default_text[key.key]
    value = key.default
    if value is MISSING:
        return "**required**"
    if value is None:
        return "–"
    if key.path[-1] in key.table.mebibytes:
        value = value / MIB
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        short = f"{value:g}"  # exact where it reads back as the same float, else repr
        return f"`{short if float(short) == value else repr(value)}`"
    if isinstance(value, str | Path):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "`[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]`"
    return f"`{value}`"


def markdown_table(tables: tuple[Table, ...]) -> str:
    """The key reference of one config file (one header row per TOML table)."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for table in tables:
        lines.append(f"| **`[{table.name}]`** | | | {table.note} |")
        rows = [(k.key, _type_text(k), _default_text(k), k.help) for k in table_keys(table)]
        rows += [(e.key, _type_text_extra(e), _extra_default(e), e.help) for e in table.extras]
        for name, kind, default, meaning in rows:
            if name in table.hidden:
                continue
            cell = re.sub(r"``(.+?)``", r"`\1`", meaning).replace("|", "\\|")
            lines.append(f"| `{name}` | {kind} | {default} | {cell} |")
    return "\n".join(lines) + "\n"


def _type_text_extra(extra: Extra) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string"}[extra.kind]


def _extra_default(extra: Extra) -> str:
    return "–" if extra.default is None else f"`{extra.default}`"
