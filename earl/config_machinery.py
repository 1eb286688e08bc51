"""One configuration machinery for every command: files, `--set`, key resolution, type coercion.

A configuration is a tree of frozen dataclasses (`earl.runtime.run_config.RunConfig`,
`earl.sim.scenario.Scenario`, ...). Its keys are derived from the tree: a nested dataclass
field is a section (`trainer.lr`), a plain field of the root is a top-level key (`steps`).
A tree may rename keys (the scenario's `cluster.nodes` is its `nodes` attribute).

Sources and what they accept:
- a TOML / YAML / JSON file (read safely, no code execution): sections and top-level keys,
  exactly as named; a typo is an error naming the file, the key and the close matches;
- `--set key=value` (`parse_sets`): the dotted key, or a leaf name that is unique in the tree.

Values are coerced to the field's type (bool, int, float, str, tuples, `X | None`); a value that
does not fit is a ValueError naming the key, the value, where it came from and the expected type.
Pure Python: no torch or simpy import.

    python -c "from earl.config_machinery import parse_sets; print(parse_sets(['trainer.lr=3e-4']))"
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, NamedTuple

import tomllib

SUFFIXES = (".toml", ".yaml", ".yml", ".json")
TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")


# ---- files and --set ----------------------------------------------------------------------
def read_mapping(path: str | Path, what: str = "config file", missing_hint: str = "") -> dict:
    """The file's top-level mapping. ValueError (one line, naming the file) when the file is
    missing, has an unknown suffix, does not parse, or is not a mapping."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{what} {str(p)!r} does not exist{missing_hint}")
    if p.suffix not in SUFFIXES:
        raise ValueError(f"{what} {p.name!r}: unknown suffix {p.suffix!r}; use {', '.join(SUFFIXES)}")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {str(p)!r} cannot be read ({e})") from None
    if p.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{p}: invalid TOML ({e})") from None
    else:  # YAML is a superset of JSON
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{p}: invalid YAML ({str(e).splitlines()[0]})") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(f"{p}: a {what} must be a mapping of sections to keys")
    return data


def parse_sets(items: list[str] | None, *, flag: str = "--set") -> dict[str, str]:
    """`key=value` items into a dict (values stay strings; `resolve_values` converts them).
    A later item wins over an earlier one with the same key."""
    out: dict[str, str] = {}
    for item in items or []:
        key, eq, value = str(item).partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{flag} expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def flatten(data: dict, *, where: str) -> dict[str, Any]:
    """A nested mapping (a file's sections) as dotted keys -> values."""
    out: dict[str, Any] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if not isinstance(k, str):
                raise ValueError(f"key {k!r} in {where}: keys must be strings")
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v

    walk(data, "")
    return out


# ---- the keys of a dataclass tree ---------------------------------------------------------
class Key(NamedTuple):
    path: tuple[str, ...]  # attribute path from the root dataclass, e.g. ("trainer", "lr")
    type: Any  # the field's resolved type annotation


class Keys(dict):
    """Public dotted key -> `Key`, for one dataclass tree. `what` names the tree in errors
    ("unknown scenario key ...")."""

    def __init__(self, entries: dict[str, Key], what: str = "config"):
        super().__init__(entries)
        self.what = what

    @functools.cached_property
    def sections(self) -> list[str]:
        return sorted({k.rsplit(".", 1)[0] for k in self if "." in k})


def _check_type(typ: Any, name: str) -> None:
    """Fail at import time on a field type the coercion does not handle."""
    if typ in (bool, int, float, str):
        return
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is tuple and args:
        for a in (args[:1] if args[-1] is Ellipsis else args):
            _check_type(a, name)
        return
    if _optional_inner(typ) is not None:
        _check_type(_optional_inner(typ), name)
        return
    raise TypeError(f"config field {name!r}: unsupported type {typ!r}")


def _optional_inner(typ: Any) -> Any:
    """X for `X | None` / Optional[X], else None."""
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(typ)) == 2:
            return args[0]
    return None


@functools.cache
def _derived_keys(cls: type) -> dict[str, Key]:
    out: dict[str, Key] = {}

    def walk(c: type, path: tuple[str, ...]) -> None:
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            if not f.init:
                continue
            typ = hints[f.name]
            if dataclasses.is_dataclass(typ):
                walk(typ, path + (f.name,))
            else:
                _check_type(typ, ".".join(path + (f.name,)))
                out[".".join(path + (f.name,))] = Key(path + (f.name,), typ)

    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    walk(cls, ())
    return out


def keys_of(cls: type, *, rename: dict[str, str] | None = None, what: str = "config") -> Keys:
    """The keys of the dataclass tree rooted at `cls`: `section.field` for nested dataclass
    fields, `field` for the root's own. `rename` maps a derived key to its public name."""
    rename = rename or {}
    derived = _derived_keys(cls)
    unknown = set(rename) - set(derived)
    if unknown:
        raise TypeError(f"rename of unknown fields {sorted(unknown)} of {cls.__name__}")
    return Keys({rename.get(k, k): v for k, v in derived.items()}, what)


def resolve_key(key: str, keys: Keys, *, where: str, leaf: bool = True) -> str:
    """The public dotted key for `key`: itself, or (with `leaf`) the one key whose last part
    it is. ValueError naming the key, `where` and the close matches otherwise."""
    if key in keys:
        return key
    if leaf and "." not in key:
        matches = [k for k in keys if k.rsplit(".", 1)[-1] == key]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise ValueError(f"{keys.what} key {key!r} in {where} is ambiguous; use one of "
                             f"{', '.join(matches)}")
    if key in keys.sections:
        raise ValueError(f"{keys.what} key {key!r} in {where} is a section; set one of its keys, "
                         f"e.g. {next(k for k in keys if k.startswith(key + '.'))}")
    names = list(keys) + ([k.rsplit(".", 1)[-1] for k in keys] if leaf else [])
    close = list(dict.fromkeys(difflib.get_close_matches(key, names, n=3, cutoff=0.6)))
    hint = f"; did you mean {', '.join(close)}?" if close else f"; valid: {', '.join(keys)}"
    raise ValueError(f"unknown {keys.what} key {key!r} in {where}{hint}")


# ---- values ---------------------------------------------------------------------------------
def type_name(typ: Any) -> str:
    if typing.get_origin(typ) is tuple:
        args = typing.get_args(typ)
        if args[-1] is Ellipsis:
            return f"a list of {type_name(args[0])}"
        return f"a list of {len(args)} ({', '.join(type_name(a) for a in args)})"
    inner = _optional_inner(typ)
    if inner is not None:
        return f"{type_name(inner)} or none"
    if typ is float:
        return "float (finite)"
    return getattr(typ, "__name__", str(typ))


def _coerce(value: Any, typ: Any) -> Any:
    """`value` as `typ`; ValueError (no message) when it does not fit."""
    inner = _optional_inner(typ)
    if inner is not None:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            return None
        return _coerce(value, inner)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
            return value.strip().lower() in TRUE_WORDS
        raise ValueError
    if isinstance(value, bool):  # True is an int in Python, never in a config
        raise ValueError
    if typ is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            return int(value.strip())
        raise ValueError
    if typ is float:
        if isinstance(value, (int, float)):
            out = float(value)
        elif isinstance(value, str):
            out = float(value.strip())
        else:
            raise ValueError
        if not math.isfinite(out):  # nan and inf pass every range check (nan <= 0 is False)
            raise ValueError
        return out
    if typ is str:
        if isinstance(value, (str, int, float)):
            return str(value)
        raise ValueError
    args = typing.get_args(typ)  # a tuple type (checked by keys_of)
    if isinstance(value, str):
        if value.strip().startswith("["):
            value = json.loads(value)  # exact strings, e.g. stop strings with spaces: ["\n"]
            if not isinstance(value, list):
                raise ValueError
        else:
            value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ValueError
    if args[-1] is Ellipsis:
        return tuple(_coerce(v, args[0]) for v in value)
    if len(value) != len(args):
        raise ValueError
    return tuple(_coerce(v, a) for v, a in zip(value, args, strict=True))


def convert(key: str, value: Any, typ: Any, *, where: str) -> Any:
    """A file value (already typed) or a `--set` string, coerced to the key's type."""
    try:
        return _coerce(value, typ)
    except (ValueError, TypeError, OverflowError, RecursionError):  # json errors are ValueErrors
        raise ValueError(f"{key} = {value!r} in {where}: expected {type_name(typ)}") from None


def resolve_values(data: dict, keys: Keys, *, where: str, leaf: bool = True) -> dict[str, Any]:
    """`{key: value}` -> `{public dotted key: typed value}`; errors name the key and `where`."""
    out: dict[str, Any] = {}
    for raw, value in data.items():
        key = resolve_key(str(raw), keys, where=where, leaf=leaf)
        out[key] = convert(key, value, keys[key].type, where=where)
    return out


def replace_keys(cfg: Any, values: dict[str, Any], keys: Keys, *, where: str) -> Any:
    """`cfg` with typed `values` (public dotted keys) applied; each dataclass of the tree is
    rebuilt once, so its `__post_init__` checks all of its new values together."""
    changes = {keys[k].path: v for k, v in values.items()}

    def rebuild(obj: Any, changes: dict[tuple[str, ...], Any]) -> Any:
        direct = {p[0]: v for p, v in changes.items() if len(p) == 1}
        nested: dict[str, dict] = {}
        for p, v in changes.items():
            if len(p) > 1:
                nested.setdefault(p[0], {})[p[1:]] = v
        for name, sub in nested.items():
            direct[name] = rebuild(getattr(obj, name), sub)
        return dataclasses.replace(obj, **direct) if direct else obj

    try:
        return rebuild(cfg, changes)
    except (ValueError, TypeError) as e:  # a __post_init__ check; say where the values came from
        shown = ", ".join(values) if len(values) <= 3 else f"{len(values)} keys"
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{msg} (setting {shown} from {where})") from None


# ---- the whole tree -------------------------------------------------------------------------
def apply_overrides(cfg: Any, overrides: dict, *, where: str = "--set", keys: Keys | None = None) -> Any:
    """`cfg` with `{key: value}` applied; keys dotted or unique leaf names, values strings (from
    `--set`) or typed. Works for any frozen dataclass tree."""
    keys = keys if keys is not None else keys_of(type(cfg))
    return replace_keys(cfg, resolve_values(overrides, keys, where=where), keys, where=where)


def from_mapping(cls: type, data: Any, *, where: str, keys: Keys | None = None, base: Any = None) -> Any:
    """A nested mapping (a file's or a checkpoint's) -> an instance of `cls` (or `base` with
    the mapping applied). Keys must be named exactly as sections and keys; typos are errors."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a config must be a mapping of keys to values, got "
                         f"{type(data).__name__}")
    keys = keys if keys is not None else keys_of(cls)
    flat = flatten(data, where=where)
    for k, v in data.items():
        if k in keys.sections and not isinstance(v, dict):
            raise ValueError(f"section [{k}] in {where} must be a table of keys, got {v!r}")
        if isinstance(v, dict) and not v and k not in keys.sections:  # flatten drops an empty section
            resolve_key(str(k), keys, where=where, leaf=False)
    values = resolve_values(flat, keys, where=where, leaf=False)
    return replace_keys(base if base is not None else cls(), values, keys, where=where)


def build(cls: type, data: Any, *, where: str, section: str = "") -> Any:
    """A flat dataclass (fields of the types above, some without defaults) from a mapping read
    from a file, e.g. one section of a hardware profile: every key known, every required key
    present, each value coerced to its field's type, and a `__post_init__` error (a range or a
    cross-field rule) prefixed with `where` and the section."""
    label = f"[{section}]" if section else "the file"
    if not isinstance(data, dict):
        raise ValueError(f"{where}: {label} must be a mapping of keys to values, got {_short(data)}")
    keys = keys_of(cls, what=section or cls.__name__)
    values = {}
    for raw, value in data.items():
        key = resolve_key(str(raw), keys, where=where, leaf=False)
        values[key] = convert(f"{section}.{key}" if section else key, value, keys[key].type, where=where)
    missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}: {label} is missing {', '.join(missing)}")
    try:
        return cls(**{keys[k].path[0]: v for k, v in values.items()})
    except (ValueError, TypeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{where}: {label} {msg}") from None


def _short(value: Any) -> str:
    """`value` for an error message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load(cls: type, path: str | Path, *, what: str = "config file", keys: Keys | None = None) -> Any:
    """A config file -> an instance of `cls`."""
    return from_mapping(cls, read_mapping(path, what), where=str(path), keys=keys)


def to_flat(cfg: Any, keys: Keys | None = None) -> dict[str, Any]:
    """The config as public dotted keys -> JSON-ready values (what `--set` accepts)."""
    keys = keys if keys is not None else keys_of(type(cfg))
    out = {}
    for name, k in keys.items():
        v = cfg
        for attr in k.path:
            v = getattr(v, attr)
        out[name] = list(v) if isinstance(v, tuple) else v
    return out


__all__ = ["Key", "Keys", "apply_overrides", "build", "convert", "flatten", "from_mapping", "keys_of", "load",
           "parse_sets", "read_mapping", "replace_keys", "resolve_key", "resolve_values", "to_flat"]
