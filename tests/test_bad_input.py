"""The bad-input corpus: every input a new user can get wrong (files the toolkit reads, output
paths, resources, resumes) gives exit code 2, exactly one line on stderr, no traceback, and
leaves every file that existed before byte- and mtime-identical (nothing lost, nothing written).

    PYTHONPATH=$PWD python -m pytest -q tests/test_bad_input.py

`CASES` is the corpus; `test_corpus_size` prints how many bad inputs it tries.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from earl.cli import app
from earl.cost_model.profile import load_profile

GOOD_MODEL = {"num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
              "vocab_size": 100, "num_key_value_heads": 2}
GOOD_PROFILE = load_profile("h100-sxm-80gb").to_dict()
REPO = Path(__file__).resolve().parents[1]


def model(**changes) -> dict:
    """{"m/config.json": a small valid HF config with `changes` (None: key removed)}."""
    cfg = {**GOOD_MODEL, **changes}
    return {"m/config.json": json.dumps({k: v for k, v in cfg.items() if v is not None})}


def profile(path: str = "", value=None, drop: bool = False) -> dict:
    """{"p.json": the H100 profile with the value at dotted `path` replaced (or dropped)}."""
    d = copy.deepcopy(GOOD_PROFILE)
    if path:
        *head, last = path.split(".")
        node = d
        for k in head:
            node = node[k]
        if drop:
            del node[last]
        else:
            node[last] = value
    return {"p.json": json.dumps(d)}


META = {"step": 3, "format_version": 1, "layout": {"tensors": {}},
        "config": {"env": {"name": "tic-tac-toe"}, "model": {"path": "tiny"}}}
RUN = {"r/checkpoints/latest": "step-3", "r/checkpoints/step-3/meta.json": json.dumps(META),
       "r/metrics.csv": "step,reward\n" + "".join(f"{i},0.5\n" for i in range(1, 31))}
EST = ["estimate", "decode"]
SIM = ["simulate", "--steps", "1", "--no-plots", "--out", "o"]
TRACE_SC = "[workload]\ntrace = 't.jsonl'\n"

# (id, files to create, arguments, a substring of the one-line message)
CASES = [
    # ---- model configs (ModelSpec.from_hf_config) ------------------------------------------
    ("heads-0", model(num_attention_heads=0), EST + ["--model", "m"], "num_attention_heads = 0"),
    ("layers-1e400", {"m/config.json": json.dumps(GOOD_MODEL)[:-1] + ', "num_hidden_layers": 1e400}'},
     EST + ["--model", "m"], "num_hidden_layers = inf"),
    ("model-bare-number", {"m/config.json": "5"}, EST + ["--model", "m"], "m/config.json"),
    ("model-list", {"m/config.json": "[1, 2]"}, EST + ["--model", "m"], "must be a JSON object"),
    ("model-null", {"m/config.json": "null"}, EST + ["--model", "m"], "must be a JSON object"),
    ("model-string-size", model(hidden_size="big"), EST + ["--model", "m"], "hidden_size = 'big'"),
    ("model-float-size", model(hidden_size=64.5), EST + ["--model", "m"], "hidden_size = 64.5"),
    ("model-bool-layers", model(num_hidden_layers=True), EST + ["--model", "m"], "num_hidden_layers = True"),
    ("model-missing-vocab", model(vocab_size=None), EST + ["--model", "m"], "missing key 'vocab_size'"),
    ("model-kv-not-divisor", model(num_key_value_heads=3), EST + ["--model", "m"], "multiple of num_kv_heads"),
    ("model-negative-ffn", model(intermediate_size=-128), EST + ["--model", "m"], "intermediate_size = -128"),
    ("model-hidden-not-heads", model(hidden_size=66), EST + ["--model", "m"], "not a multiple of num_attention"),
    ("model-dtype-int8", model(dtype="int8"), EST + ["--model", "m"], "dtype = 'int8'"),
    ("model-torch-dtype-bad", model(torch_dtype="float8"), EST + ["--model", "m"], "torch_dtype = 'float8'"),
    ("model-bad-json", {"m/config.json": "{not json"}, EST + ["--model", "m"], "not valid JSON"),
    ("model-nan", {"m/config.json": json.dumps(GOOD_MODEL)[:-1] + ', "hidden_size": NaN}'},
     EST + ["--model", "m"], "hidden_size = nan"),
    ("model-tie-word", model(tie_word_embeddings="maybe"), EST + ["--model", "m"], "tie_word_embeddings"),
    ("model-missing-dir", {}, EST + ["--model", "nowhere/x"], "nowhere"),
    # ---- hardware profiles (HardwareProfile.from_dict) -------------------------------------
    ("profile-null", {"p.json": "null"}, EST + ["--hardware", "p.json"], "must be a JSON object"),
    ("profile-empty-list", {"p.json": "[]"}, EST + ["--hardware", "p.json"], "must be a JSON object"),
    ("profile-section-list", profile("hardware", [1]), EST + ["--hardware", "p.json"], "[hardware] must be a mapping"),
    ("profile-nan", profile("op_overhead_s", float("nan")), EST + ["--hardware", "p.json"], "op_overhead_s = nan"),
    ("profile-inf", profile("mem_reserve_bytes", float("inf")), EST + ["--hardware", "p.json"],
     "mem_reserve_bytes = inf"),
    ("profile-negative-overhead", profile("op_overhead_s", -1), EST + ["--hardware", "p.json"], "op_overhead_s"),
    ("profile-reserve-2", profile("mem_reserve_frac", 2.0), EST + ["--hardware", "p.json"], "mem_reserve_frac"),
    ("profile-gpus-2.5", profile("hardware.gpus_per_node", 2.5), EST + ["--hardware", "p.json"],
     "hardware.gpus_per_node = 2.5"),
    ("profile-gpus-negative", profile("hardware.gpus_per_node", -8), EST + ["--hardware", "p.json"],
     "gpus_per_node"),
    ("profile-peak-nan", profile("matmul.peak_frac", float("nan")), EST + ["--hardware", "p.json"],
     "matmul.peak_frac = nan"),
    ("profile-peak-2", profile("matmul.peak_frac", 2.0), EST + ["--hardware", "p.json"], "peak_frac"),
    ("profile-missing-hardware", profile("hardware", drop=True), EST + ["--hardware", "p.json"], "'hardware'"),
    ("profile-missing-field", profile("intra.alpha_s", drop=True), EST + ["--hardware", "p.json"], "alpha_s"),
    ("profile-unknown-key", profile("op_overhead", 1e-6), EST + ["--hardware", "p.json"], "op_overhead"),
    ("profile-unknown-section-key", profile("matmul.peak", 0.5), EST + ["--hardware", "p.json"], "peak"),
    ("profile-version", profile("version", 99), EST + ["--hardware", "p.json"], "version 99"),
    ("profile-string-number", profile("hardware.hbm_bytes", "lots"), EST + ["--hardware", "p.json"],
     "hardware.hbm_bytes = 'lots'"),
    ("profile-link-name", profile("collective_links", {"allreduse": {"alpha_s": 1e-6, "bw_bytes_s": 1e9}}),
     EST + ["--hardware", "p.json"], "allreduse"),
    ("profile-negative-alpha", profile("intra.alpha_s", -1), EST + ["--hardware", "p.json"], "alpha_s"),
    ("profile-stamp-list", profile("stamp", [1]), EST + ["--hardware", "p.json"], "stamp"),
    ("profile-bad-json", {"p.json": "{"}, EST + ["--hardware", "p.json"], "not valid JSON"),
    # ---- scenarios ---------------------------------------------------------------------------
    ("scenario-nodes-0", {"s.toml": "[cluster]\nnodes = 0\n"}, ["simulate", "s.toml", "--out", "o"], "nodes"),
    ("scenario-nodes-2.5", {"s.toml": "[cluster]\nnodes = 2.5\n"}, ["simulate", "s.toml", "--out", "o"], "2.5"),
    ("scenario-steps-nan", {"s.toml": "[scenario]\nsteps = nan\n"}, ["simulate", "s.toml", "--out", "o"], "nan"),
    ("scenario-section-scalar", {"s.toml": "cluster = 3\n"}, ["simulate", "s.toml", "--out", "o"], "cluster"),
    ("scenario-unknown-key", {"s.toml": "[cluster]\nnode = 2\n"}, ["simulate", "s.toml", "--out", "o"], "node"),
    ("scenario-bad-toml", {"s.toml": "[cluster\n"}, ["simulate", "s.toml", "--out", "o"], "invalid TOML"),
    ("scenario-yaml-list", {"s.yaml": "- 1\n- 2\n"}, ["simulate", "s.yaml", "--out", "o"], "mapping"),
    ("scenario-network", {}, ["simulate", "--set", "cluster.network=token-ring", "--out", "o"], "token-ring"),
    ("scenario-tp-across-nodes", {}, ["simulate", "--set", "cluster.gpus_per_node=4", "--set", "plan.rollout=tp8",
                                      "--set", "plan.experience=tp4", "--set", "plan.train=tp4-pp2", "--out", "o"],
     "spans more than a node"),
    # ---- workload traces ---------------------------------------------------------------------
    ("trace-nan-latency", {"s.toml": TRACE_SC, "t.jsonl": '{"step": 0, "episodes": [{"id": 0, "turns": '
                                                          '[[1, 2, NaN]]}]}\n'}, SIM[:1] + ["s.toml"] + SIM[1:],
     "t.jsonl:1"),
    ("trace-1e400", {"s.toml": TRACE_SC, "t.jsonl": '{"step": 0, "episodes": [{"id": 0, "turns": '
                                                    '[[1e400, 2, 0.1]]}]}\n'}, SIM[:1] + ["s.toml"] + SIM[1:],
     "t.jsonl:1"),
    ("trace-not-object", {"s.toml": TRACE_SC, "t.jsonl": "[1, 2]\n"}, SIM[:1] + ["s.toml"] + SIM[1:], "t.jsonl:1"),
    ("trace-empty", {"s.toml": TRACE_SC, "t.jsonl": "\n"}, SIM[:1] + ["s.toml"] + SIM[1:], "no steps"),
    # ---- run configs -------------------------------------------------------------------------
    ("run-lr-nan", {"c.toml": "[trainer]\nlr = nan\n"}, ["run", "c.toml", "--out", "o"], "trainer.lr = nan"),
    ("run-lr-inf", {"c.toml": "[trainer]\nlr = inf\n"}, ["run", "c.toml", "--out", "o"], "trainer.lr = inf"),
    ("run-steps-string", {"c.toml": 'steps = "many"\n'}, ["run", "c.toml", "--out", "o"], "steps = 'many'"),
    ("run-unknown-env", {"c.toml": '[env]\nname = "chess"\n'}, ["run", "c.toml", "--out", "o"], "chess"),
    ("run-section-scalar", {"c.toml": "trainer = 3\n"}, ["run", "c.toml", "--out", "o"], "trainer"),
    ("run-compile-static-engine", {}, ["run", "--set", "engine=pytorch-static", "--set", "compile_decode=true",
                                       "--out", "o"], "compile_decode applies to engine 'pytorch' only"),
    ("run-vllm-builtin-model", {}, ["run", "--set", "engine=vllm", "--out", "o"],
     "engine 'vllm' loads a local HF checkpoint directory, not the built-in model 'tiny'"),
    ("run-vllm-rollout-tp2", {}, ["run", "--nproc", "2", "--set", "engine=vllm", "--set", "plan.rollout=tp2-dp1",
                                  "--out", "o"], "engine 'vllm' runs one engine per rank, so it needs rollout tp 1"),
    ("run-unknown-section", {"c.toml": "[trainr]\nlr = 1\n"}, ["run", "c.toml", "--out", "o"], "trainr"),
    ("run-yaml-number", {"c.yaml": "5\n"}, ["run", "c.yaml", "--out", "o"], "mapping"),
    ("run-budget-negative", {}, ["run", "--set", "plan.memory_budget_mb=-1", "--out", "o"], "memory_budget_mb"),
    ("run-tis-cap-below-1", {}, ["run", "--set", "trainer.tis_cap=0.5", "--out", "o"],
     "trainer.tis_cap must be 0 (off) or a finite cap >= 1, got 0.5"),
    ("run-nproc-0", {}, ["run", "--nproc", "0", "--out", "o"], "nproc"),
    ("run-nproc-3-fsdp-uneven", {}, ["run", "--nproc", "3", "--train-plan", "tp1-dp3-zero", "--out", "o"],
     "train plan tp1-dp3-mb1-zero: FSDP2 cannot shard"),
    ("run-nproc-tp3", {}, ["run", "--nproc", "2", "--train-plan", "tp3-dp1", "--out", "o"], "needs 3 processes"),
    ("run-schedule-bad", {}, ["run", "--schedule", "x:train:tp1", "--out", "o"], "plan.schedule"),
    ("run-model-no-weights", model(num_attention_heads=0), ["run", "--model", "m", "--out", "o"],
     "model directory m"),
    # ---- checkpoints ---------------------------------------------------------------------------
    ("meta-garbage", {"ck/meta.json": "{"}, ["run", "--resume", "ck"], "corrupted"),
    ("meta-list", {"ck/meta.json": "[]"}, ["run", "--resume", "ck"], "corrupted"),
    ("meta-step-1e400", {"ck/meta.json": json.dumps({**META, "step": 1})[:-1].replace('"step": 1', '"step": 1e400')
                         + "}"}, ["run", "--resume", "ck"], "corrupted"),
    ("meta-config-typo", {"ck/meta.json": json.dumps({**META, "config": {"trainr": {}}})}, ["run", "--resume", "ck"],
     "trainr"),
    ("resume-nothing", {"x/a.txt": "keep"}, ["run", "--resume", "x"], "no checkpoint"),
    ("resume-switch-env", RUN, ["run", "--resume", "r", "--env", "calculator"], "cannot switch"),
    ("resume-switch-model", RUN, ["run", "--resume", "r", "--set", "model.path=other"], "cannot switch"),
    # ---- output paths (checked before any work) -------------------------------------------------
    ("run-out-existing-run", RUN, ["run", "--out", "r", "--steps", "1"], "--resume r"),
    ("run-out-other-files", {"o/notes.txt": "mine"}, ["run", "--out", "o", "--steps", "1"], "not empty"),
    ("run-out-is-file", {"o": "mine"}, ["run", "--out", "o", "--steps", "1"], "is a file"),
    ("run-out-under-file", {"f": "mine"}, ["run", "--out", "f/o", "--steps", "1"], "file where a folder"),
    ("run-out-proc", {}, ["run", "--out", "/proc/earl-x", "--steps", "1"], "cannot be written"),
    ("run-nproc-out-existing-run", RUN, ["run", "--nproc", "2", "--out", "r", "--steps", "1"], "--resume r"),
    ("run-nproc-out-other-files", {"o/notes.txt": "mine"}, ["run", "--nproc", "2", "--out", "o"], "not empty"),
    ("sim-out-other-files", {"o/notes.txt": "mine"}, ["simulate", "--steps", "1", "--out", "o"], "not empty"),
    ("sim-out-is-file", {"o": "mine"}, ["simulate", "--steps", "1", "--out", "o"], "is a file"),
    ("sim-out-proc", {}, ["simulate", "--steps", "1", "--out", "/proc/earl-x"], "cannot be written"),
    ("calibrate-out-exists", {"e.json": "{}"}, ["calibrate", "--out", "e.json"], "--force"),
    ("calibrate-out-proc", {}, ["calibrate", "--out", "/proc/earl-x.json"], "cannot be written"),
    ("calibrate-out-folder", {"d/x": "mine"}, ["calibrate", "--out", "d.json", "--measurements", "d"], "folder"),
    ("calibrate-measurements-exist", {"m.json": "{}"}, ["calibrate", "--out", "n.json", "--measurements",
                                                        "m.json"], "--force"),
    ("validate-out-other-files", {"o/notes.txt": "mine"}, ["validate", "--out", "o", "--steps", "2"], "not empty"),
    ("validate-out-proc", {}, ["validate", "--out", "/proc/earl-x", "--steps", "2"], "cannot be written"),
    ("validate-out-under-file", {"f": "mine"}, ["validate", "--out", "f/o", "--steps", "2"], "file where"),
    ("validate-nproc-0", {}, ["validate", "--out", "o", "--nproc", "0"], "--nproc 0 is not validated; valid: 1, 2, 4"),
    ("validate-nproc-3", {}, ["validate", "--out", "o", "--nproc", "3"], "--nproc 3 is not validated; valid: 1, 2, 4"),
    ("study-quick-figures", {}, ["study", "s2", "--quick", "--out", str(REPO / "docs" / "figures")], "--quick"),
    # ---- more: --set values, odd files ----------------------------------------------------------
    ("model-head-dim-0", model(head_dim=0), EST + ["--model", "m"], "head_dim = 0"),
    ("profile-reserve-negative", profile("mem_reserve_frac", -0.1), EST + ["--hardware", "p.json"],
     "mem_reserve_frac"),
    ("profile-is-folder", {"x.json/a": "1"}, EST + ["--hardware", "x.json"], "x.json"),
    ("set-lr-nan", {}, ["run", "--set", "trainer.lr=nan", "--out", "o"], "trainer.lr = 'nan'"),
    ("set-steps-1e400", {}, ["run", "--set", "steps=1e400", "--out", "o"], "steps = '1e400'"),
    ("set-nodes-inf", {}, ["simulate", "--set", "cluster.nodes=inf", "--out", "o"], "cluster.nodes"),
    ("sim-steps-negative", {}, ["simulate", "--steps", "-1", "--out", "o"], "steps"),
    ("run-yaml-inf", {"c.yaml": "trainer:\n  lr: .inf\n"}, ["run", "c.yaml", "--out", "o"], "trainer.lr = inf"),
    ("meta-step-string", {"ck/meta.json": json.dumps({**META, "step": "abc"})}, ["run", "--resume", "ck"],
     "corrupted"),
    ("trace-missing-episodes", {"s.toml": TRACE_SC, "t.jsonl": '{"step": 0}\n'}, SIM[:1] + ["s.toml"] + SIM[1:],
     "t.jsonl:1"),
    ("trace-missing-file", {"s.toml": TRACE_SC}, SIM[:1] + ["s.toml"] + SIM[1:], "t.jsonl"),
    # ---- sampling and env settings, OpenSpiel parameters (before any work) ------------------------
    ("set-max-new-tokens-0", {}, ["run", "--set", "sampling.max_new_tokens=0", "--out", "o"],
     "sampling.max_new_tokens must be >= 1"),
    ("set-temperature-negative", {}, ["run", "--set", "sampling.temperature=-0.5", "--out", "o"],
     "sampling.temperature must be a finite number >= 0"),
    ("set-top-p-0", {}, ["run", "--set", "sampling.top_p=0", "--out", "o"], "sampling.top_p must be in (0, 1]"),
    ("set-top-p-1.5", {}, ["run", "--set", "sampling.top_p=1.5", "--out", "o"], "sampling.top_p must be in (0, 1]"),
    ("set-max-context-1", {}, ["run", "--set", "sampling.max_context=1", "--out", "o"], "sampling.max_context"),
    ("set-reward-timeout-0", {}, ["run", "--set", "env.reward_timeout_s=0", "--out", "o"],
     "env.reward_timeout_s must be a finite number of seconds > 0"),
    ("set-tool-timeout-inf", {}, ["run", "--set", "env.tool_timeout_s=inf", "--out", "o"], "env.tool_timeout_s"),
    ("set-max-reward-error-rate-0", {}, ["run", "--set", "env.max_reward_error_rate=0", "--out", "o"],
     "env.max_reward_error_rate must be in (0, 1]"),
    # ---- resources (before anything is built) ---------------------------------------------------
    ("validate-72b", {}, ["validate", "--model", "qwen2.5-72b", "--out", "o", "--steps", "2"], "GiB"),
    ("run-rollout-kv-too-big", {}, ["run", "--set", "groups=2000000", "--out", "o"],
     "one rollout step needs at least"),
]

if importlib.util.find_spec("pyspiel") is not None:  # in the `test` extra; skipped only where it cannot install
    CASES += [
        ("openspiel-unknown-parameter", {}, ["run", "--env", "openspiel:connect_four(foo=1)", "--out", "o"],
         "connect_four takes no parameter 'foo'; valid: columns, egocentric_obs_tensor, rows, x_in_row"),
        ("openspiel-parameter-type", {}, ["run", "--env", "openspiel:connect_four(rows=x)", "--out", "o"],
         "rows='x' must be an integer"),
        ("openspiel-no-parameters", {}, ["run", "--env", "openspiel:tic_tac_toe(rows=3)", "--out", "o"],
         "tic_tac_toe takes no parameter 'rows'; valid: none"),
        ("openspiel-unclosed", {}, ["run", "--env", "openspiel:connect_four(rows=5", "--out", "o"],
         "expected GAME(name=value,...)"),
    ]


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def check_one_line_exit_2(args: list[str], root: Path) -> str:
    """Run `earl ARGS` in `root`; assert exit 2, one line on stderr, no traceback, files untouched."""
    before = _snapshot(root)
    r = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2, (args, r.exit_code, r.output, r.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, r.stderr)
    assert "Traceback" not in r.output and "Traceback" not in r.stderr
    assert _snapshot(root) == before, "files changed or appeared"
    return lines[0]


@pytest.mark.parametrize(("files", "args", "expect"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(files, args, expect, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, files)
    line = check_one_line_exit_2(args, tmp_path)
    assert expect in line, line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
@pytest.mark.parametrize("cmd", [["simulate", "--steps", "1"], ["run"], ["calibrate"], ["validate"]])
def test_read_only_folder(cmd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    out = str(ro / ("p.json" if cmd == ["calibrate"] else "o"))
    assert "cannot be written" in check_one_line_exit_2(cmd + ["--out", out], tmp_path)


def test_corpus_size(capsys):
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
    with capsys.disabled():
        print(f"\nbad-input corpus: {len(CASES)} cases (+ 4 read-only-folder cases when not root)")


# ---- property tests: random JSON values anywhere in a model config or a profile ------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _paths(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out.append(prefix + k)
        if isinstance(v, dict):
            out += _paths(v, prefix + k + ".")
    return out


PROFILE_PATHS = _paths(GOOD_PROFILE)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PROFILE_PATHS), value=JSON_VALUES)
def test_random_profile_values_are_one_line_exit_2_or_valid(path, value, tmp_path_factory):
    root = tmp_path_factory.mktemp("p")
    (root / "p.json").write_text(json.dumps(json.loads(profile(path, value)["p.json"])))
    r = CliRunner().invoke(app, ["estimate", "decode", "--hardware", str(root / "p.json"), "--json"])
    assert r.exit_code in (0, 2), (path, value, r.output, r.exception)
    assert "Traceback" not in r.output
    if r.exit_code == 2:
        assert len(r.stderr.strip().splitlines()) == 1 and str(root / "p.json") in r.stderr, r.stderr


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from([*GOOD_MODEL, "head_dim", "dtype", "torch_dtype", "tie_word_embeddings",
                            "attention_bias"]), value=JSON_VALUES)
def test_random_model_config_values_raise_only_value_error(key, value):
    from earl.specs import ModelSpec

    try:
        spec = ModelSpec.from_hf_dict({**GOOD_MODEL, key: value}, name="m", source="m/config.json")
    except ValueError as e:
        assert "m/config.json" in str(e) and "\n" not in str(e)
    else:
        assert spec.num_params > 0


@settings(max_examples=100, deadline=None)
@given(data=st.dictionaries(st.sampled_from(["trainer", "model", "env", "plan", "steps", "seed", "sampling"]),
                            JSON_VALUES, max_size=3))
def test_random_run_config_shapes_raise_only_value_error(data):
    from earl.runtime.run_config import from_dict

    try:
        from_dict(data, where="c.toml")
    except ValueError as e:
        assert "\n" not in str(e)


SCENARIO_KEYS = {"scenario": ["steps", "seed", "name"], "model": ["name"], "cluster": ["nodes", "gpus_per_node",
                 "network", "hardware"], "workload": ["episodes_per_step", "max_context", "preset"],
                 "plan": ["train", "rollout"], "failure": ["oom_restart_s"]}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.dictionaries(st.sampled_from(sorted(SCENARIO_KEYS)), st.one_of(
    JSON_VALUES, st.dictionaries(st.sampled_from(sorted({k for ks in SCENARIO_KEYS.values() for k in ks})),
                                 JSON_VALUES, max_size=2)), max_size=2))
def test_random_scenario_files_are_one_line_exit_2_or_run(data, tmp_path_factory):
    """Random shapes and values in a scenario file (JSON, which the same reader takes as TOML's
    tables): `earl simulate` runs it or says what is wrong in one line, before writing anything."""
    root = tmp_path_factory.mktemp("s")
    path = root / "s.json"
    path.write_text(json.dumps({"scenario": {"steps": 1}, "model": {"name": "qwen2.5-7b"},
                                "cluster": {"nodes": 1}, "workload": {"episodes_per_step": 16}, **data}))
    r = CliRunner().invoke(app, ["simulate", str(path), "--steps", "1", "--no-plots", "--out", str(root / "o")])
    assert r.exit_code in (0, 2), (data, r.output, r.exception)
    assert "Traceback" not in r.output
    if r.exit_code == 2:
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (root / "o").exists()
