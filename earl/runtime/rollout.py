"""Multi-turn rollouts: episodes played against environments, recorded token-in token-out.

A trajectory keeps the exact token ids the model saw and produced (prompt, then per turn the
generated tokens and the next observation's tokens) and a loss mask that is 1 only on the
generated tokens: observations are never trained on and the text is never re-tokenized.

    python -c "from earl.runtime.rollout import demo; demo()"
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from earl.runtime.engine import Engine, SamplingParams
from earl.runtime.envs import Env


@dataclass
class Turn:
    obs_tokens: int  # tokens of the observation fed before this turn (turn 0: the prompt)
    gen_tokens: int  # tokens the model generated this turn
    env_latency_s: float  # seconds the environment took to answer this turn's action


@dataclass
class Trajectory:
    episode_id: int
    group_id: int  # episodes of a group share their environment seed (GRPO's prompt group)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 on generated tokens only
    logprobs: list[float] = field(default_factory=list)  # engine log-probs; 0 off the mask
    reward: float = 0.0  # episode return (sum of the step rewards)
    step_rewards: list[tuple[int, float]] = field(default_factory=list)  # (token index, reward)
    outcome: str = ""  # win | draw | loss | invalid | correct | wrong | truncated
    turns: list[Turn] = field(default_factory=list)
    actions: int = 0
    invalid_actions: int = 0

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def prompt_tokens(self) -> int:
        return self.turns[0].obs_tokens if self.turns else len(self.token_ids)

    def _append(self, ids: list[int], generated: bool, logprobs: list[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if generated else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def _encode_obs(engine: Engine, text: str, first: bool) -> list[int]:
    tok = engine.tokenizer
    ids = tok.encode(text)
    return ([tok.bos_id] if first and tok.bos_id is not None else []) + ids


def play_episodes(engine: Engine, envs: list[Env], seeds: list[int], params: SamplingParams,
                  generator: torch.Generator | None, *, max_context: int, group_ids: list[int],
                  first_episode_id: int = 0) -> list[Trajectory]:
    """Play one episode per env together, batching generation at turn boundaries."""
    assert len(envs) == len(seeds) == len(group_ids)
    trajs = [Trajectory(episode_id=first_episode_id + i, group_id=g) for i, g in enumerate(group_ids)]
    pending: dict[int, list[int]] = {}
    for i, (env, seed) in enumerate(zip(envs, seeds, strict=True)):
        pending[i] = _encode_obs(engine, env.reset(seed), first=True)
        trajs[i]._append(pending[i], generated=False)
    batch = engine.open(len(envs))
    while pending:
        outs = batch.generate(pending, params, generator)
        nxt: dict[int, list[int]] = {}
        for i, gen in outs.items():
            tr = trajs[i]
            tr._append(gen.token_ids, generated=True, logprobs=gen.logprobs)
            t0 = time.perf_counter()
            res = envs[i].step(gen.text)
            tr.turns.append(Turn(len(pending[i]), len(gen.token_ids), time.perf_counter() - t0))
            tr.reward += res.reward
            tr.step_rewards.append((len(tr.token_ids) - 1, res.reward))
            tr.actions += 1
            tr.invalid_actions += int(res.invalid)
            if res.done:
                tr.outcome = res.outcome
                continue
            obs = _encode_obs(engine, res.observation, first=False)
            if len(tr.token_ids) + len(obs) + params.max_new_tokens > max_context:
                tr.outcome = "truncated"
                continue
            tr._append(obs, generated=False)
            nxt[i] = obs
        batch.close([i for i in outs if i not in nxt])
        pending = nxt
    return trajs


def rollout(engine: Engine, make_env: Callable[[], Env], *, seeds: list[int], group_ids: list[int],
            params: SamplingParams, generator: torch.Generator | None, max_context: int,
            engine_batch: int = 0) -> list[Trajectory]:
    """All of a step's episodes, `engine_batch` at a time (0: all together)."""
    n = len(seeds)
    chunk = engine_batch or n
    out: list[Trajectory] = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        envs = [make_env() for _ in range(start, stop)]
        out += play_episodes(engine, envs, seeds[start:stop], params, generator,
                             max_context=max_context, group_ids=group_ids[start:stop],
                             first_episode_id=start)
    return out


def demo() -> None:
    from earl.runtime.engine import TorchEngine
    from earl.runtime.envs import make_env
    from earl.runtime.model import load_policy

    pol = load_policy("tiny")
    eng = TorchEngine(pol.model, pol.tokenizer)
    trajs = rollout(eng, lambda: make_env("tic-tac-toe"), seeds=[0, 1], group_ids=[0, 1],
                    params=SamplingParams(max_new_tokens=1), generator=torch.Generator().manual_seed(0),
                    max_context=512)
    for t in trajs:
        print(t.outcome, t.reward, repr(pol.tokenizer.decode(t.token_ids)))
