"""Strict, typed configuration: dataclasses <-> plain dicts / YAML, with helpful errors.

Every config in the toolkit is a dataclass. `from_dict` builds one from a plain dict and refuses
unknown keys (with a "did you mean" suggestion), wrong types and values outside a `Literal`.
Polymorphic sections (a layer's `kind`) are dataclasses derived from a `Tagged` base whose
subclasses register under a name; the dict's `kind` key picks the subclass.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
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
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 5e-5 and 1e3 (no dot) as strings
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{where}: cannot read {value!r} as {_type_name(tp)}")


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
        raise ConfigError(f"{path}: invalid YAML ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def config_hash(data: Any) -> str:
    """Stable short hash of a plain-container config."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
