"""How much of a CPU core a busy process gets on this host right now: the load term shared by
`earl calibrate` and `earl validate`.

On a host shared with other tenants a CPU-bound stage's wall time is its dedicated time over
the share of a core its process gets; the share moves with the load from minute to minute
(on this 2-core host from 1 to 1/8 within two minutes). A calibrated constant is fitted at the
share its probe got, a validated stage runs at the share of its own run: both are measured the
same way, by the runnable threads the kernel counts (`procs_running` of /proc/stat, sampled in
a background thread), under processor sharing: a busy thread gets min(1, cores / runnable).
The profile stores the calibration's share (`HardwareProfile.host_share`); `earl validate`
scales its predictions by host_share / the share it measured over each run (which, at no other
load, is the N / cores stretch of N ranks on fewer cores).

    python -m earl.calibrate.hostload        # the share a busy loop gets, measured two ways
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from dataclasses import dataclass, field

SAMPLE_S = 0.02  # seconds between samples of the runnable count
PROC_STAT = "/proc/stat"


def cores() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def runnable_now(path: str | None = None) -> int | None:
    """Threads the kernel counts as runnable right now, less the one reading (None: no /proc)."""
    try:
        with open(path or PROC_STAT) as f:
            for line in f:
                if line.startswith("procs_running"):
                    return max(0, int(line.split()[1]) - 1)
    except OSError:
        return None
    return None


def share_of(runnable: float, ours: int, ncores: int) -> float:
    """The share of a core each of our `ours` busy threads gets when `runnable` threads (ours
    among them) compete for `ncores` cores: min(1, cores / max(runnable, ours))."""
    if ncores < 1 or ours < 1:
        raise ValueError(f"share_of needs cores >= 1 and ours >= 1, got cores={ncores}, ours={ours}")
    return min(1.0, ncores / max(float(runnable), float(ours)))


@dataclass
class LoadSampler:
    """Context manager: samples the runnable count every SAMPLE_S seconds while open.
    `ours`: busy threads of the measured job (ranks x threads), counted at least once each."""

    ours: int = 1
    ncores: int = field(default_factory=cores)
    samples: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _paused: bool = False

    def __enter__(self) -> LoadSampler:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="earl-load-sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @contextlib.contextmanager
    def paused(self):
        """No samples while inside (another job's processes run)."""
        self._paused = True
        try:
            yield self
        finally:
            self._paused = False

    def _run(self) -> None:
        while not self._stop.is_set():
            n = runnable_now()
            if n is None:
                return
            if not self._paused:
                self.samples.append(n)
            self._stop.wait(SAMPLE_S)

    def runnable(self) -> float | None:
        """Mean runnable threads over the samples (None: none taken)."""
        return statistics.fmean(self.samples) if self.samples else None

    def share(self) -> float:
        """Each of our busy threads' share of a core (1 where nothing could be sampled)."""
        r = self.runnable()
        return 1.0 if r is None else share_of(r, self.ours, self.ncores)


def measure_share(seconds: float = 0.3, ours: int = 1) -> float:
    """The share (see `share_of`) over `seconds` of sampling while the caller sleeps: the
    host's load without this process, plus `ours` busy threads."""
    with LoadSampler(ours=ours) as s:
        time.sleep(seconds)
    r = s.runnable()
    return 1.0 if r is None else share_of(r + ours, ours, s.ncores)


if __name__ == "__main__":

    for _ in range(3):
        with LoadSampler() as ls:
            t0, c0 = time.perf_counter(), time.process_time()
            while time.perf_counter() - t0 < 1.0:
                pass
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"busy loop: CPU / wall {cpu / wall:.3f}; sampled share {ls.share():.3f} "
              f"(runnable {ls.runnable():.1f} on {ls.ncores} cores)")
