"""Multi-turn rollouts: episodes played against environments, recorded token-in token-out.

A trajectory keeps the exact token ids the model saw and produced (prompt, then per turn the
generated tokens and the next observation's tokens) and a loss mask that is 1 only on the
generated tokens: observations are never trained on and the text is never re-tokenized. With a
chat template, observations are rendered as messages (earl.runtime.tokenizer.Conversation).

    python -c "from earl.runtime.rollout import demo; demo()"
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from earl.runtime.engine import Engine, SamplingParams, as_stepper
from earl.runtime.envs import Env
from earl.runtime.seeds import default_stream
from earl.runtime.tokenizer import Conversation


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
    # per token: the env's legal actions as bits (`legal_action_bits`) on each turn's first
    # generated token, where the env lists them; 0 elsewhere
    legal_bits: list[int] = field(default_factory=list)
    reward: float = 0.0  # episode return (sum of the step rewards)
    step_rewards: list[tuple[int, float]] = field(default_factory=list)  # (token index, reward)
    outcome: str = ""  # win | draw | loss | invalid | correct | wrong | truncated
    turns: list[Turn] = field(default_factory=list)
    actions: int = 0
    invalid_actions: int = 0
    messages: list[dict] = field(default_factory=list)  # the conversation (for transcripts)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def legal_per_token(self) -> list[int]:
        """`legal_bits`, or zeros for every token where the trajectory carries none (one made by
        hand: calibration, tests)."""
        return self.legal_bits or [0] * len(self.token_ids)

    @property
    def prompt_tokens(self) -> int:
        return self.turns[0].obs_tokens if self.turns else len(self.token_ids)

    def _append(self, ids: list[int], generated: bool, logprobs: list[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if generated else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.legal_bits.extend([0] * len(ids))


def _encode_obs(conv: Conversation, text: str, role: str = "user") -> list[int]:
    return conv.observe(text, role)


def play_episodes(engine: Engine, envs: list[Env], seeds: list[int], params: SamplingParams, *,
                  sample_seeds: list[int], max_context: int, group_ids: list[int],
                  episode_ids: list[int], legal_bits: bool = True) -> list[Trajectory]:
    """Play one episode per env together. `seeds` seed the environments; `sample_seeds` the
    engine's per-episode sampling streams; `legal_bits`: record the env's legal actions before
    each move (the legality term's input; off when `trainer.legal_coef` is 0).

    The engine batch is driven step by step (`as_stepper`): as soon as an episode's turn ends,
    its environment steps and its next observation is submitted, to join the running batch while
    other episodes still decode (a turn-synchronous engine simply generates all submitted turns
    together in each step). Each episode is a `Conversation`: with a chat template its messages
    are rendered by it, and the ids fed are exactly the ids trained on."""
    assert len(envs) == len(seeds) == len(group_ids) == len(episode_ids) == len(sample_seeds)
    trajs = [Trajectory(episode_id=e, group_id=g) for e, g in zip(episode_ids, group_ids, strict=True)]
    fed: dict[int, int] = {}  # tokens of the observation that started each episode's current turn
    first: dict[int, list[int]] = {}
    convs = []
    for i, (env, seed) in enumerate(zip(envs, seeds, strict=True)):
        prompt = env.reset(seed)
        convs.append(Conversation(engine.tokenizer, tools=getattr(env, "tool_schemas", None),
                                  context=getattr(env, "context", None)))
        trajs[i].messages = convs[i].messages
        first[i] = _encode_obs(convs[i], prompt)
        trajs[i]._append(first[i], generated=False)
        fed[i] = len(first[i])
    batch = as_stepper(engine.open(len(envs), sample_seeds))
    batch.submit(first, params)
    while batch.busy:
        for i, gen in batch.step().items():
            tr = trajs[i]
            start = len(tr.token_ids)
            tr._append(gen.token_ids, generated=True, logprobs=gen.logprobs)
            if legal_bits and gen.token_ids and hasattr(envs[i], "legal_action_bits"):  # before step changes the state
                tr.legal_bits[start] = envs[i].legal_action_bits()
            convs[i].reply(gen.token_ids, gen.text)
            t0 = time.perf_counter()
            res = envs[i].step(gen.text)
            tr.turns.append(Turn(fed[i], len(gen.token_ids), time.perf_counter() - t0))
            tr.reward += res.reward
            tr.step_rewards.append((len(tr.token_ids) - 1, res.reward))
            tr.actions += 1
            tr.invalid_actions += int(res.invalid)
            if res.done:
                tr.outcome = res.outcome
                batch.close([i])
                continue
            obs = _encode_obs(convs[i], res.observation, res.role)
            if len(tr.token_ids) + len(obs) + params.max_new_tokens > max_context:
                tr.outcome = "truncated"
                batch.close([i])
                continue
            tr._append(obs, generated=False)
            fed[i] = len(obs)
            batch.submit({i: obs}, params)
    return trajs


def rollout(engine: Engine, make_env: Callable[[], Env], *, seeds: list[int], group_ids: list[int],
            params: SamplingParams, sample_seeds: list[int] | None = None, max_context: int,
            engine_batch: int = 0, episode_ids: list[int] | None = None, legal_bits: bool = True) -> list[Trajectory]:
    """Episodes `episode_ids` (default 0..n-1), `engine_batch` at a time (0: all together).
    Episode i's environment gets `seeds[i]` and its sampling stream `sample_seeds[i]`
    (default: from the environment seed and the episode id: members of a group share their
    environment seed, never their stream), so what an episode plays never depends on the batch."""
    n = len(seeds)
    ids = list(range(n)) if episode_ids is None else list(episode_ids)
    streams = [default_stream(s, e) for s, e in zip(seeds, ids, strict=True)] if sample_seeds is None \
        else list(sample_seeds)
    chunk = engine_batch or n
    out: list[Trajectory] = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        envs = [make_env() for _ in range(start, stop)]
        out += play_episodes(engine, envs, seeds[start:stop], params, sample_seeds=streams[start:stop],
                             max_context=max_context, group_ids=group_ids[start:stop],
                             episode_ids=ids[start:stop], legal_bits=legal_bits)
    return out


def demo() -> None:
    from earl.runtime.engine import TorchEngine
    from earl.runtime.envs import make_env
    from earl.runtime.hf_model import load_policy

    pol = load_policy("tiny")
    eng = TorchEngine(pol.model, pol.tokenizer)
    trajs = rollout(eng, lambda: make_env("tic-tac-toe"), seeds=[0, 1], group_ids=[0, 1],
                    params=SamplingParams(max_new_tokens=1), max_context=512)
    for t in trajs:
        print(t.outcome, t.reward, repr(pol.tokenizer.decode(t.token_ids)))
