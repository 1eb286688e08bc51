"""Python's cyclic garbage collector at step boundaries, on every rank alike.

Left automatic, the collector runs whenever allocations cross its thresholds: on a rank of
`earl run --nproc N` that is a few times a step, 1-3 ms each (generation 1, seen on the
2-core CPU host of docs/calibration.md) and once in a while a full collection of 150-180 ms,
at a different moment on each rank. In lockstep code (a gather per parameter tensor, the
dispatch executor's rounds) a pause on one rank stalls all of them, so the stages' times
scatter from step to step. Megatron-LM answers the same straggling with `--manual-gc`: the
collector disabled in the loop and run by hand every `--manual-gc-interval` steps. Here the
objects alive after set-up (model, optimizer, engine) are frozen out of every later
collection (`gc.freeze`), the automatic collector is off while steps run, and each rank
collects once every `gc_every` steps, after the step's last collective and outside every
stage span. The async pools (`schedule.mode=async`, earl.runtime.async_rl) do the same on each
rank at the end of its own step: a training rank after its weight push, a rollout replica after
handing its episodes to its sender thread.

    earl run --nproc 2 --set gc_every=1      # the default; 0 keeps Python's automatic collector
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass


@dataclass
class StepGC:
    """Context manager over a run's step loop; `step_done(step)` after each step. `every` 0:
    Python's automatic collector, untouched."""

    every: int  # steps between collections run by hand; 0: automatic
    collections: int = 0  # collections run by hand so far
    seconds: float = 0.0  # their total wall time, s
    _was_enabled: bool = True

    def __post_init__(self):
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"gc_every must be an int >= 0 (0: Python's automatic collector), got {self.every!r}")

    def __enter__(self) -> StepGC:
        if self.every:
            self._was_enabled = gc.isenabled()
            gc.collect()
            gc.freeze()  # set-up's objects: never traversed again
            gc.disable()
        return self

    def step_done(self, step: int) -> None:
        if self.every and step % self.every == 0:
            t0 = time.perf_counter()
            gc.collect()
            self.seconds += time.perf_counter() - t0
            self.collections += 1

    def __exit__(self, *exc) -> None:
        if self.every:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()
