"""Typed values of flat frozen dataclasses, to and from flags and JSON.

The job spec and the replica specs derived from it are flat dataclasses whose fields are
``str``, ``int``, ``float``, ``bool``, a string enum, ``tuple[str, ...]`` or one of those or
``None``. This module is the only place that turns such a value into text and back, so a value
that leaves one process as ``--minibatch_size=64`` or ``"minibatch_size": 64`` arrives as the
same ``int`` in the next one. Standard library only (the light client imports it).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import json
import types
import typing
from typing import Any, Sequence

_TRUE = frozenset({"true", "yes", "t", "y", "1", "on"})
_FALSE = frozenset({"false", "no", "f", "n", "0", "off"})


class SpecError(ValueError):
    """A bad value; the message is one line naming the field and the fix."""


def parse_bool(text: str | bool) -> bool:
    """``true/yes/t/y/1/on`` and ``false/no/f/n/0/off`` in any case; anything else is an error (a
    typo such as ``--use_async=ture`` must not silently mean false)."""
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean; use true or false")


@dataclasses.dataclass(frozen=True)
class FieldType:
    """The value type of one field, unwrapped from ``X | None`` and ``tuple[X, ...]``."""

    base: type
    optional: bool = False
    sequence: bool = False

    @property
    def name(self) -> str:
        if issubclass(self.base, enum.Enum):
            return "one of " + ", ".join(m.value for m in self.base)
        word = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        return word.get(self.base, self.base.__name__)


@functools.cache
def field_types(cls: type) -> dict[str, FieldType]:
    hints = typing.get_type_hints(cls)
    return {f.name: _field_type(hints[f.name]) for f in dataclasses.fields(cls)}


def _field_type(hint: Any) -> FieldType:
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if not isinstance(None, a)]
        if len(args) != 1:
            raise TypeError(f"unsupported field type {hint!r}")
        hint, optional = args[0], True
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        return FieldType(item, optional, sequence=True)
    return FieldType(hint, optional)


def _scalar_from_text(text: str, ftype: FieldType) -> Any:
    base = ftype.base
    if base is bool:
        return parse_bool(text)
    if base is int:
        return int(text.strip())
    if base is float:
        return float(text.strip())
    if issubclass(base, enum.Enum):
        return base(text)
    return text


def from_text(name: str, text: str, ftype: FieldType) -> Any:
    """A flag's text -> the field's value (``--ps_addrs=a:1,b:2`` -> ``("a:1", "b:2")``)."""
    try:
        if ftype.optional and text == "":
            return None
        if ftype.sequence:
            return tuple(_scalar_from_text(t, ftype) for t in text.split(",") if t.strip())
        return _scalar_from_text(text, ftype)
    except ValueError:
        raise SpecError(f"--{name}: expected {ftype.name}, got {text!r}") from None


def to_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(to_text(v) for v in value)
    return str(value)


def coerce(name: str, value: Any, ftype: FieldType) -> Any:
    """A Python/JSON value -> the field's value, checking its type (``num_workers="2"`` from a
    typed caller is an error, not a silent conversion; JSON lists become tuples)."""
    if value is None:
        if ftype.optional:
            return None
        raise SpecError(f"{name} must be {ftype.name}, got None")
    if ftype.sequence:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise SpecError(f"{name} must be a list, got {value!r}")
        return tuple(coerce(name, v, FieldType(ftype.base)) for v in value)
    base = ftype.base
    if issubclass(base, enum.Enum):
        try:
            return base(value)
        except ValueError:
            raise SpecError(f"{name} {value!r} is invalid; use {ftype.name}") from None
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base in (int, float) and isinstance(value, bool):
        raise SpecError(f"{name} must be {ftype.name}, got bool {value!r}")
    if not isinstance(value, base):
        raise SpecError(f"{name} must be {ftype.name}, got {type(value).__name__} {value!r}")
    return value


def check_types(spec: Any) -> None:
    """Raise :class:`SpecError` unless every field of the frozen ``spec`` has its declared
    type; enum values given as strings and JSON lists are converted in place."""
    for name, ftype in field_types(type(spec)).items():
        value = getattr(spec, name)
        fixed = coerce(name, value, ftype)
        if fixed is not value:
            object.__setattr__(spec, name, fixed)


def to_dict(spec: Any, only_changed: bool = False) -> dict[str, Any]:
    """JSON-ready values; ``only_changed`` leaves out fields equal to their defaults."""
    result = {}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if only_changed and f.default is not dataclasses.MISSING and value == f.default:
            continue
        if isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, tuple):
            value = [v.value if isinstance(v, enum.Enum) else v for v in value]
        result[f.name] = value
    return result


def from_dict(cls: type, data: dict[str, Any], what: str = "spec") -> Any:
    if not isinstance(data, dict):
        raise SpecError(f"{what} must be a JSON object, got {type(data).__name__}")
    ftypes = field_types(cls)
    unknown = sorted(set(data) - set(ftypes))
    if unknown:
        raise SpecError(f"{what}: unknown field(s) {', '.join(unknown)}")
    return cls(**{k: coerce(k, v, ftypes[k]) for k, v in data.items()})


def to_json(spec: Any, only_changed: bool = False, indent: int | None = None) -> str:
    separators = (",", ": ") if indent is not None else (",", ":")
    return json.dumps(
        to_dict(spec, only_changed), sort_keys=True, indent=indent, separators=separators
    )


def from_json(cls: type, text: str, what: str = "spec") -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{what} is not valid JSON ({e.msg} at {e.pos})") from None
    return from_dict(cls, data, what)


def to_argv(spec: Any) -> list[str]:
    """Every field as ``--name=value`` (one argv element each: no shell quoting involved, and
    values starting with '-' or holding spaces survive)."""
    return [f"--{f.name}={to_text(getattr(spec, f.name))}" for f in dataclasses.fields(spec)]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise SpecError(f"{self.prog}: {message}")


def from_argv(cls: type, argv: Sequence[str], prog: str) -> Any:
    """Parse what :func:`to_argv` wrote. Unknown flags are errors: a replica never guesses."""
    parser = _Parser(prog=prog, allow_abbrev=False, add_help=False)
    ftypes = field_types(cls)
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        # A bool flag alone means true (``--use_async``), as on the job's command line.
        alone = {"nargs": "?", "const": "true"} if ftypes[f.name].base is bool else {}
        parser.add_argument(f"--{f.name}", required=required, default=argparse.SUPPRESS, **alone)
    namespace = parser.parse_args(list(argv))
    values = {k: from_text(k, v, ftypes[k]) for k, v in vars(namespace).items()}
    return cls(**values)
