"""Read a TOML / YAML / JSON settings file into a dict, safely (no code execution).

Shared by `earl run` configs and `earl simulate` scenarios, which each validate the keys.

    python -c "from earl.configfile import read_mapping_file as r; print(r('earl/sim/scenarios/default.toml'))"
"""

from __future__ import annotations

from pathlib import Path

import tomllib

SUFFIXES = (".toml", ".yaml", ".yml", ".json")


def read_mapping_file(path: str | Path, what: str = "config file", missing_hint: str = "") -> dict:
    """The file's top-level mapping. ValueError (one line) when the file is missing, has an
    unknown suffix, does not parse, or is not a mapping."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{what} {str(p)!r} does not exist{missing_hint}")
    if p.suffix not in SUFFIXES:
        raise ValueError(f"{what} {p.name!r}: unknown suffix {p.suffix!r}; use {', '.join(SUFFIXES)}")
    text = p.read_text()
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
