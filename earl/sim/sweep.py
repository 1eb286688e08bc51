"""Run the independent variants of a sweep in parallel: local processes or Ray tasks.

`earl simulate --compare --jobs N` runs its policies, `earl study --jobs N` its studies (and the
studies their simulated variants) in N processes; `--jobs ray` runs them as Ray tasks where Ray
is installed. Each variant is a pure function of its arguments (seeded workload, no shared
state), so the results are those of the serial run, in the same order.

    earl simulate --compare --steps 10 --jobs 4
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable

RAY = "ray"


def default_jobs() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parse_jobs(text: str | int | None) -> int | str:
    """`--jobs` value: a positive integer, `ray`, or None / `auto` (the core count)."""
    if text is None or text == "auto":
        return default_jobs()
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str) and text.strip().lower() == RAY:
        return RAY
    else:
        try:
            value = int(str(text).strip())
        except ValueError:
            value = 0
    if value < 1:
        raise ValueError(f"--jobs {text!r}: expected a positive integer, 'auto' (the core count) or 'ray'")
    return value


def require_ray():
    """The ray module, or a one-line error saying how to get it."""
    try:
        import ray
    except ImportError:
        raise ValueError("--jobs ray needs the ray package (pip install ray); "
                         "use --jobs N for N local processes") from None
    return ray


def run_jobs(fn: Callable, items: Iterable, jobs: int | str = 1, done: Callable | None = None) -> list:
    """[fn(item) for item in items], in `jobs` processes (1: here, serially) or as Ray tasks.
    `fn` must be a module-level function (it is pickled). `done(index, result)` is called in this
    process as each result arrives."""
    items = list(items)
    jobs = parse_jobs(jobs)
    out: list = [None] * len(items)
    if jobs == RAY:
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, log_to_driver=False)
        task = ray.remote(fn)
        refs = [task.remote(item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = index[ready[0]]
            out[i] = ray.get(ready[0])
            if done is not None:
                done(i, out[i])
        return out
    if jobs == 1 or len(items) <= 1:
        for i, item in enumerate(items):
            out[i] = fn(item)
            if done is not None:
                done(i, out[i])
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: the parent may run threads (progress bars) that a fork would copy mid-lock
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=ctx) as pool:
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        for fut in as_completed(futures):
            i = futures[fut]
            out[i] = fut.result()
            if done is not None:
                done(i, out[i])
    return out
