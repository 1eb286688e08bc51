"""How a gloo all-gather's (or reduce-scatter's) cost grows with the group on one host: wall time
(fastest and slowest rank) and CPU seconds per rank of `all_gather_into_tensor` (`--op
reduce_scatter`: `reduce_scatter_tensor` of a tensor that size) over 2, 3 and 4 local processes,
at gathered (reduced) sizes of 0.25-64 MiB.

The cost model prices an all-gather's bytes as (p - 1) / p of the gathered tensor over the link
(a ring's share, right for NVLink and NICs). On a CPU host the ranks move the bytes with their
own CPU time; this study measures what each rank's share comes to as p grows, the evidence
behind `earl.cost_model.comm.bytes_group` (docs/validate-history.md, nineteenth session; the
reduce-scatter, which adds what it receives and grows as the ring's share: thirty-sixth session).

    OMP_NUM_THREADS=1 python studies/cpu_allgather_ranks.py                        # about a minute
    OMP_NUM_THREADS=1 python studies/cpu_allgather_ranks.py --op reduce_scatter
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import gloo_study_args  # noqa: E402

from earl.runtime.dist import run_local  # noqa: E402

SIZES_MIB = (0.25, 1.0, 4.0, 16.0, 64.0)
OPS = ("all_gather", "reduce_scatter")


def _gathers(sizes: tuple[float, ...], reps: int,
             op: str = "all_gather") -> dict[float, tuple[list[float], list[float]]]:
    """On one gloo rank (earl.runtime.dist.run_local): per gathered (reduced) size (MiB), the wall
    and CPU seconds of each timed `op`, after a barrier each."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    world = dist.get_world_size()
    res = {}
    for mib in sizes:
        whole = int(mib * 2 ** 20 / 4)
        whole -= whole % world
        full, shard = torch.randn(whole), torch.randn(whole // world)

        def call(full=full, shard=shard):
            if op == "reduce_scatter":
                dist.reduce_scatter_tensor(shard, full)
            else:
                dist.all_gather_into_tensor(full, shard)

        for _ in range(2):  # warm-up: buffers, the transport's pairs
            call()
        walls, cpus = [], []
        for _ in range(reps if mib < 16 else max(3, reps // 2)):
            dist.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            call()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        res[mib] = (walls, cpus)
    return res


def measure(world: int, sizes=SIZES_MIB, reps: int = 12, timeout_s: float = 300.0,
            op: str = "all_gather") -> dict[float, dict]:
    """Per gathered (reduced) size (MiB): the median over repeats of the fastest and slowest
    rank's wall seconds and of the ranks' mean CPU seconds."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; valid: {', '.join(OPS)}")
    got = run_local(_gathers, world, tuple(sizes), reps, op, timeout_s=timeout_s, start_method="spawn")
    out = {}
    for mib in sizes:
        n = len(got[0][mib][0])
        out[mib] = {
            "fastest_s": statistics.median(min(g[mib][0][i] for g in got) for i in range(n)),
            "slowest_s": statistics.median(max(g[mib][0][i] for g in got) for i in range(n)),
            "cpu_per_rank_s": statistics.median(sum(g[mib][1][i] for g in got) / world for i in range(n)),
        }
    return out


def main(argv=None) -> None:
    worlds, reps, op = gloo_study_args(__doc__, argv, "2,3,4", 12, ops=OPS)
    call = "all_gather_into_tensor" if op == "all_gather" else "reduce_scatter_tensor"
    print(f"gloo {call}, {os.cpu_count()} CPUs; per size: median wall of the "
          "fastest / slowest rank, CPU seconds per rank; ratio: CPU per rank over the first world's")
    first = None
    for w in worlds:
        res = measure(w, reps=reps, op=op)
        first = first or res
        for mib, r in res.items():
            print(f"ranks {w}  {mib:6.2f} MiB  fastest {r['fastest_s'] * 1e3:8.2f} ms  slowest "
                  f"{r['slowest_s'] * 1e3:8.2f} ms  CPU/rank {r['cpu_per_rank_s'] * 1e3:8.2f} ms  "
                  f"x{r['cpu_per_rank_s'] / first[mib]['cpu_per_rank_s']:.2f}", flush=True)


if __name__ == "__main__":
    main()
