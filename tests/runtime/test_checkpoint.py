"""Sharded checkpoints (torch.distributed.checkpoint): bit-exact round trips across world sizes
and plans on real gloo ranks, keep-N by step number, interrupted saves, incompatible models,
and the HF export loaded back by transformers.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_checkpoint.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from earl.parallel import ParamShape, local_bounds
from earl.runtime import checkpoint as ck
from earl.runtime.dist import run_local
from earl.specs import ParallelPlan

# awkward sizes on purpose: uneven tp chunks and ZeRO-1 slices, a column-split tensor
SHAPES = {"w": ParamShape(shape=(7, 3), tp_dim=0), "o": ParamShape(shape=(4, 5), tp_dim=1),
          "b": ParamShape(shape=(3,), tp_dim=None), "e": ParamShape(shape=(6, 4), tp_dim=None),
          "h": ParamShape(shape=(5,), tp_dim=0)}
STATES = ("exp_avg", "exp_avg_sq")
ONE = ParallelPlan()


def _full(key: str, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(map(ord, key)))
    return torch.randn(SHAPES[key.split("/")[0]].shape, generator=g).to(dtype)


def _local(key: str, plan: ParallelPlan, rank: int) -> torch.Tensor:
    p = SHAPES[key.split("/")[0]]
    lo, hi = local_bounds(p, plan, rank, optimizer="/" in key)
    return _full(key).narrow(p.shard_dim, lo, hi - lo).clone()


def _tensors(plan: ParallelPlan, rank: int):
    params = {n: _local(n, plan, rank) for n in SHAPES}
    opt = {f"{n}/{s}": _local(f"{n}/{s}", plan, rank) for n in SHAPES for s in STATES}
    return params, opt


def _save(out, plan: ParallelPlan, step: int, keep: int = 2) -> str:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    params, opt = _tensors(plan, rank)
    meta = {"config": {"seed": 1}, "plans": {"train": plan.describe()}, "rng": ck.rng_state()}
    return str(ck.save_checkpoint(out, step, params=params, optimizer=opt, optimizer_step=3, shapes=SHAPES,
                                  plan=plan, meta=meta, keep=keep))


def _load_and_compare(path, plan: ParallelPlan) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    got = ck.load_checkpoint(path, shapes=SHAPES, plan=plan, rank=rank, world=world)
    params, opt = _tensors(plan, rank)
    return {"params": all(torch.equal(got.params[n], params[n]) for n in params) and set(got.params) == set(params),
            "optimizer": all(torch.equal(got.optimizer[k], opt[k]) for k in opt) and set(got.optimizer) == set(opt),
            "step": got.meta["step"], "optimizer_step": got.optimizer_step}


def _exact(results):
    for r in results:
        assert r["params"] and r["optimizer"] and r["optimizer_step"] == 3, r


@pytest.mark.dist
def test_one_process_into_two(tmp_path):
    path = _save(tmp_path, ONE, 1)  # no process group: full tensors
    _exact(run_local(_load_and_compare, 2, path, ParallelPlan(dp=2, sharded_optimizer=True)))
    _exact(run_local(_load_and_compare, 2, path, ParallelPlan(tp=2)))  # tp1 -> tp2


@pytest.mark.dist
def test_dp2_zero_into_one_and_tp2_into_tp1(tmp_path):
    zero = run_local(_save, 2, tmp_path / "a", ParallelPlan(dp=2, sharded_optimizer=True), 4)[0]
    _exact([_load_and_compare(zero, ONE)])
    tp2 = run_local(_save, 2, tmp_path / "b", ParallelPlan(tp=2), 4)[0]
    _exact([_load_and_compare(tp2, ONE)])
    _exact(run_local(_load_and_compare, 2, tp2, ParallelPlan(dp=2, sharded_optimizer=True)))
    assert json.loads((tmp_path / "b" / "checkpoints" / "step-000004" / "meta.json").read_text())["layout"][
        "plan"] == "tp2-dp1-mb1"


@pytest.mark.dist
def test_tp2_dp2_zero_into_tp2_and_into_one(tmp_path):
    path = run_local(_save, 4, tmp_path, ParallelPlan(tp=2, dp=2, sharded_optimizer=True), 2)[0]
    _exact(run_local(_load_and_compare, 2, path, ParallelPlan(tp=2)))
    _exact([_load_and_compare(path, ONE)])


def test_keep_n_by_step_number_and_never_foreign_or_latest(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "step-000001").mkdir(parents=True)  # not ours: no meta.json
    (root / "notes").mkdir()
    for step in (999_998, 999_999, 1_000_000):  # by name, step-1000000 would sort first
        _save(tmp_path, ONE, step, keep=2)
    names = sorted(d.name for d in root.iterdir())
    assert names == ["latest", "notes", "step-000001", "step-1000000", "step-999999"]
    assert ck.find_checkpoint(tmp_path).name == "step-1000000"
    _save(tmp_path, ONE, 5, keep=1)  # `latest` now names step 5, older than the newest
    assert ck.find_checkpoint(tmp_path).name == "step-000005"
    assert {"step-000005", "step-1000000", "step-000001"} <= {d.name for d in root.iterdir()}
    assert not (root / "step-999999").exists()


def test_interrupted_save_keeps_latest_and_previous(tmp_path, monkeypatch):
    _save(tmp_path, ONE, 1)
    (tmp_path / "checkpoints" / ".tmp-step-000007-deadbeef").mkdir()  # another save's debris
    before = (tmp_path / "checkpoints" / "latest").read_text()

    def boom(tmp, final):
        raise KeyboardInterrupt

    monkeypatch.setattr(ck, "_publish", boom)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, ONE, 2)
    monkeypatch.undo()
    assert (tmp_path / "checkpoints" / "latest").read_text() == before
    assert ck.find_checkpoint(tmp_path).name == "step-000001"
    assert not (tmp_path / "checkpoints" / "step-000002").exists()
    assert [d.name for d in (tmp_path / "checkpoints").glob(".tmp-*")] == [".tmp-step-000007-deadbeef"]
    _exact([_load_and_compare(tmp_path, ONE)])
    _save(tmp_path, ONE, 3, keep=1)
    assert (tmp_path / "checkpoints" / ".tmp-step-000007-deadbeef").is_dir()


def test_incompatible_model_and_corruption_are_clear_errors(tmp_path):
    path = _save(tmp_path, ONE, 1)
    other = {**SHAPES, "w": ParamShape(shape=(8, 3), tp_dim=0)}
    with pytest.raises(ValueError, match=r"incompatible model: w has shape \(7, 3\) there, \(8, 3\) here"):
        ck.load_checkpoint(path, shapes=other, plan=ONE)
    fewer = {k: v for k, v in SHAPES.items() if k != "h"}
    with pytest.raises(ValueError, match="incompatible model: it has extra tensors"):
        ck.load_checkpoint(path, shapes=fewer, plan=ONE)
    assert ck.read_meta(tmp_path)["config"] == {"seed": 1}
    for f in ck.find_checkpoint(tmp_path).glob("*.distcp"):
        f.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="is corrupted"):
        ck.load_checkpoint(path, shapes=SHAPES, plan=ONE)


def test_rng_state_round_trip():
    import random

    state = json.loads(json.dumps(ck.rng_state()))
    a = (torch.rand(3), random.random())
    ck.restore_rng(state)
    b = (torch.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and a[1] == b[1]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_export_hf_loads_with_from_pretrained(tmp_path, dtype):
    from transformers import AutoModelForCausalLM

    from earl.runtime.hf_model import TORCH_DTYPES, build_builtin, load_policy

    policy = build_builtin("tiny", seed=3, dtype=dtype)
    full = {n: p.detach() for n, p in policy.model.named_parameters()}
    ck.export_hf(tmp_path / "hf", full, policy.model.config, policy.tokenizer, dtype)
    assert (tmp_path / "hf" / "model.safetensors").stat().st_size < 1.2 * sum(
        t.numel() * t.element_size() for t in full.values())  # bf16 stays bf16, no fp32 copy
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    got = dict(back.named_parameters())
    for n, t in full.items():
        assert got[n].dtype == TORCH_DTYPES[dtype] and torch.equal(got[n], t), n
    again = load_policy(str(tmp_path / "hf"), dtype=dtype)  # earl's loader: weights and tokenizer
    assert again.tokenizer.encode("x3") == policy.tokenizer.encode("x3")


def _gather_tp2(folder: str) -> bool:
    import torch.distributed as dist

    from earl.parallel import build_plan_groups
    from earl.runtime.hf_model import build_builtin
    from earl.runtime.tp import apply_tp, param_shapes

    plan = ParallelPlan(tp=2)
    policy = build_builtin("tiny", seed=4)
    expect = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    shapes = param_shapes(policy.model)
    g = build_plan_groups(plan)
    apply_tp(policy.model, 2, g.tp_rank, g.tp_group)
    full = ck.gather_full_params({n: p for n, p in policy.model.named_parameters()}, shapes, plan)
    if dist.get_rank() != 0:
        return full is None
    ck.export_hf(folder, full, policy.model.config, policy.tokenizer)
    return all(torch.equal(full[n], expect[n]) for n in expect) and set(full) == set(expect)


@pytest.mark.dist
def test_tp2_shards_gathered_to_rank0_export(tmp_path):
    from transformers import AutoModelForCausalLM

    from earl.runtime.hf_model import build_builtin

    assert run_local(_gather_tp2, 2, str(tmp_path / "hf")) == [True, True]
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    ref = build_builtin("tiny", seed=4).model
    for (n, a), (_, b) in zip(back.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(a, b), n


def test_corrupted_newest_names_the_intact_one_and_the_resume_command(tmp_path):
    _save(tmp_path, ONE, 1, keep=3)
    newest = Path(_save(tmp_path, ONE, 2, keep=3))
    for f in newest.glob("*.distcp"):
        f.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError) as e:
        ck.load_checkpoint(newest, shapes=SHAPES, plan=ONE)
    prev = tmp_path / "checkpoints" / "step-000001"
    msg = str(e.value)
    assert f"continue from it with earl run --resume {prev}" in msg and "\n" not in msg
    assert "CheckpointException" not in msg and "dict_keys" not in msg


def test_broken_latest_pointer_warns_naming_the_checkpoint_used(tmp_path, capsys):
    _save(tmp_path, ONE, 1, keep=3)
    (tmp_path / "checkpoints" / "latest").write_text("step-000009\n")
    assert ck.find_checkpoint(tmp_path).name == "step-000001"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'step-000009'" in err[0] and "step-000001" in err[0] and "warning" in err[0]


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path):
    """A real write failure: the resumed run's files may not grow past 256 KiB (RLIMIT_FSIZE, with
    SIGXFSZ ignored the kernel answers EFBIG), so step 3's DCP file cannot be written."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "earl.cli", "run", "--quiet"]
    sets = ["--set", "groups=2", "--set", "group_size=2", "--set", "checkpoint_every=1", "--set", "plots=false"]
    r = subprocess.run(base + ["--out", str(out), "--steps", "2", *sets], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

    r = subprocess.run(base + ["--resume", str(out), "--steps", "3"], capture_output=True, text=True, env=env,
                       timeout=120, preexec_fn=limit)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "checkpoint at step 3 not written: no room on the disk (File too large" in lines[0]
    assert f"step-000002 is intact; free space and continue with earl run --resume {out}" in lines[0]
    ck_dir = out / "checkpoints"
    assert ck.find_checkpoint(out).name == "step-000002" and not list(ck_dir.glob(".tmp-*"))


def test_ctrl_c_during_a_save_is_held_until_the_save_ends():
    """A Ctrl-C inside a checkpoint save is raised after it (one inside DCP's torch.save aborted
    the process with SIGABRT instead: earl.runtime.checkpoint._ctrl_c_after); a second one
    raises at once; Python's handler is back afterwards."""
    import signal

    from earl.runtime.checkpoint import _ctrl_c_after

    done = []
    with pytest.raises(KeyboardInterrupt):
        with _ctrl_c_after():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("rest of the save")
    assert done == ["rest of the save"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        with _ctrl_c_after():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("not reached")
    assert done == ["rest of the save"]
    with _ctrl_c_after():  # no Ctrl-C: nothing raised
        done.append("quiet")
    assert done[-1] == "quiet"
