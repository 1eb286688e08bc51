"""The run on one process (a world of size 1) end to end on the tiny model: outputs, exact
resume, the hardware profile reaching the selector, and bad input via the CLI."""

import json

import pytest
from typer.testing import CliRunner

from earl.cli import app
from earl.runtime.checkpoint import find_checkpoint
from earl.runtime.resolve import resolve_config
from earl.runtime.run import run_training

SMALL = {"groups": 2, "group_size": 4, "checkpoint_every": 2, "plots": "false", "threads": 1}


def small(**kw):
    return resolve_config(overrides={**SMALL, **kw})


def deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items()
            if not (k.endswith("_s") or k in ("gen_tokens_per_s", "peak_mem_bytes", "control_recv_bytes"))}


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "a"
    return run_training(small(steps=4), out, progress=False, echo=lambda s: None)


def test_run_writes_all_outputs(four_steps):
    out = four_steps.out_dir
    for f in ("metrics.csv", "metrics.jsonl", "workload.jsonl", "decisions.jsonl", "trace.json",
              "config.json"):
        assert (out / f).is_file(), f
    rows = four_steps.metrics
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["episodes"] == 8
        assert sum(r[f"{o}_rate"] for o in ("win", "draw", "loss", "invalid", "truncated")) == pytest.approx(1)
        assert r["rollout_s"] > 0 and r["train_s"] > 0 and r["tokens"] > 0
    # the workload trace the simulator replays: one line per step, turns of [obs, gen, latency]
    lines = [json.loads(x) for x in (out / "workload.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    ep = lines[0]["episodes"][0]
    assert set(ep) == {"id", "turns"} and len(ep["turns"][0]) == 3 and ep["turns"][0][0] > 1
    # the selector was consulted before each of the three stages every step
    dec = [json.loads(x) for x in (out / "decisions.jsonl").read_text().splitlines()]
    assert [d["stage"] for d in dec[:3]] == ["rollout", "experience", "train"] and len(dec) == 12
    trace = json.loads((out / "trace.json").read_text())
    cats = {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"rollout", "experience", "dispatch", "train", "select"} <= cats
    # every span carries the CPU seconds its process used meanwhile (earl.calibrate.validate.
    # compute_shares): the rollout computes throughout on one thread, so about one core's worth
    # (the process's other threads, e.g. the metrics writer's, may add a little; a loaded host takes some)
    timed = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(e["args"]["cpu_s"] >= 0 for e in timed)
    rollout = [e for e in timed if e["name"] == "rollout"]
    assert 0 < sum(e["args"]["cpu_s"] for e in rollout) < 2 * sum(e["dur"] / 1e6 for e in rollout)
    # ... and its own thread's (the process's less gloo's and the writers' threads), which the
    # process's holds
    assert all(0 <= e["args"]["thread_cpu_s"] <= e["args"]["cpu_s"] + 1e-3 for e in timed)
    assert sum(e["args"]["thread_cpu_s"] for e in rollout) > 0.5 * sum(e["args"]["cpu_s"] for e in rollout)
    # ... and the seconds its thread waited for a core (the kernel's schedstat; 0 without it):
    # CPU and run-queue wait together fit in the wall time
    assert all(e["args"]["wait_s"] >= 0 for e in timed)
    assert all(e["args"]["thread_cpu_s"] + e["args"]["wait_s"] <= e["dur"] / 1e6 + 2e-3 for e in timed)
    # ... and the process's system time (part of its CPU) and minor page faults meanwhile
    assert all(0 <= e["args"]["sys_s"] <= e["args"]["cpu_s"] + 1e-3 for e in timed)
    assert all(isinstance(e["args"]["minflt"], int) and e["args"]["minflt"] >= 0 for e in timed)
    assert find_checkpoint(out).name == "step-000004"
    assert len(list((out / "checkpoints").glob("step-*"))) == 2  # keep_checkpoints


def test_resume_is_exact(four_steps, tmp_path):
    out = tmp_path / "b"
    first = run_training(small(steps=4), out, progress=False, echo=lambda s: None, stop_at=2)
    assert first.last_step == 2 and find_checkpoint(out).name == "step-000002"
    cfg = resolve_config(resume=out)
    res = run_training(cfg, out, resume=out, progress=False, echo=lambda s: None)
    assert res.first_step == 3
    assert [deterministic(r) for r in res.metrics] == [deterministic(r) for r in four_steps.metrics]
    wa = (four_steps.out_dir / "workload.jsonl").read_text().splitlines()
    wb = (out / "workload.jsonl").read_text().splitlines()
    strip = lambda line: [[t[:2] for t in e["turns"]] for e in json.loads(line)["episodes"]]
    assert [strip(x) for x in wa] == [strip(x) for x in wb]


def test_reinforce_pp_with_kl_runs(tmp_path):
    res = run_training(small(steps=2, **{"trainer.algo": "reinforce++", "trainer.kl_coef": "0.05",
                                  "policy.selector": "earl-table",
                                  "policy.dispatcher": "centralized"}),
                tmp_path / "c", progress=False, echo=lambda s: None)
    assert res.metrics[0]["kl"] == pytest.approx(0, abs=1e-6)  # policy == reference at step 1
    assert all(r["grad_norm"] >= 0 for r in res.metrics)


def test_calculator_env_runs(tmp_path):
    res = run_training(small(steps=1, **{"env.name": "calculator", "sampling.max_new_tokens": "6",
                                  "trainer.algo": "grpo"}),
                tmp_path / "d", progress=False, echo=lambda s: None)
    r = res.metrics[0]
    assert r["correct_rate"] + r["wrong_rate"] + r["truncated_rate"] == pytest.approx(1)


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


def test_cli_bad_input(tmp_path, four_steps):
    runner = CliRunner()
    base = ["run", "--out", str(tmp_path / "x"), "--quiet"]
    assert "unknown env" in one_line_error(runner.invoke(app, base + ["--env", "chess"]))
    (tmp_path / "m").mkdir()
    assert "config.json" in one_line_error(runner.invoke(app, base + ["--model", str(tmp_path / "m")]))
    assert "did you mean" in one_line_error(runner.invoke(app, base + ["--set", "trainer.lrr=1"]))
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text("[trainer]\nlearning_rate = 0.1\n")
    assert "unknown config key" in one_line_error(runner.invoke(app, [*base, str(cfg_file)]))
    assert "no checkpoint" in one_line_error(runner.invoke(app, base + ["--resume", str(tmp_path)]))
    # a corrupted checkpoint: garbage weight shards
    import shutil

    run = tmp_path / "corrupt"
    shutil.copytree(four_steps.out_dir, run)
    for f in find_checkpoint(run).glob("*.distcp"):
        f.write_bytes(b"\x00" * 100)
    msg = one_line_error(runner.invoke(app, ["run", "--resume", str(run), "--steps", "6", "--quiet"]))
    assert "corrupted" in msg


def test_hardware_profile_reaches_the_selector(tmp_path):
    """`hardware.profile` (earl run --hardware) is what the selector's cost model prices with."""
    predicted = {}
    for hw in ("cpu-measured", "h100-sxm-80gb"):
        lines = []
        run_training(small(steps=1, **{"policy.selector": "cost-model", "hardware.profile": hw}), tmp_path / hw,
              progress=False, echo=lines.append)
        assert f"hardware profile {hw} (given)" in lines[0]
        dec = [json.loads(x) for x in (tmp_path / hw / "decisions.jsonl").read_text().splitlines()]
        predicted[hw] = [d["predicted"] for d in dec if d["stage"] == "train"][0]
    assert predicted["cpu-measured"] != predicted["h100-sxm-80gb"]
    lines = []
    run_training(small(steps=1), tmp_path / "auto", progress=False, echo=lines.append)
    assert "hardware profile cpu-measured (calibrated, shipped)" in lines[0]
    help_text = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    assert "--hardware" in help_text
    msg = one_line_error(CliRunner().invoke(app, ["run", "--out", str(tmp_path / "z"), "--hardware", "tpu-v9"]))
    assert "tpu-v9" in msg


@pytest.mark.slow
def test_compiled_decode_run_equals_eager(tmp_path):
    """`compile_decode=true` (decode steps through torch.compile) samples the very tokens the
    eager engine does: the same episodes, rewards and token counts; losses to float noise. The
    calculator env, since its turns run decode blocks (a Tic-Tac-Toe move is one token)."""
    calc = {"env.name": "calculator", "sampling.max_new_tokens": "6", "trainer.algo": "grpo"}
    runs = [run_training(small(steps=2, compile_decode=c, **calc), tmp_path / c, progress=False, echo=lambda s: None)
            for c in ("false", "true")]
    for a, b in zip(runs[0].metrics, runs[1].metrics, strict=True):
        a, b = deterministic(a), deterministic(b)
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float):
                assert b[k] == pytest.approx(a[k], rel=1e-3, abs=1e-4), k
            else:
                assert b[k] == a[k], k
    for res, compiled in zip(runs, (False, True), strict=True):
        trace = json.loads((res.out_dir / "trace.json").read_text())
        spans = [e["args"] for e in trace["traceEvents"] if e.get("cat") == "rollout" and e["ph"] == "X"]
        assert spans and all(a["host_syncs"] > 0 for a in spans)
        assert (spans[-1]["compiled_shapes"] > 0) == compiled
