"""How much of a CPU core each busy process of a job got: the load term shared by
`earl calibrate` and `earl validate`.

On a host shared with other tenants a CPU-bound stage's wall time is its dedicated time over
the share of a core its process gets, and that share moves with the load from minute to minute
(on the 2-core host of docs/cpu/validate_mp.txt from 1 to below 1/4 within two minutes). A
calibrated constant is fitted at the share its probe got, a validated stage runs at the share of
its own run; both are measured the same way: the CPU seconds the job's processes were given
(this process's, and those of its finished child processes: spawned ranks, torchrun and its
ranks) over wall seconds x processes (`CpuShare`). Counting runnable threads instead
(/proc/stat procs_running) read 3x too much contention here: the kernel shares CPU between the
tenants' control groups, not between their threads. The gloo phases fit with each point's
share (FSDP2) or store it (`DispatchPath.host_share`); the one-process phases' constants are
taken as a dedicated core's (`HardwareProfile.host_share` 1; their share is stamped,
`cpu_share`). `earl validate` scales each step's prediction by host_share / the share rank 0 got
in it, which on an otherwise idle host is the N / cores stretch of N ranks on fewer cores.
A rank blocked on a peer (a gloo wait) gets no CPU either: at N > 1 the share reads low by the
job's own waiting, the same in the calibration's gloo phases as in validate's runs. The
stages priced by the one-process constants (rollout, log-probs) are stretched by the share of
the ranks' compute spans instead (`earl.calibrate.validate.compute_shares`), which holds no wait.

A second host term is not a share: processes that compute at once on all cores slow one another
beyond it (caches, memory bandwidth, SMT siblings, a hypervisor's vCPUs), in CPU time as well
as wall time (`corun_slowdown`, HardwareProfile.corun_slowdown).

    python -m earl.calibrate.hostload        # the share a busy loop gets here, now; the co-run slowdown
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field

import torch

from earl.cost_model.profile import HardwareProfile
from earl.runtime.hostprobe import HostProbe

MIN_SHARE = 1e-3  # below it a measurement is taken as broken, not as a host that slow


def cores() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its waited-for descendants so far."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def share_of(cpu_s: float, wall_s: float, procs: int) -> float:
    """CPU seconds per wall second per process, within [MIN_SHARE, 1]; 1 for an empty window."""
    if procs < 1:
        raise ValueError(f"share_of needs procs >= 1, got {procs}")
    if wall_s <= 0:
        return 1.0
    return min(1.0, max(MIN_SHARE, cpu_s / (wall_s * procs)))


@dataclass
class CpuShare:
    """Context manager: the share of a core each of the job's `procs` busy processes got while
    open (`share`), from this process's CPU time and that of child processes it waited for in
    the window. Time inside `paused()` counts for neither (another job's processes ran)."""

    procs: int = 1
    cpu_s: float = 0.0  # CPU seconds counted
    wall_s: float = 0.0  # wall seconds counted
    _t0: tuple[float, float] = field(default=(0.0, 0.0), repr=False)

    def __enter__(self) -> CpuShare:
        self._t0 = (time.perf_counter(), cpu_seconds())
        return self

    def __exit__(self, *exc) -> None:
        w0, c0 = self._t0
        self.wall_s += time.perf_counter() - w0
        self.cpu_s += cpu_seconds() - c0

    @contextlib.contextmanager
    def paused(self):
        self.__exit__()
        try:
            yield self
        finally:
            self.__enter__()

    def share(self) -> float:
        return share_of(self.cpu_s, self.wall_s, self.procs)


def shared_makespan(works, cores: float) -> float:
    """Wall seconds until the last of `works` is done (each the seconds one process needs on a
    core of its own) when all start at once on `cores` cores shared fairly, as the kernel
    shares them: n unfinished processes each run at min(1, cores / n) of a core, so a process
    that finishes early leaves its share to the others (N ranks' rollouts of unequal length on
    fewer cores take less than N / cores x the longest)."""
    if cores <= 0:
        raise ValueError(f"shared_makespan needs cores > 0, got {cores}")
    w = sorted(float(x) for x in works)
    t = done = 0.0
    for i, x in enumerate(w):
        t += (x - done) / min(1.0, cores / (len(w) - i))
        done = x
    return t


def overlap_factor(busy: float, procs: int, cores: int) -> float:
    """The share of the oversubscription stretch (procs / cores) a stage of `procs` ranks on
    `cores` cores pays when each rank computes only `busy` of its wall time with a core of its
    own (the rest waits for its peers: a collective's transfers): the waits of one rank are
    filled by the others' work, so the stage takes max(1, busy x procs / cores) of its wall on
    dedicated cores, not procs / cores of it. 1 where the ranks fit the cores. FSDP2's weight
    sync, 27M parameters (2026-12-04): CPU over wall ~0.7 at 2 ranks; at 4 ranks on 2 cores it
    took 1.23-1.77x its 2-rank wall (six passes), not 2x."""
    if procs <= cores:
        return 1.0
    return max(cores / procs, min(1.0, busy))


# `corun_slowdown`'s loop: the host probe's (earl/runtime/hostprobe.py), eager forwards of small
# Linear layers at batch 8 on one thread, as a tiny model's decode steps are on a CPU rank
def _corun_loop(iters: int, queue) -> None:
    torch.set_num_threads(1)
    probe = HostProbe()
    t0 = time.perf_counter()
    per_iter = probe.time(iters)
    queue.put((time.perf_counter() - t0, per_iter))


def corun_slowdown(procs: int | None = None, iters: int = 800, repeats: int = 25,
                   timeout_s: float = 120.0) -> dict:
    """How much longer one fixed eager loop takes on the slowest of `procs` processes (default:
    every core) running it at once than on one process alone: over `repeats` pairs taken back to
    back (so both sides of a pair see the same other tenants), the summed slowest concurrent wall
    time over the summed lone one, at least 1. Summed, not the median pair: on a host whose
    cores switch between a fast and a slow mode for spells of up to a second, a pair's two
    windows often land in different modes (single pairs read x0.62-2.13 on the 2-vCPU EPYC,
    the median of nine moved x1.01-1.32 between calibrations; re-estimated from the same pairs,
    the sums put 100 of 160 recorded stage-runs within 25% against 96;
    docs/validate-history.md, fifteenth session); many short pairs, summed, average the modes out as a
    stage's time does. Validate scores a stage of the ranks' own work as
    its slowest rank's, which on a shared host is slower than one rank alone twice over: the
    ranks slow each other (caches, memory bandwidth, SMT siblings; in CPU time too, so a CPU
    share cannot see it), and the slowest of several draws from the host's noise is slower
    than the median one. {"corun_slowdown", "procs", "ratios", "alone_s", "probe_alone_s",
    "probe_corun_s"}: the last two the loop's CPU seconds per iteration alone and on each of the
    processes at once (the host probe's readings, HardwareProfile.host_probe_corun_s); 1 and no
    readings with one core."""
    procs = procs or cores()
    if procs < 2:
        return {"corun_slowdown": 1.0, "procs": procs, "ratios": [], "alone_s": [], "probe_alone_s": [],
                "probe_corun_s": []}
    ctx = mp.get_context("fork")  # torch is imported: each forked loop starts in milliseconds

    def once(k: int) -> list[tuple[float, float]]:
        queue = ctx.Queue()
        ps = [ctx.Process(target=_corun_loop, args=(iters, queue), daemon=True) for _ in range(k)]
        for p in ps:
            p.start()
        try:
            return [queue.get(timeout=timeout_s) for _ in ps]
        finally:
            for p in ps:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()

    ratios, alone, probe_alone, probe_corun = [], [], [], []
    for _ in range(repeats):
        (one, cpu_one), = once(1)
        many = once(procs)
        ratios.append(max(w for w, _ in many) / one)
        alone.append(one)
        probe_alone.append(cpu_one)
        probe_corun += [c for _, c in many]
    slowest = sum(r * a for r, a in zip(ratios, alone, strict=True))
    return {"corun_slowdown": max(1.0, slowest / sum(alone)), "procs": procs,
            "ratios": [round(r, 4) for r in ratios], "alone_s": [round(a, 5) for a in alone],
            "probe_alone_s": [round(a, 9) for a in probe_alone], "probe_corun_s": [round(c, 9) for c in probe_corun]}



def active_ranks(leads: list[float], work_s: float, nproc: int) -> int:
    """How many ranks still compute a weight sync of `work_s` seconds (a rank's own work with a
    core to itself) when its last rank arrives, the ranks having reached it `leads` seconds
    before the last one: those that arrived less than `work_s` before it. A rank that arrived
    earlier has done what it could without the last rank's slices and sleeps in its receives, so
    the window the sync is read over (`measured_stages`) runs only the others: the tiny model's
    4 ranks reached it 8-14 ms apart (median per run, 2026-12-05 passes) for ~3 ms of work, the
    27M-parameter model's 10-14 ms apart for ~90 ms. `nproc` where the leads are unknown."""
    if not leads:
        return nproc
    return max(1, sum(lead < work_s for lead in leads))


def host_stretch(prof: HardwareProfile, nproc: int, device: str, share: float | None = None) -> float:
    """How much longer a stage takes on this host than the profile's constants say: the
    profile's `host_share` over `share`, the share of a core each of the `nproc` CPU ranks got
    (earl.calibrate.hostload; None: an otherwise idle host, where it is nproc / host_parallel
    when above 1). 1 on a GPU."""
    if device != "cpu":
        return 1.0
    if share is None:
        share = min(1.0, prof.dispatch_path.host_parallel / nproc)
    return prof.host_share / share


def sync_stretch(prof: HardwareProfile, nproc: int, device: str, share: float, leads: list[float],
                 sync_s: float) -> float:
    """The weight sync's stretch on this host: `host_stretch` and the overlap of its ranks'
    waits (`overlap_factor`: beyond the cores they fill each other's waits), both over the ranks
    still computing it when its last rank arrives (`active_ranks`, the sync priced `sync_s` on a
    dedicated core), not all `nproc`; `share` (a rank's share of a core in the step) keeps the
    other tenants' load apart from the job's own oversubscription. 1 on a GPU."""
    if device != "cpu":
        return 1.0
    cores = prof.dispatch_path.host_parallel
    active = active_ranks(leads, sync_s * prof.host_share, nproc)
    own = min(1.0, share * min(1.0, cores / active) / min(1.0, cores / nproc))  # `share` at `active` ranks
    return host_stretch(prof, active, device, own) * overlap_factor(prof.reshard_busy, active, cores)


if __name__ == "__main__":

    for _ in range(3):
        with CpuShare() as s:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 1.0:
                pass
        print(f"busy loop: share of a core {s.share():.3f} over {s.wall_s:.2f} s ({cores()} cores)")
    c = corun_slowdown()
    print(f"co-run slowdown x{c['corun_slowdown']:.2f} on {c['procs']} processes (pairs: {c['ratios']})")
