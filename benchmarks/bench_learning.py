"""Learning benchmark: run `earl run`'s default setup (tiny model, Tic-Tac-Toe vs the random
opponent; or any `--set`) for a fixed budget over several seeds and print, per seed, the
first-10-step vs last-10-step outcome rates, and whether the demo's target is met.

Games report win/draw/loss/invalid rates and the target below. Question-answer tasks
(`env.name=calculator`, `reasoning-gym:TASK`) report reward_mean and correct_rate, next to the
guessing baseline: the one answer commonest among the run's own questions, given to every
question and scored by the env (what a model that learns the answer format and the likeliest
answer, but no arithmetic, gets).

Target (games): in the last 10 steps, win >= 0.85 and invalid-move rate <= 0.02 (invalid moves
per move played), in at least 3 of 4 seeds. The budget is a number of steps and/or wall-clock
minutes, whichever ends first. Wall time on a shared machine depends on the load; the CPU
seconds each run used are printed too. Seeds run in sequence (`--jobs 1`) or two at a time.

`--probe STEPS` instead trains the tiny model supervised (no RL) to put its mass on the free
cells of random Tic-Tac-Toe positions, in each observation format, and prints P(legal move)
every 50 steps: whether the model can read the board at all, apart from how RL explores.

    OMP_NUM_THREADS=1 python benchmarks/bench_learning.py --seeds 0,1,2,3 --jobs 2 [--steps 600]
        [--minutes 30] [--set env.show=board ...]
    OMP_NUM_THREADS=1 python benchmarks/bench_learning.py --probe 200
    python benchmarks/bench_learning.py --curve RUN/metrics.csv   # a run's curve, 10-step means
    python benchmarks/bench_learning.py --summary RUN/seed0 RUN/seed1   # the table from run folders
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from earl.config_machinery import parse_sets
from earl.runtime.envs import OPTIONS, env_options, make_env, split_env_name
from earl.runtime.resolve import resolve_config
from earl.runtime.run import run_training
from earl.runtime.run_config import from_dict
from earl.runtime.seeds import mix_seed

WIN_TARGET, INVALID_TARGET = 0.85, 0.02  # last-10-step win rate (>=) and invalid-move rate (<=)
RATES = ("win_rate", "draw_rate", "loss_rate", "invalid_rate", "invalid_move_rate", "correct_rate",
         "truncated_rate", "reward_mean", "entropy")
TASK_RATES = ("reward_mean", "correct_rate", "invalid_move_rate", "truncated_rate", "entropy")
# how a reply states answer A, and where the env keeps the right answer after reset()
REPLY = {"calculator": ("ans {}", lambda env: env.answer),
         "reasoning-gym": ("{}", lambda env: env.entry["answer"])}


def is_game(env_name: str) -> bool:
    """An env played against an opponent (win/draw/loss), not a question with an answer."""
    return "opponent" in OPTIONS[split_env_name(env_name)[0]]


def rates_for(env_name: str) -> tuple[str, ...]:
    return RATES if is_game(env_name) else TASK_RATES


def guess_baseline(cfg, steps: int) -> dict | None:
    """The commonest right answer among the questions of the run's steps 1..`steps` (every group:
    the env seeds `play_episodes` uses), replied to each of them: {answer, n, reward_mean,
    correct_rate}, and of the 30 commonest answers the one whose constant reply earns the most
    reward (partial credit): best_reward, best_reward_mean. None for an env whose answers this
    does not know (games, jsonl, user envs)."""
    kind, _ = split_env_name(cfg.env.name)
    if kind not in REPLY:
        return None
    reply, answer_of = REPLY[kind]
    env = make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env))
    seeds = [mix_seed(cfg.seed, step, g) % (2**31) for step in range(1, steps + 1) for g in range(cfg.groups)]
    answers = []
    for seed in seeds:
        env.reset(seed)
        answers.append(str(answer_of(env)))
    counts = Counter(answers).most_common(30)

    def score(reply: str) -> tuple[float, float]:
        reward = correct = 0.0
        for seed in seeds:
            env.reset(seed)
            res = env.step(reply)
            reward += res.reward
            correct += res.outcome == "correct"
        return reward / len(seeds), correct / len(seeds)

    common = counts[0][0]
    scored = {a: score(reply.format(a)) for a, _ in counts}
    best = max(scored, key=lambda a: scored[a][0])
    return {"answer": common, "n": len(seeds), "reward_mean": scored[common][0], "correct_rate": scored[common][1],
            "best_reward": best, "best_reward_mean": scored[best][0]}


def run_seed(job: tuple[int, dict, str, float]) -> dict:
    """Train one seed; {first: {rate: mean}, last: {...}, steps, wall_s, cpu_s, out, line}."""
    seed, over, out, minutes = job
    cfg = resolve_config(overrides={**over, "seed": seed})
    t0, c0 = time.perf_counter(), time.process_time()

    def echo(line: str) -> None:
        print(f"[seed {seed} {time.perf_counter() - t0:5.0f}s] {line}", flush=True)

    rows = run_training(cfg, out, progress=False, echo=echo, deadline_s=60 * minutes).metrics
    return summarize(cfg, rows, time.perf_counter() - t0, time.process_time() - c0, out)


def summarize(cfg, rows: list[dict], wall_s: float, cpu_s: float, out: str) -> dict:
    """One run's result from its config and metrics rows (first/last 10 steps of each rate)."""

    def avg(rs):
        return {k: sum(float(r[k]) for r in rs) / len(rs) for k in RATES}

    return {"seed": cfg.seed, "first": avg(rows[:10]), "last": avg(rows[-10:]), "steps": len(rows),
            "wall_s": wall_s, "cpu_s": cpu_s, "out": out, "game": is_game(cfg.env.name),
            "guess": guess_baseline(cfg, len(rows)),
            "line": f"{cfg.model.path} on {cfg.env.name}"
                    f"{f' vs {cfg.env.opponent}' if is_game(cfg.env.name) else ''}, {cfg.trainer.algo}, "
                    f"lr {cfg.trainer.lr:g}, {cfg.groups} groups x {cfg.group_size}"}


def summarize_dir(run_dir: str) -> dict:
    """A finished (or stopped) run's result from its folder (config.json, metrics.csv); wall and
    CPU seconds are the sums of its steps' step_s and step_cpu_s (start-up not counted)."""
    d = Path(run_dir)
    cfg = from_dict(json.loads((d / "config.json").read_text()))
    with open(d / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return summarize(cfg, rows, sum(float(r["step_s"]) for r in rows), sum(float(r["step_cpu_s"]) for r in rows),
                     run_dir)


def probe_legal(show: str, steps: int, batch: int = 128, lr: float = 2e-3) -> list[tuple[int, float]]:
    """Supervised: maximise log P(legal move) of the tiny model on random positions (0-3 random
    moves each side, agent to play) rendered in `show`; [(step, mean P(legal))] every 50 steps."""
    from earl.runtime.envs.tictactoe import TicTacToe
    from earl.runtime.hf_model import build_builtin

    pol = build_builtin("tiny", seed=0)
    tok, model, rng = pol.tokenizer, pol.model, random.Random(0)

    def position() -> tuple[list[int], list[int]]:
        while True:
            env = TicTacToe(show=show)
            context = env.reset(rng.randrange(2**31))
            for _ in range(rng.randrange(4)):
                move = rng.choice(env.legal_moves())
                res = env.step(str(move))
                if res.done:
                    break
                context += f"{move}{res.observation}"
            if env.winner() is None:
                return [tok.bos_id, *tok.encode(context)], [tok.encode(str(c))[0] for c in env.legal_moves()]

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    out = []
    for step in range(steps + 1):
        rows = [position() for _ in range(batch)]
        width = max(len(ids) for ids, _ in rows)
        ids_BT = torch.zeros(batch, width, dtype=torch.long)
        legal_BV = torch.zeros(batch, tok.vocab_size, dtype=torch.bool)
        for i, (ids, legal) in enumerate(rows):
            ids_BT[i, :len(ids)] = torch.tensor(ids)
            legal_BV[i, legal] = True
        last = torch.tensor([len(ids) - 1 for ids, _ in rows])
        logits_BV = model(input_ids=ids_BT, attention_mask=(ids_BT != 0).long()).logits[torch.arange(batch), last]
        logp_BV = torch.log_softmax(logits_BV.float(), -1)
        loss = -torch.logsumexp(logp_BV.masked_fill(~legal_BV, float("-inf")), -1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            out.append((step, float(logp_BV.detach().exp().masked_fill(~legal_BV, 0).sum(-1).mean())))
    return out


CURVE = (("win", "win_rate"), ("loss", "loss_rate"), ("inv_move", "invalid_move_rate"), ("ent", "entropy"),
         ("s/step", "step_s"), ("cpu", "step_cpu_s"))


def curve(path: str, every: int = 10) -> list[str]:
    """A run's metrics.csv as lines of `every`-step means (the learning curve, so that runs
    stopped at different steps compare at the same step)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = [f"{path}: {len(rows)} steps"]
    for i in range(0, len(rows), every):
        chunk = rows[i:i + every]
        cells = " ".join(f"{name} {sum(float(r[k]) for r in chunk) / len(chunk):.3f}" for name, k in CURVE)
        out.append(f"  step {int(chunk[-1]['step']):4d} {cells}")
    return out


def met(res: dict) -> bool:
    last = res["last"]
    return last["win_rate"] >= WIN_TARGET and last["invalid_move_rate"] <= INVALID_TARGET


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0", help="comma-separated run seeds, e.g. 0,1,2,3")
    ap.add_argument("--jobs", type=int, default=1, choices=(1, 2), help="seeds trained at once")
    ap.add_argument("--minutes", type=float, default=30.0, help="wall-clock budget per seed")
    ap.add_argument("--steps", type=int, default=0, help="0: the default config's steps")
    ap.add_argument("--out", default="", help="folder for the runs (one sub-folder per seed)")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--probe", type=int, default=0, help="steps of the supervised legality probe (no RL)")
    ap.add_argument("--summary", nargs="+", default=[], metavar="RUN_DIR",
                    help="print the summary table of these run folders (one per seed) and exit")
    ap.add_argument("--curve", nargs="+", default=[], metavar="METRICS_CSV",
                    help="print these runs' curves (10-step means) and exit")
    args = ap.parse_args()
    if args.curve:
        for path in args.curve:
            print("\n".join(curve(path)))
        return
    if args.summary:
        results = [summarize_dir(d) for d in args.summary]
        print("\n".join(report(results, 0, sum(r["wall_s"] for r in results), ", ".join(args.summary))))
        return
    if args.probe:
        torch.set_num_threads(1)
        for show in ("board", "moves"):
            print(f"show={show}: P(legal) by step " +
                  ", ".join(f"{step}: {p:.3f}" for step, p in probe_legal(show, args.probe)), flush=True)
        return
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    over = parse_sets(args.sets)
    if args.steps:
        over["steps"] = args.steps
    over.setdefault("plots", "false")
    resolve_config(overrides=over)  # a bad --set fails here, before any run starts
    root = Path(args.out or tempfile.mkdtemp(prefix="earl-bench-learning-"))
    jobs = [(s, over, str(root / f"seed{s}"), args.minutes) for s in seeds]
    t0 = time.perf_counter()
    if args.jobs == 1 or len(jobs) == 1:
        results = [run_seed(j) for j in jobs]
    else:
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.map(run_seed, jobs, chunksize=1)
    print("\n".join(report(results, args.jobs, time.perf_counter() - t0, root)))


def report(results: list[dict], jobs: int, wall_s: float, root) -> list[str]:
    """The summary table: per seed, first 10 -> last 10 steps of each rate; for games whether the
    target is met, for question-answer tasks the guessing baseline."""
    game = results[0]["game"]
    rates = RATES if game else TASK_RATES
    how = f"{jobs} at a time, {wall_s:.0f}s wall in all" if jobs else "from their run folders (wall, CPU: steps only)"
    out = [f"\n{results[0]['line']}; {len(results)} seeds, {how}; runs under {root}",
           f"{'seed':>4s} {'steps':>5s} {'wall s':>6s} {'CPU s':>6s}  " +
           "  ".join(f"{k.removesuffix('_rate'):>12s}" for k in rates) + ("  target" if game else "")]
    for r in results:
        cells = "  ".join(f"{r['first'][k]:5.3f}->{r['last'][k]:5.3f}" for k in rates)
        out.append(f"{r['seed']:4d} {r['steps']:5d} {r['wall_s']:6.0f} {r['cpu_s']:6.0f}  {cells}"
                   + (f"  {'met' if met(r) else 'NOT met'}" if game else ""))
    if game:
        n = sum(met(r) for r in results)
        out.append(f"target (last 10 steps: win >= {WIN_TARGET}, invalid moves <= {INVALID_TARGET} per move): "
                   f"met in {n} of {len(results)} seeds (first 10 -> last 10 steps above)")
        return out
    last = sum(r["last"]["correct_rate"] for r in results) / len(results)
    out.append(f"correct_rate over the last 10 steps, mean of {len(results)} seeds: {last:.3f}")
    for r in results:
        if g := r["guess"]:
            out.append(f"seed {r['seed']} guessing baseline: always answering {g['answer']!r} (the commonest "
                       f"answer of the run's {g['n']} questions): correct_rate {g['correct_rate']:.3f}, "
                       f"reward_mean {g['reward_mean']:.3f}; the most rewarded constant answer "
                       f"{g['best_reward']!r}: reward_mean {g['best_reward_mean']:.3f}")
    return out

if __name__ == "__main__":
    main()
