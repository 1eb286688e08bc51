"""Procedural task suites of the reasoning-gym package (`--env reasoning-gym:TASK`): generated
questions, scored by the package's own scorer; nothing to download.

An episode is one question, item `seed` of the task's generator (seeded with the option `seed`,
default 0); the reply (or the text inside its last `<answer>...</answer>`) is the answer and the
task's score in [0, 1] the reward. `env.options` configure the generator. The package is
imported on first use; absent, the env is a one-line error naming the install command. More:
docs/environments.md.

    pip install 'earl[rgym]'
    earl run --env reasoning-gym:chain_sum --set env.options=max_terms=2,max_digits=1 --steps 20
"""

from __future__ import annotations

import functools
import re

from earl.runtime.envs.base import StepResult, parse_options
from earl.specs import unknown_name_error

INSTALL = "pip install 'earl[rgym]' (or pip install reasoning-gym)"
DATASET_SIZE = 2**31 - 1  # items are generated on demand from (generator seed, index)
_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def _package():
    try:
        import reasoning_gym
    except ImportError as e:
        raise ValueError(f"env reasoning-gym:TASK needs the reasoning-gym package: {INSTALL} ({e})") from None
    return reasoning_gym


@functools.lru_cache(maxsize=16)
def task_dataset(task: str, options: tuple[str, ...]):
    """The task's generator with the options (built once per process)."""
    rg = _package()
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise unknown_name_error("reasoning-gym task", task, DATASETS)
    kwargs = {"seed": 0, **parse_options(options, f"env reasoning-gym:{task}"), "size": DATASET_SIZE}
    try:
        return rg.create_dataset(task, **kwargs)
    except Exception as e:  # noqa: BLE001 - the package's config checks raise TypeError, AssertionError, ...
        raise ValueError(f"env reasoning-gym:{task}: options {dict(kwargs)} rejected: "
                         f"{type(e).__name__}: {e}") from None


def extract_answer(reply: str) -> str:
    found = _ANSWER.findall(reply)
    return (found[-1] if found else reply).strip()


class ReasoningGymEnv:
    """One generated question per episode, answered in one turn."""

    max_new_tokens = 32
    stop: tuple[str, ...] = ("\n",)

    def __init__(self, task: str, *, options: tuple[str, ...] = ()):
        self.task = task
        self.dataset = task_dataset(task, tuple(options))
        self.entry: dict = {}

    def reset(self, seed: int) -> str:
        self.entry = self.dataset[seed % DATASET_SIZE]
        return f"{self.entry['question']}\n"

    def step(self, action: str) -> StepResult:
        try:
            score = float(self.dataset.score_answer(extract_answer(action), self.entry))
        except Exception as e:  # noqa: BLE001 - a scorer failing on odd text ends the episode, not the run
            return StepResult(observation="", reward=0.0, done=True, outcome="env_error",
                              info={"env_error": f"{type(e).__name__}: {e}"})
        return StepResult(observation="", reward=score, done=True,
                          outcome="correct" if score >= 1.0 else "wrong",
                          info={"answer": self.entry["answer"]})
