"""GPU checks: the runtime, the engine, calibration and validation on CUDA. Marked `gpu`; they
skip without CUDA (tests/conftest.py). studies/gpu_check.sh runs them on a lent GPU.

    python -m pytest -m gpu tests/gpu -q
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_tiny():
    import torch

    from earl.runtime.hf_model import load_policy

    pol = load_policy("tiny", seed=0)
    pol.model.to("cuda")
    return pol, torch


def test_engine_equals_hf_forward_on_cuda(cuda_tiny):
    """Greedy tokens and their log-probs from the engine (KV cache across turns) equal one full
    forward pass of the final sequence."""
    from earl.runtime.engine import SamplingParams, TorchEngine

    pol, torch = cuda_tiny
    eng = TorchEngine(pol.model, pol.tokenizer)
    batch = eng.open(3, seeds=[1, 2, 3])
    tok = pol.tokenizer
    inputs = {0: tok.encode("hello"), 1: tok.encode("a longer prompt"), 2: tok.encode("x")}
    seqs = {r: [] for r in inputs}
    marks = {r: [] for r in inputs}
    for turn in range(3):
        outs = batch.generate(inputs, SamplingParams(temperature=0, max_new_tokens=5, stop_at_eos=False))
        for r, o in outs.items():
            seqs[r] += inputs[r]
            marks[r] += [(len(seqs[r]) + i, lp) for i, lp in enumerate(o.logprobs)]
            seqs[r] += o.token_ids
        inputs = {r: tok.encode(f" obs {turn}") for r in outs}
    with torch.no_grad():
        for r, ids in seqs.items():
            x = torch.tensor(ids, device="cuda")[None]
            logp = torch.log_softmax(pol.model(input_ids=x).logits[0].float(), -1)
            for pos, lp in marks[r]:
                assert ids[pos] == int(logp[pos - 1].argmax())
                assert abs(float(logp[pos - 1, ids[pos]]) - lp) < 1e-3


def test_compiled_decode_blocks_on_cuda_equal_eager(cuda_tiny):
    """Blocks of 8 decode steps through the compiled step (forward + sampling in one CUDA graph
    per width, tokens fed back on the device) sample what eager single steps sample, token for
    token, across turns that end mid-block; and sync once per block. No compiled graph fell back
    from CUDA graphs (Inductor counts those skips: a mutated cache that is not a static address,
    say, would run without graphs and without a word)."""
    from torch._dynamo.utils import counters

    from earl.runtime.engine import SamplingParams, TorchEngine

    pol, torch = cuda_tiny
    skips0 = counters["inductor"]["cudagraph_skips"]
    tok = pol.tokenizer
    inputs0 = {r: tok.encode(p) for r, p in enumerate(["hello", "a longer prompt", "x", "12+3="])}
    out = {}
    for compile_, k in ((False, 1), (True, 8), (True, 8)):  # the second compiled run replays the graphs
        eng = TorchEngine(pol.model, tok, max_batch=4, step_tokens=64, compile=compile_, decode_steps=k)
        batch = eng.open(4, seeds=[5, 6, 7, 8])
        inputs, got = dict(inputs0), []
        for turn in range(3):
            params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=5 + 4 * turn, stop=("q",),
                                    stop_at_eos=False)
            outs = batch.generate(inputs, params)
            got += [(r, o.token_ids, o.logprobs, o.finish) for r, o in sorted(outs.items())]
            inputs = {r: tok.encode(f" obs {turn}") for r in outs}
        out[(compile_, len(out))] = (got, eng.stats)
    (ref, s1), (a, s8), (b, _) = out.values()
    for x in (a, b):
        assert [(r, ids, f) for r, ids, _, f in x] == [(r, ids, f) for r, ids, _, f in ref]
        for (_, _, la, _), (_, _, lb, _) in zip(x, ref, strict=True):
            assert max(abs(p - q) for p, q in zip(la, lb, strict=True)) < 2e-3
    assert s8.host_syncs < s1.host_syncs
    assert counters["inductor"]["cudagraph_skips"] == skips0


def test_one_process_run_on_cuda(tmp_path):
    """`earl run` on one GPU: two steps, finite losses, peak memory from max_memory_allocated."""
    from earl.runtime.resolve import resolve_config
    from earl.runtime.run import run_training

    cfg = resolve_config(overrides={"model.device": "cuda", "groups": 4, "group_size": 2, "steps": 2,
                                    "plots": "false"})
    res = run_training(cfg, tmp_path / "run", progress=False, echo=lambda s: None)
    assert [r["step"] for r in res.metrics] == [1, 2]
    for r in res.metrics:
        assert math.isfinite(r["loss"]) and r["peak_mem_bytes"] > 0 and r["world"] == 1
    assert (tmp_path / "run" / "hf" / "model.safetensors").is_file()


def test_nccl_world_one_equals_in_process_run(tmp_path):
    """The torchrun path with an NCCL process group (one GPU) computes what the in-process run
    (its own one-rank group) computes."""
    from earl.runtime.resolve import resolve_config
    from earl.runtime.run import run_training
    from earl.runtime.run_config import to_dict

    cfg = resolve_config(overrides={"model.device": "cuda", "groups": 4, "group_size": 2, "steps": 2,
                                    "plots": "false"})
    ref = run_training(cfg, tmp_path / "a", progress=False, echo=lambda s: None).metrics
    conf = tmp_path / "cfg.json"
    conf.write_text(json.dumps(to_dict(cfg)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                        "-m", "earl.runtime.launch", "--config", str(conf), "--out", str(tmp_path / "b")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    for x, y in zip(ref, rows, strict=True):
        assert x["reward_mean"] == y["reward_mean"] and x["tokens"] == y["tokens"]
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-6)


def test_training_step_on_cuda_equals_cpu(cuda_tiny):
    """One training step (loss, backward, optimizer strategy) on the GPU equals the CPU's."""
    import copy

    import torch

    from earl.parallel import build_plan_groups
    from earl.runtime.dist import process_group
    from earl.runtime.optim import ReplicatedAdamW
    from earl.runtime.run_config import TrainerConfig
    from earl.runtime.tp import param_shapes
    from earl.runtime.trainer import ExperienceBatch, Trainer, train_step
    from earl.specs import ParallelPlan

    pol, _ = cuda_tiny
    gen = torch.Generator().manual_seed(0)
    n, t = 4, 24
    ids = torch.randint(3, 60, (n, t), generator=gen)
    attn = torch.ones(n, t, dtype=torch.bool)
    mask = torch.zeros(n, t, dtype=torch.bool)
    mask[:, 10:] = True
    batch = ExperienceBatch(sample_ids=torch.arange(n), group_ids=torch.arange(n), input_ids=ids,
                            attention_mask=attn, loss_mask=mask, engine_logprobs=torch.zeros(n, t),
                            rewards=torch.zeros(n), token_rewards=torch.zeros(n, t),
                            turn_ids=torch.zeros(n, t, dtype=torch.long), old_logprobs=-torch.rand(n, t, generator=gen),
                            ref_logprobs=torch.zeros(n, t), advantages=torch.randn(n, t, generator=gen) * mask)
    cfg = TrainerConfig(lr=1e-3)
    out = {}
    with process_group():
        for dev in ("cpu", "cuda"):
            model = copy.deepcopy(pol.model).to(dev).float()
            optim = ReplicatedAdamW(model, param_shapes(model), build_plan_groups(ParallelPlan()), cfg)
            stats = train_step(Trainer(model, cfg, temperature=1.0), optim, batch)
            out[dev] = (stats, {k: v.detach().cpu() for k, v in model.state_dict().items()})
    (a, wa), (b, wb) = out["cpu"], out["cuda"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-5)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-4), k


def test_calibrate_on_cuda(tmp_path):
    """`earl calibrate --device cuda` writes a profile whose GEMM curve is at most the peak."""
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "earl.cli", "calibrate", "--device", "cuda", "--budget-s", "25",
                        "--phases", "matmul,memory", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    prof = json.loads(out.read_text())
    assert 0 < prof["matmul"]["peak_frac"] <= 1.0
    assert prof["hardware"]["peak_flops"] < 5e15  # no runaway fit (seen once: 3.5e19)


def test_validate_on_cuda_compares_peak_memory(tmp_path):
    """`earl validate --device cuda`: per-stage errors and peak memory against
    torch.cuda.max_memory_allocated."""
    out = tmp_path / "v"
    r = subprocess.run([sys.executable, "-m", "earl.cli", "validate", "--device", "cuda", "--steps", "2",
                        "--hardware", "h200-measured", "--out", str(out), "--set", "groups=2", "--set", "group_size=2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((out / "validation.json").read_text())
    assert rep["memory_comparable"] is True
    assert {s["stage"] for s in rep["stages"]} >= {"rollout", "experience", "train"}
    assert all(v["peak_mem_measured"] > 0 and v["peak_mem_predicted"] > 0 for v in rep["variants"])
