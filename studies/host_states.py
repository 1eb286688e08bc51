"""How this host's speed moves while a job runs: time the host probe (earl/runtime/hostprobe.py,
a fixed eager loop on one thread) back to back for a while and print its readings' spread, the
share of readings in the fast mode, how long each mode lasts, the per-second medians, and the
hypervisor's steal time meanwhile (/proc/stat), with the probe once more while another process
computes on the other CPUs (is the slow mode our own neighbour?).

On the 2-vCPU EPYC VM (2026-12-04): readings 47-108 us per iteration, ~2/3 of them fast; modes
last 0.01-0.6 s; per-second medians 50-108 us; no steal in the slow mode; a matmul loop pinned
to the other vCPU does not make the probe slow. A stage of a few hundred milliseconds meets a
host whose speed is set by someone else, which is what bounds `earl validate`'s per-step
error there (docs/validate-history.md, thirteenth session).

    OMP_NUM_THREADS=1 python studies/host_states.py --seconds 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from earl.runtime.hostprobe import HostProbe  # noqa: E402

FAST_US = 70.0  # readings below this many us per iteration count as the fast mode (2-core VM's split)


def steal_ticks() -> int | None:
    """The hypervisor's steal time so far (USER_HZ ticks, all CPUs); None where not reported."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) if len(fields) > 8 else None
    except OSError:
        return None


def sample(probe: HostProbe, seconds: float, iters: int = 20) -> list[tuple[float, float]]:
    """(seconds since start, us per iteration) of back-to-back probe readings."""
    t0 = time.perf_counter()
    out = []
    while (now := time.perf_counter() - t0) < seconds:
        out.append((now, probe.time(iters) * 1e6))
    return out


def dwell(readings: list[tuple[float, float]], fast_us: float) -> dict[str, list[float]]:
    """Seconds each run of consecutive fast / slow readings lasted."""
    runs: dict[str, list[float]] = {"fast": [], "slow": []}
    start, mode = None, None
    for t, v in readings:
        m = "fast" if v < fast_us else "slow"
        if m != mode:
            if mode is not None:
                runs[mode].append(t - start)
            start, mode = t, m
    if mode is not None and readings:
        runs[mode].append(readings[-1][0] - start)
    return runs


def with_neighbour(probe: HostProbe, seconds: float) -> float | None:
    """The probe's median while a matmul loop runs on the CPUs this process is not pinned to
    (None where there is only one CPU or affinity cannot be set)."""
    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        return None
    mine = {0}
    others = set(range(os.cpu_count())) - mine
    code = (f"import os, time, torch\nos.sched_setaffinity(0, {others!r})\ntorch.set_num_threads(1)\n"
            f"a = torch.randn(512, 512)\nt = time.time()\nwhile time.time() - t < {seconds + 1.0}: a @ a\n")
    old = os.sched_getaffinity(0)
    nb = subprocess.Popen([sys.executable, "-c", code])
    try:
        os.sched_setaffinity(0, mine)
        time.sleep(0.8)  # the neighbour's start-up
        return statistics.median(v for _, v in sample(probe, seconds))
    finally:
        os.sched_setaffinity(0, old)
        nb.wait()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of back-to-back readings (default 30)")
    ap.add_argument("--fast-us", type=float, default=FAST_US, help=f"fast-mode threshold, us (default {FAST_US:g})")
    args = ap.parse_args(argv)
    if not args.seconds > 0:
        ap.error(f"--seconds must be > 0, got {args.seconds}")
    import torch

    torch.set_num_threads(1)
    probe = HostProbe()
    s0 = steal_ticks()
    got = sample(probe, args.seconds)
    s1 = steal_ticks()
    vals = sorted(v for _, v in got)
    q = statistics.quantiles(vals, n=10)
    fast = sum(v < args.fast_us for v in vals) / len(vals)
    runs = dwell(got, args.fast_us)
    per_s: dict[int, list[float]] = {}
    for t, v in got:
        per_s.setdefault(int(t), []).append(v)
    print(f"{len(vals)} readings in {args.seconds:g} s: us per iteration p10 {q[0]:.1f}, median {q[4]:.1f}, "
          f"p90 {q[8]:.1f} (min {vals[0]:.1f}, max {vals[-1]:.1f})")
    print(f"fast mode (< {args.fast_us:g} us): {fast:.0%} of readings")
    for mode in ("fast", "slow"):
        d = runs[mode]
        if d:
            print(f"  {mode} spells: {len(d)}, median {statistics.median(d) * 1e3:.0f} ms, longest {max(d):.2f} s")
    print("per-second medians (us): " + " ".join(f"{statistics.median(per_s[k]):.0f}" for k in sorted(per_s)))
    if s0 is not None and s1 is not None:
        print(f"steal time meanwhile: {s1 - s0} ticks ({(s1 - s0) / os.sysconf('SC_CLK_TCK'):.2f} s)")
    nb = with_neighbour(probe, min(5.0, args.seconds))
    if nb is not None:
        print(f"with a matmul loop on the other CPUs: median {nb:.1f} us (alone {q[4]:.1f})")


if __name__ == "__main__":
    main()
