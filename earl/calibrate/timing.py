"""Timing primitives for the calibration micro-benchmarks.

Every benchmark times one call at a time over a small pool of *rotating* inputs (so a repeat
never finds its operands hot in cache), after warm-up, and keeps the median. On CUDA each call
is bracketed by its own pair of device events (synchronised once at the end); on CPU by
`host_clock`: the process's CPU time when torch runs one thread (the device is one core: on a
shared host, other processes' time slices are not this work's cost; a 20 ms call on a loaded
2-core box takes ~2x its CPU time in wall time), else `time.perf_counter`. Inputs are never
zero: magnitudes lie in [0.5, 1.5) with random signs,
so no sparse or denormal fast path can flatter a kernel.

    python -m earl.calibrate.timing        # times a 512^3 matmul on the CPU and prints it
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

DEVICES = ("cpu", "cuda")
TILE_NUMEL = 2**20  # random values generated per input tensor; larger ones repeat them
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class Timing:
    """The median of `reps` timed calls."""

    median_s: float  # median seconds of one call
    reps: int  # timed calls (after warm-up)
    iqr_frac: float  # (p75 - p25) / median: the noise of this point

    @staticmethod
    def of(samples_s: Sequence[float]) -> Timing:
        xs = sorted(samples_s)
        med = statistics.median(xs)
        q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [med, med, med]
        return Timing(median_s=med, reps=len(xs), iqr_frac=(q[2] - q[0]) / med if med > 0 else 0.0)


def resolve_device(device: str) -> torch.device:
    """`cpu` or `cuda`; a clear error when the name is unknown or CUDA is absent."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device 'cuda' is not available here (torch {torch.__version__}, "
                         f"CUDA build {torch.version.cuda or 'none'}); use --device cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on CUDA and fp32 on CPU (what the runtime uses there)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def nonzero_tensor(shape: Sequence[int], *, dtype: torch.dtype, device: torch.device,
                   generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Values with magnitude in [0.5, 1.5) * scale and random signs: never zero. Large
    tensors tile a random block of 2^20 values (cheap to make, still incompressible)."""
    numel = math.prod(shape)
    block = min(numel, TILE_NUMEL)
    mag = torch.rand(block, generator=generator, dtype=torch.float32) + 0.5
    sign = torch.randint(0, 2, (block,), generator=generator, dtype=torch.int8) * 2 - 1
    vals = (mag * sign * scale).to(device=device, dtype=dtype)
    if block < numel:
        vals = vals.repeat(-(-numel // block))[:numel]
    return vals.reshape(tuple(shape))


def host_clock(device: torch.device) -> Callable[[], float]:
    """The clock that times work on `device` from the host (see the module docstring)."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.process_time
    return time.perf_counter


def time_host(fn: Callable[[], object], *, device: torch.device, warmup: int = 2, reps: int = 7) -> Timing:
    """Median time of `fn()` as the host sees it: work that mixes Python with device kernels
    (an engine turn, an optimizer step). CUDA: synchronised before and after each call, timed
    on the host (`perf_counter`), so launch overheads and host gaps count, as they do in the
    runtime's spans; CPU: `host_clock`."""
    return time_host_interleaved([fn], device=device, warmup=warmup, reps=reps)[0]


def time_host_interleaved(fns: Sequence[Callable[[], object]], *, device: torch.device, warmup: int = 2,
                          reps: int = 7) -> list[Timing]:
    """`time_host` of several calls whose times are fitted together, taken round-robin: each
    round times every call once (the order rotated by one each round), so each call's median is
    drawn from the same stretch of the host's time. On a host whose speed switches between
    modes for spells of a second or so (docs/validate-history.md, thirteenth session), calls timed one
    after the other each land in a mode of their own, and a fit across them (a fixed term and
    a slope) reads the modes as a shape; interleaved, they share the mix."""
    if not fns:
        raise ValueError("time_host_interleaved needs at least one call")
    clock = host_clock(device)
    for fn in fns:
        for _ in range(max(0, warmup)):
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    for r in range(max(1, reps)):
        for i in [(r + j) % n for j in range(n)]:
            synchronize(device)
            t = clock()
            fns[i]()
            synchronize(device)
            samples[i].append(clock() - t)
    return [Timing.of(s) for s in samples]


def busy_wait(seconds: float) -> None:
    """Keep this thread on its core for `seconds` (wall): a rank computing, as benchmarks and
    studies stage it beside a collective."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[..., object], inputs: Sequence[tuple], *, device: torch.device,
               warmup: int = 2, min_reps: int = 3, max_reps: int = 30,
               max_s: float = 1.0) -> Timing:
    """Median time of `fn(*inputs[i % len(inputs)])`.

    The number of timed calls adapts to the cost of one call: as many as fit in `max_s`
    (at least `min_reps`, at most `max_reps`), estimated from the warm-up."""
    if not inputs:
        raise ValueError("time_calls needs at least one input tuple")
    n = len(inputs)
    t0 = time.perf_counter()
    for i in range(max(1, warmup)):
        fn(*inputs[i % n])
    synchronize(device)
    per_call = (time.perf_counter() - t0) / max(1, warmup)
    reps = int(min(max_reps, max(min_reps, max_s / max(per_call, 1e-9))))
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            starts[i].record()
            fn(*inputs[(warmup + i) % n])
            ends[i].record()
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]
    else:
        clock = host_clock(device)
        samples = []
        for i in range(reps):
            args = inputs[(warmup + i) % n]
            t = clock()
            fn(*args)
            samples.append(clock() - t)
    return Timing.of(samples)


def rotation_count(bytes_per_set: float, device: torch.device, *, max_sets: int = 8) -> int:
    """How many input sets to rotate through so their total exceeds the last-level cache
    (CUDA L2 up to ~60 MB on H100/H200; CPU L3 assumed <= 64 MB), within a memory cap."""
    target = 128e6
    cap_bytes = 8e9 if device.type == "cuda" else 1e9
    sets = int(min(max_sets, max(2, target // max(bytes_per_set, 1.0) + 1)))
    while sets > 2 and sets * bytes_per_set > cap_bytes:
        sets -= 1
    return sets


if __name__ == "__main__":
    dev = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    xs = [(nonzero_tensor((512, 512), dtype=torch.float32, device=dev, generator=g),
           nonzero_tensor((512, 512), dtype=torch.float32, device=dev, generator=g))
          for _ in range(3)]
    t = time_calls(torch.matmul, xs, device=dev)
    print(f"512^3 fp32 matmul: {t.median_s * 1e3:.3f} ms median of {t.reps} "
          f"({2 * 512**3 / t.median_s / 1e9:.1f} GFLOP/s, iqr {t.iqr_frac:.1%})")
