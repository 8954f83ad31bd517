"""Strict, typed configuration: dataclasses <-> plain dicts / YAML, with helpful errors.

Every config in the toolkit is a dataclass. `from_dict` builds one from a plain dict and refuses
unknown keys (with a "did you mean" suggestion), wrong types and values outside a `Literal`.
Polymorphic sections (a layer's `kind`) are dataclasses derived from a `Tagged` base whose
subclasses register under a name; the dict's `kind` key picks the subclass.

Numbers: every float is finite (YAML's .nan and .inf are refused), and a field declared with
`bounded(default, ge=..., gt=..., le=..., lt=...)` keeps its value in that range. `check_fields(obj)` checks
an object's every field so (a config's `validate` starts with it, so that an object made by `replace` or by
hand is held to the rules `from_dict` applies); `check_value` checks one value for one field before any
object exists (a command's option, an API argument, a request field).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import numbers
import re
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union

import yaml

from multibranch.errors import ConfigError

T = TypeVar("T")
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # 5e-5: a string to YAML 1.1, a number here


class Tagged:
    """Base for polymorphic config sections selected by a `kind` key.

    Subclass once per family (e.g. `LayerConfig`), then decorate each variant with
    `@LayerConfig.register("name")`. The variant dataclass must have a `kind: str` field.
    """

    _variants: ClassVar[dict[str, type]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if Tagged in cls.__bases__:
            cls._variants = {}

    @classmethod
    def register(cls, name: str):
        def wrap(variant: type[T]) -> type[T]:
            if name in cls._variants:
                raise ValueError(f"{cls.__name__} kind {name!r} registered twice")
            cls._variants[name] = variant
            return variant

        return wrap

    @classmethod
    def variant(cls, name: str, where: str = "") -> type:
        if name not in cls._variants:
            raise ConfigError(
                f"{where or cls.__name__}: unknown kind {name!r}{_suggest(name, cls._variants)}; "
                f"known kinds: {', '.join(sorted(cls._variants))}"
            )
        return cls._variants[name]


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Convert a plain value to type `tp`, raising ConfigError with the dotted path on mismatch."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of {args}")
    if origin is Literal:
        if isinstance(value, bool) and value not in args and {"on", "off"} <= set(args):
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}{_suggest(value, args)}")
        return value
    if origin in (list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_type = args[0] if args else Any
        items = [_convert(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return {k: _convert(v, args[1], f"{where}.{k}") for k, v in value.items()} if args else dict(value)
    if isinstance(tp, type) and issubclass(tp, Tagged):
        if dataclasses.is_dataclass(value) and isinstance(value, tp):
            return value
        if not isinstance(value, dict) or "kind" not in value:
            raise ConfigError(f"{where}: expected a mapping with a 'kind' key, got {value!r}")
        return from_dict(tp.variant(value["kind"], where), value, where)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if hasattr(tp, "coerce"):
            value = tp.coerce(value)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:  # numbers.Integral: NumPy's integers too
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return int(value)
    if tp is float:  # numbers.Real: NumPy's floats and integers too
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 5e-5 and 1e3 (no dot) as strings
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{where}: cannot read {value!r} as {_type_name(tp)}")


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The range of a numeric config field: each end optional, closed (ge, le) or open (gt, lt); `note` says
    what particular values mean ("0: no limit") and ends the message of a value outside the range."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    note: str = ""

    def holds(self, value: float) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def describe(self) -> str:
        """">= 1", "> 0", "in (0, 1]", ..."""
        low, start = (self.ge, "[") if self.ge is not None else (self.gt, "(")
        high, end = (self.le, "]") if self.le is not None else (self.lt, ")")
        if low is not None and high is not None:
            return f"in {start}{_number(low)}, {_number(high)}{end}"
        if low is not None:
            return f"{'>=' if self.ge is not None else '>'} {_number(low)}"
        return f"{'<=' if self.le is not None else '<'} {_number(high)}"


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


BOUNDS = "multibranch.bounds"  # the field metadata key of a `bounded` field


def bounded(default: Any = dataclasses.MISSING, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, note: str = "") -> Any:
    """A dataclass field whose value (unless None) must lie in the given range: `beam: int = bounded(5, ge=1)`."""
    return dataclasses.field(default=default, metadata={BOUNDS: Bounds(ge, gt, le, lt, note)})


@functools.cache
def _fields(cls: type) -> dict[str, tuple[Any, Bounds | None]]:
    """Each init field of dataclass `cls`: (its type, its bounds)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata.get(BOUNDS)) for f in dataclasses.fields(cls) if f.init}


def check_value(cls: type, name: str, value: Any, option: str | None = None) -> Any:
    """`value` as field `name` of config dataclass `cls` holds it: of the field's type (read as `from_dict`
    reads it: 3.0 for an int is 3), finite, and within the field's bounds. ConfigError otherwise, naming the
    field (`name=value must be >= 1`) or, given, the `option` it came from (`--beam 0: must be >= 1`)."""
    fields = _fields(cls)
    if name not in fields:
        raise ConfigError(f"{option or name}: unknown field of {cls.__name__}{_suggest(name, fields)}")
    tp, bounds = fields[name]
    converted = _convert(value, tp, option or name)
    if bounds is not None and isinstance(converted, (int, float)) and not isinstance(converted, bool) \
            and not bounds.holds(converted):
        subject = f"{option} {converted}:" if option else f"{name}={converted}"
        raise ConfigError(f"{subject} must be {bounds.describe()}{f' ({bounds.note})' if bounds.note else ''}")
    return converted


def field_at(cls: type, path: str) -> tuple[type, str]:
    """The dataclass and field name that a dotted key of config `cls` ends in: ("train.lr.lr" of ExperimentConfig
    -> (LRConfig, "lr")); ConfigError for a key that is not there."""
    *parents, name = path.split(".")
    for part in parents:
        fields = _fields(cls)
        if part not in fields:
            raise ConfigError(f"{path}: unknown field of {cls.__name__}{_suggest(part, fields)}")
        cls = next(t for t in (fields[part][0], *typing.get_args(fields[part][0])) if dataclasses.is_dataclass(t))
    return cls, name


def check_fields(obj: Any) -> None:
    """Every field of config dataclass `obj` through `check_value` (in place: a whole float read for an int
    field becomes the int); ConfigError naming the first that fails."""
    for name in _fields(type(obj)):
        value = getattr(obj, name)
        converted = check_value(type(obj), name, value)
        if converted is not value:
            object.__setattr__(obj, name, converted)  # frozen dataclasses too


def from_dict(cls: type[T], data: dict[str, Any] | None, where: str = "") -> T:
    """Build dataclass `cls` from `data`, strictly: unknown keys and bad types raise ConfigError."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        raise ConfigError(
            f"{where + '.' if where else ''}{key}: unknown key for {cls.__name__}{_suggest(key, fields)}; "
            f"allowed: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _convert(value, hints[name], f"{where}.{name}" if where else name)
    try:
        obj = cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise ConfigError(f"{where or cls.__name__}: {err}") from None
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError as err:
            raise ConfigError(f"{where + ': ' if where else ''}{err}") from None
    return obj


def to_dict(obj: Any) -> Any:
    """Plain-container form of a config (dataclasses -> dicts, tuples -> lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge `update` into a copy of `base` (a `kind` change replaces the section)."""
    out = dict(base)
    for key, value in update.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict) and old.get("kind", value.get("kind")) == value.get(
            "kind", old.get("kind")
        ):
            out[key] = deep_merge(old, value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> dict[str, Any]:
    """`model.encoder.branches=3` -> {"model": {"encoder": {"branches": 3}}} (value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    path, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({err})") from None
    for key in reversed(path.strip().split(".")):
        if not key:
            raise ConfigError(f"override {text!r}: empty key in {path!r}")
        value = {key: value}
    return value


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)  # where PyYAML stopped (0-based), else no place
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path}{where}: invalid YAML ({what})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def config_hash(data: Any) -> str:
    """Stable short hash of a plain-container config."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
