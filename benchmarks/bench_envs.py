"""Environment benchmark: the OpenSpiel adapter next to the built-in game, in one run.

1. Learning: the default `earl run` setup (tiny model, reinforce++) on the built-in
   `tic-tac-toe` and on `openspiel:tic_tac_toe`, both against the random opponent, each for the
   same budget (steps and wall minutes, whichever ends first; CPU seconds printed): first 10
   vs last 10 steps, win rate and invalid-move rate.
2. Host cost per turn: environment step plus observation encoding (the character tokenizer),
   with random legal moves and no model, for both; their ratio.

    python benchmarks/bench_envs.py [--minutes 3] [--steps 150] [--games 2000] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

from earl.config_machinery import parse_sets
from earl.runtime.envs import make_env
from earl.runtime.resolve import resolve_config
from earl.runtime.run import run_training
from earl.runtime.tokenizer import CharTokenizer, Conversation

ENVS = ("tic-tac-toe", "openspiel:tic_tac_toe")


def learn(name: str, minutes: float, steps: int, sets: list[str]) -> tuple[list[dict], float, float]:
    over = {**parse_sets(sets), "env.name": name, "plots": "false", "steps": steps}
    cfg = resolve_config(overrides=over)
    out = tempfile.mkdtemp(prefix="earl-bench-envs-")
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_training(cfg, out, progress=False, echo=lambda s: None, deadline_s=60 * minutes)
    return res.metrics, time.perf_counter() - t0, time.process_time() - c0


def legal(env, obs: str) -> list[str]:
    if hasattr(env, "state"):  # OpenSpiel: the ids after "legal:"
        return obs.rsplit("legal: ", 1)[1].split()
    return [str(m) for m in env.legal_moves()]


def host_cost_per_turn(name: str, games: int) -> tuple[float, int]:
    """Seconds per turn of env.step + observation encoding; random legal moves."""
    tok, rng = CharTokenizer(), random.Random(0)
    turns, spent = 0, 0.0
    for g in range(games):
        env = make_env(name)
        t0 = time.perf_counter()
        conv = Conversation(tok)
        obs = env.reset(g)
        conv.observe(obs)
        spent += time.perf_counter() - t0
        while True:
            move = rng.choice(legal(env, obs))
            t0 = time.perf_counter()
            res = env.step(move)
            if not res.done:
                conv.observe(res.observation)
            spent += time.perf_counter() - t0
            turns += 1
            if res.done:
                break
            obs = res.observation
    return spent / turns, turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="wall budget per environment")
    ap.add_argument("--steps", type=int, default=150, help="step budget per environment")
    ap.add_argument("--games", type=int, default=2000, help="games for the host-cost measurement")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()

    print(f"host cost per turn (env step + observation encoding, random legal moves, {args.games} games):")
    cost = {}
    for name in ENVS:
        cost[name], turns = host_cost_per_turn(name, args.games)
        print(f"  {name:24s} {cost[name] * 1e6:8.1f} us/turn over {turns} turns")
    print(f"  ratio openspiel / built-in: {cost[ENVS[1]] / cost[ENVS[0]]:.2f}x")

    print(f"\nlearning vs random, tiny model, budget {args.steps} steps or {args.minutes:g} min each:")
    results = {name: learn(name, args.minutes, args.steps, args.sets) for name in ENVS}

    def avg(rs, k):
        return sum(r[k] for r in rs) / len(rs)

    print(f"{'':36s}" + "".join(f"{n:>30s}" for n in ENVS))
    print(f"{'steps, wall s, CPU s':36s}" + "".join(f"{f'{len(r)}, {w:.0f}, {c:.0f}':>30s}"
                                                  for r, w, c in results.values()))
    for k in ("win_rate", "invalid_move_rate", "reward_mean", "context_mean"):
        cells = "".join(f"{f'{avg(r[:10], k):.3f} -> {avg(r[-10:], k):.3f}':>30s}" for r, _, _ in results.values())
        print(f"{k + ' (first->last 10)':36s}{cells}")


if __name__ == "__main__":
    main()
