"""A worked example of a user environment: guess a secret number, told "higher" or "lower".

It implements earl's `Env` protocol (docs/environments.md): `reset(seed)` returns the first
observation, `step(action)` a `StepResult`; `max_new_tokens` and `stop` set the generation
budget of each turn. Its options come from `[env] options` ("KEY=VALUE" strings). Train on it:

    earl run --env examples/guess_number.py:GuessNumber --steps 30 --set groups=32
    earl run --env examples/guess_number.py:GuessNumber --set env.options=high=4,max_guesses=2

Rewards: 1 for guessing right (less 0.2 per extra guess), 0 when the guesses run out, -0.5 for a
reply that is not a number in range (the episode ends). A model from random weights first learns
to answer with a digit, then to use the hints.
"""

from __future__ import annotations

import random

from earl.runtime.envs import StepResult


class GuessNumber:
    max_new_tokens = 1  # one digit per turn
    stop = ("\n",)

    def __init__(self, *, high: int = 8, max_guesses: int = 4):
        if not 2 <= high <= 9:
            raise ValueError(f"high must be in 2..9 (one digit), got {high}")
        if max_guesses < 1:
            raise ValueError(f"max_guesses must be >= 1, got {max_guesses}")
        self.high, self.max_guesses = high, max_guesses
        self.secret = 1
        self.guesses = 0

    def reset(self, seed: int) -> str:
        self.secret = random.Random(seed).randint(1, self.high)
        self.guesses = 0
        return f"guess 1-{self.high}\n"

    def step(self, action: str) -> StepResult:
        text = action.strip()
        if not text.isdigit() or not 1 <= int(text) <= self.high:
            return StepResult(observation="invalid\n", reward=-0.5, done=True, invalid=True, outcome="invalid")
        self.guesses += 1
        guess = int(text)
        if guess == self.secret:
            return StepResult(observation="right\n", reward=1.0 - 0.2 * (self.guesses - 1), done=True,
                              outcome="win")
        if self.guesses >= self.max_guesses:
            return StepResult(observation="out of guesses\n", reward=0.0, done=True, outcome="loss")
        return StepResult(observation=("higher\n" if guess < self.secret else "lower\n"), reward=0.0, done=False)
