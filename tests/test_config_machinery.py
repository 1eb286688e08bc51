"""earl.config_machinery: one machinery for files, `--set`, keys and types, for any frozen dataclass tree.

Property tests: a random key and value either applies (the field then holds a value of its
declared type) or raises ValueError naming the key; never another exception type.
"""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from earl import config_machinery as config
from earl.config_machinery import apply_overrides, from_mapping, keys_of, load, parse_sets, to_flat
from earl.runtime.run_config import RunConfig
from earl.sim import scenario


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner:
    rate: float = 0.5  # a fraction
    names: tuple[str, ...] = ("a",)
    pair: tuple[int, int] = (1, 2)
    limit: int | None = None

    def __post_init__(self):
        if not 0 <= self.rate <= 1:
            raise ValueError(f"inner.rate must be in [0, 1], got {self.rate}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tree:
    steps: int = 3
    flag: bool = False
    label: str = "x"
    inner: Inner = dataclasses.field(default_factory=Inner)
    other: Inner = dataclasses.field(default_factory=Inner)


ROOTS = [Tree(), RunConfig(), scenario.Scenario()]


def _keys(root):
    return scenario.KEYS if isinstance(root, scenario.Scenario) else keys_of(type(root))


def _apply(root, overrides):
    """What `--set` does to each tree (a scenario's workload.preset first picks the workload)."""
    if isinstance(root, scenario.Scenario):
        return scenario.build_scenario(config.resolve_values(overrides, scenario.KEYS, where="--set"))
    return apply_overrides(root, overrides, where="--set")


def _holds(value, typ) -> bool:
    """`value` is an instance of the annotation `typ`."""
    inner = config._optional_inner(typ)
    if inner is not None:
        return value is None or _holds(value, inner)
    if typing.get_origin(typ) is tuple:
        args = typing.get_args(typ)
        if not isinstance(value, tuple):
            return False
        if args[-1] is Ellipsis:
            return all(_holds(v, args[0]) for v in value)
        return len(value) == len(args) and all(_holds(v, a) for v, a in zip(value, args, strict=True))
    if typ is float:
        return type(value) is float
    return type(value) is typ


def _get(cfg, path):
    for attr in path:
        cfg = getattr(cfg, attr)
    return cfg


scalars = st.one_of(st.text(max_size=8), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.booleans(), st.none(),
                    st.sampled_from(["true", "off", "1", "0", "3", "-2", "0.5", "1e-3", "nan", "inf",
                                     "[1, 2]", '["\\n", "x"]', "a,b", "", "[", "1,2", "none"]))
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=3), scalars,
                                                                          max_size=2))


def _key_strategy(root):
    keys = list(_keys(root))
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    return st.one_of(st.sampled_from(keys), st.sampled_from(leaves),
                     st.sampled_from(keys).map(lambda k: k[:-1] + "z"), st.text(max_size=12))


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: type(r).__name__)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_override_applies_or_names_the_key(root, data):
    key = data.draw(_key_strategy(root))
    value = data.draw(values)
    try:
        cfg = _apply(root, {key: value})
    except ValueError as e:
        msg = str(e)
        assert key in msg or repr(key) in msg or key.rsplit(".", 1)[-1] in msg, msg
        assert "\n" not in msg
        return
    keys = _keys(root)
    dotted = config.resolve_key(key, keys, where="--set")
    got = _get(cfg, keys[dotted].path)
    assert _holds(got, keys[dotted].type), (dotted, value, got)
    if isinstance(value, str) and keys[dotted].type is str:
        assert got == value
    if type(value) is int and keys[dotted].type in (int, float):
        assert got == value
    if isinstance(value, float) and keys[dotted].type is float:
        assert got == value or (math.isnan(got) and math.isnan(value))


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: type(r).__name__)
def test_every_key_round_trips_as_a_string_and_through_a_file(root):
    import json

    keys = _keys(root)
    for key, value in to_flat(root, keys).items():
        text = json.dumps(value) if isinstance(value, list) else str(value)
        assert _apply(root, {key: text}) == root, key
    nested: dict = {}
    for key, value in to_flat(root, keys).items():
        *secs, leaf = key.split(".")
        d = nested
        for s in secs:
            d = d.setdefault(s, {})
        d[leaf] = value
    assert from_mapping(type(root), nested, where="f.toml", keys=keys) == root


def test_coercion_and_leaf_keys():
    cfg = apply_overrides(Tree(), {"steps": "7", "flag": "yes", "inner.names": "b, c", "other.pair": "[3, 4]",
                                   "inner.limit": "5", "label": 12})
    assert (cfg.steps, cfg.flag, cfg.inner.names, cfg.other.pair, cfg.inner.limit, cfg.label) == \
        (7, True, ("b", "c"), (3, 4), 5, "12")
    assert apply_overrides(cfg, {"inner.limit": "none"}).inner.limit is None
    with pytest.raises(ValueError, match=r"'rate' in --set is ambiguous; use one of inner.rate, other.rate"):
        apply_overrides(Tree(), {"rate": "0.1"})
    with pytest.raises(ValueError, match=r"'inner' in --set is a section"):
        apply_overrides(Tree(), {"inner": "1"})
    with pytest.raises(ValueError, match=r"unknown config key 'inner.rat' in --set; did you mean inner.rate"):
        apply_overrides(Tree(), {"inner.rat": "1"})
    with pytest.raises(ValueError, match=r"other.pair = '1,2,3' in --set: expected a list of 2 \(int, int\)"):
        apply_overrides(Tree(), {"other.pair": "1,2,3"})
    with pytest.raises(ValueError, match=r"steps = True in --set: expected int"):
        apply_overrides(Tree(), {"steps": True})
    with pytest.raises(ValueError, match=r"inner.rate must be in \[0, 1\], got 2.0 \(setting inner.rate from --set\)"):
        apply_overrides(Tree(), {"inner.rate": 2})


def test_keys_can_be_renamed():
    keys = keys_of(Tree, rename={"steps": "run.steps"}, what="demo")
    assert "run.steps" in keys and "steps" not in keys
    assert apply_overrides(Tree(), {"steps": "4"}, keys=keys).steps == 4  # leaf of run.steps
    with pytest.raises(ValueError, match="unknown demo key 'run.step'"):
        apply_overrides(Tree(), {"run.step": "4"}, keys=keys)
    with pytest.raises(TypeError):
        keys_of(Tree, rename={"nope": "x"})


@given(st.lists(st.text(max_size=10), max_size=5))
def test_parse_sets(items):
    try:
        out = parse_sets(items)
    except ValueError as e:
        assert "--set expects key=value" in str(e)
        assert any("=" not in i or not i.partition("=")[0].strip() for i in items)
        return
    for item in items:
        k, _, v = item.partition("=")
        assert k.strip() in out
    assert parse_sets(None) == {}


def test_file_errors_name_the_file(tmp_path):
    cases = {
        "missing.toml": (None, "config file .*missing.toml.* does not exist"),
        "a.ini": ("x=1", "unknown suffix '.ini'"),
        "bad.toml": ("steps = \n", "bad.toml: invalid TOML"),
        "bad.yaml": ("a: [1,\n", "bad.yaml: invalid YAML"),
        "list.yaml": ("- 1\n", "list.yaml: a config file must be a mapping"),
        "typo.toml": ("[inner]\nrat = 0.1\n", "unknown config key 'inner.rat' in .*typo.toml; did you mean inner.rate"),
        "leaf.toml": ("rate = 0.1\n", "unknown config key 'rate' in .*leaf.toml"),  # files name sections
        "value.yaml": ("inner: {rate: fast}\n", "inner.rate = 'fast' in .*value.yaml: expected float"),
        "table.toml": ("inner = 3\n", r"section \[inner\] in .*table.toml must be a table"),
        "post.json": ('{"inner": {"rate": 5}}', r"inner.rate must be in \[0, 1\].*from .*post.json"),
    }
    for name, (text, match) in cases.items():
        p = tmp_path / name
        if text is not None:
            p.write_text(text)
        with pytest.raises(ValueError, match=match):
            load(Tree, p)
    (tmp_path / "ok.yaml").write_text("steps: 5\ninner: {names: [p, q], limit: null}\n")
    assert load(Tree, tmp_path / "ok.yaml") == Tree(steps=5, inner=Inner(names=("p", "q")))


def test_unsupported_field_type_is_caught_early():
    @dataclasses.dataclass(frozen=True)
    class Bad:
        table: dict = dataclasses.field(default_factory=dict)

    with pytest.raises(TypeError, match="unsupported type"):
        keys_of(Bad)


def test_config_imports_without_torch_or_simpy():
    import subprocess
    import sys

    code = ("import sys\nsys.modules['torch'] = None\nsys.modules['simpy'] = None\n"
            "import earl.config_machinery, earl.runtime.run_config\n"
            "from earl.runtime.run_config import RunConfig\n"
            "earl.config_machinery.apply_overrides(RunConfig(), {'lr': '0.1'})\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
