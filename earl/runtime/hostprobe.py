"""The host probe: one fixed eager loop whose CPU time tells how fast this host runs right now.

On a shared CPU host (a VM's vCPUs, other tenants, frequency scaling) the same work takes
+-30% more or less from one second to the next (calibration logs: one loop's lone time
0.107-0.194 s within three seconds). A profile's constants are fitted at the host's speed
during `earl calibrate`; a run that meets a slower host is slower on every stage at once. The
probe measures that speed the same way on both sides: `earl calibrate` times it through the
phases whose constants price a stage (HardwareProfile.host_probe_s: between the one-process
cases; host_probe_ranks_s: on the gloo ranks of phases fsdp and dispatch, between their timed
repeats) and a run with `host_probe` > 0 times it on every rank at each step's start (span
"host_probe", stage "other", args `probe_s`: CPU seconds per iteration). `earl validate`
records the run's median over the calibration's reading (earl.calibrate.validate.host_speed).
On the 2-vCPU VM the readings are bimodal, ~50 or ~90-110 us, and across runs they follow the
run's level; the calibration's own readings did not place its constants' level, so validate
does not scale its predictions by them (docs/validate-history.md, twelfth session).

The loop: eager forwards of small Linear layers at batch 8 on one thread, as a tiny model's
decode steps are on a CPU rank (per-op dispatch and cache-resident GEMMs); 50-110 us per
iteration on the 2-core EPYC VM this was built on. Its CPU seconds (the thread's, so a peer
rank holding the core does not count) move with the host's speed, not with the job's load.
"""

from __future__ import annotations

import statistics
import time

import torch

LAYERS, WIDTH, BATCH = 8, 64, 8
STEP_ITERS = 20  # iterations per reading (`earl validate` runs `host_probe=20`): ~2 ms


class HostProbe:
    """The fixed loop, built once (seeded) and timed on demand."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.weights = [(torch.randn(WIDTH, WIDTH, generator=gen) / WIDTH ** 0.5, torch.zeros(WIDTH))
                        for _ in range(LAYERS)]
        self.x = torch.randn(BATCH, WIDTH, generator=gen)
        self.run(max(1, STEP_ITERS // 3))  # warm-up: first calls allocate and dispatch cold

    def run(self, iters: int) -> None:
        """`iters` forwards of the layers, nothing timed."""
        with torch.inference_mode():
            for _ in range(iters):
                h = self.x
                for w, b in self.weights:
                    h = torch.nn.functional.linear(h, w, b)

    def time(self, iters: int = STEP_ITERS) -> float:
        """CPU seconds of this thread per iteration over `iters` iterations, after a quarter as
        many untimed ones: cold, the loop reads what ran before it, not the host (after the
        runtime's garbage collection 114 us an iteration, warm 85-89, back to back 88: medians
        of 40 here)."""
        if iters < 1:
            raise ValueError(f"host probe iterations must be >= 1, got {iters}")
        self.run(max(3, iters // 4))
        t0 = time.thread_time()
        self.run(iters)
        return (time.thread_time() - t0) / iters

    def sample(self, repeats: int = 5, iters: int = STEP_ITERS) -> list[float]:
        """`repeats` timings of `iters` iterations each (seconds per iteration)."""
        return [self.time(iters) for _ in range(repeats)]


def median_probe(values) -> float | None:
    """The median of probe readings (seconds per iteration); None when there are none."""
    vals = [float(v) for v in values if v and v > 0]
    return statistics.median(vals) if vals else None
