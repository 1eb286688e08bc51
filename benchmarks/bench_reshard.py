"""Re-shard time vs the bytes-over-bandwidth bound, on real gloo processes.

For each plan change the executor (earl.runtime.move_weights) moves the planner's slices
(earl.policies.reshard). Two bounds, both measured in the same run: the link bound is the busiest rank's
bytes (sent or received, whichever is larger) over the point-to-point bandwidth between two
ranks (one large message); the host bound is all bytes moved over the total rate all ranks
reach when each sends to every other at once (on one host the processes share cores and
memory bandwidth, so this is the honest floor). The cost model's view ('cpu' profile) is shown
twice: pricing this exact plan message by message (`price_reshard`) and its closed-form
`CostModel.reshard`.
The model is a synthetic Qwen2-shaped stack (`--hidden`, `--layers`, fp32) so the bytes are
large enough for bandwidth, not latency, to matter.

    OMP_NUM_THREADS=1 python benchmarks/bench_reshard.py
    OMP_NUM_THREADS=1 python benchmarks/bench_reshard.py --procs 2 --hidden 512 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from earl.cost_model import CostModel
from earl.cost_model.profile import load_profile
from earl.parallel import ParamShape
from earl.policies.reshard import max_rank_bytes, plan_reshard, price_reshard
from earl.runtime.dist import run_local
from earl.runtime.move_weights import allocate_local, execute_reshard, local_range
from earl.specs import HARDWARE_CATALOG, NETWORK_CATALOG, ClusterSpec, ModelSpec, ParallelPlan

STATES = ("exp_avg", "exp_avg_sq")


def synthetic_spec(hidden: int, layers: int) -> ModelSpec:
    return ModelSpec(name=f"synthetic-h{hidden}-l{layers}", num_layers=layers, hidden_size=hidden,
                     num_heads=16, num_kv_heads=4, head_dim=hidden // 16, ffn_hidden=4 * hidden,
                     vocab_size=8192, tied_embeddings=True, qkv_bias=True, dtype="fp32")


def shapes_of(spec: ModelSpec) -> dict[str, ParamShape]:
    """Full parameter shapes with the HF names and the TP dims earl.runtime.tp uses."""
    h, q, kv, f = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.ffn_hidden
    out = {"model.embed_tokens.weight": ParamShape(shape=(spec.vocab_size, h), tp_dim=None),
           "model.norm.weight": ParamShape(shape=(h,), tp_dim=None)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        out.update({
            p + "self_attn.q_proj.weight": ParamShape(shape=(q, h), tp_dim=0),
            p + "self_attn.q_proj.bias": ParamShape(shape=(q,), tp_dim=0),
            p + "self_attn.k_proj.weight": ParamShape(shape=(kv, h), tp_dim=0),
            p + "self_attn.k_proj.bias": ParamShape(shape=(kv,), tp_dim=0),
            p + "self_attn.v_proj.weight": ParamShape(shape=(kv, h), tp_dim=0),
            p + "self_attn.v_proj.bias": ParamShape(shape=(kv,), tp_dim=0),
            p + "self_attn.o_proj.weight": ParamShape(shape=(h, q), tp_dim=1),
            p + "mlp.gate_proj.weight": ParamShape(shape=(f, h), tp_dim=0),
            p + "mlp.up_proj.weight": ParamShape(shape=(f, h), tp_dim=0),
            p + "mlp.down_proj.weight": ParamShape(shape=(h, f), tp_dim=1),
            p + "input_layernorm.weight": ParamShape(shape=(h,), tp_dim=None),
            p + "post_attention_layernorm.weight": ParamShape(shape=(h,), tp_dim=None),
        })
    return out


def cases(world: int) -> list[tuple[str, ParallelPlan, ParallelPlan, bool]]:
    """(label, src, dst, with optimizer state)."""
    half = max(1, world // 2)
    out = [("train->rollout", ParallelPlan(dp=world), ParallelPlan(tp=world), False),
           ("rollout->train", ParallelPlan(tp=world), ParallelPlan(dp=world), False)]
    if world >= 4:
        out.append(("tp2dp2->tp4", ParallelPlan(tp=2, dp=half), ParallelPlan(tp=world), False))
    out.append(("train switch +adam", ParallelPlan(tp=half, dp=2, sharded_optimizer=True),
                ParallelPlan(tp=world, sharded_optimizer=True), True))
    return out


def _p2p_bandwidth(nbytes: int, repeats: int) -> float:
    import torch.distributed as dist

    rank = dist.get_rank()
    buf = torch.ones(nbytes, dtype=torch.uint8)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, dst=1)
        elif rank == 1:
            dist.recv(buf, src=0)
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t))
    return nbytes / statistics.median(times[1:])


def _all_to_all_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes/s all ranks move together when every rank sends `nbytes` to every other rank at
    once (on one host the processes share cores and memory bandwidth)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.ones(nbytes, dtype=torch.uint8)
    inbox = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(world)]
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.irecv(inbox[r], src=r) for r in range(world) if r != rank]
        works += [dist.isend(out, dst=r) for r in range(world) if r != rank]
        for w in works:
            w.wait()
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t))
    return nbytes * world * (world - 1) / statistics.median(times[1:])


def _worker(spec: ModelSpec, repeats: int):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    shapes = shapes_of(spec)
    bw = _p2p_bandwidth(64 * 2**20, repeats)
    agg = _all_to_all_bandwidth(16 * 2**20, repeats)
    results = []
    for label, src, dst, opt in cases(world):
        states = STATES if opt else ()
        plan = plan_reshard(shapes, src, dst, world, optimizer_states=states)
        names = sorted({t.name for t in plan.transfers})
        full = {n: (s.shape, s.shard_dim) for n, s in shapes.items()}
        src_t = {}
        for n in names:
            shape, dim = full[n.split("/")[0]]
            lo, hi = local_range(shapes, src, rank, n)
            size = list(shape)
            size[dim] = hi - lo
            src_t[n] = torch.randn(size)
        dst_t = allocate_local(shapes, dst, rank, names)
        times = []
        for _ in range(repeats + 1):
            dist.barrier()
            stats = execute_reshard(plan, shapes, src_t, dst_t)
            t = torch.tensor([stats.seconds])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(float(t))
        results.append((label, src.describe(), dst.describe(), opt, plan, statistics.median(times[1:])))
    return bw, agg, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spec = synthetic_spec(args.hidden, args.layers)
    print(f"model: {spec.name}, {spec.num_params / 1e6:.1f} M params fp32 "
          f"({spec.num_params * 4 / 1e6:.0f} MB of weights)")
    head = (f"{'procs':>5} {'change':<19} {'src':<18} {'dst':<18} {'moved MB':>8} {'busiest MB':>10} "
            f"{'time ms':>8} {'link bound':>10} {'x':>5} {'host bound':>10} {'x':>5} {'cm plan ms':>10} "
            f"{'cm formula ms':>13}")
    print(head)
    print("-" * len(head))
    for n in args.procs:
        bw, agg, results = run_local(_worker, n, spec, args.repeats, timeout_s=900)[0]
        cluster = ClusterSpec(hardware=HARDWARE_CATALOG["cpu"], nodes=1, gpus_per_node=n,
                              network=NETWORK_CATALOG["loopback"])
        cm = CostModel(spec, cluster, load_profile("cpu"))
        for label, src, dst, opt, plan, t in results:
            total, busiest = plan.total_bytes, max_rank_bytes(plan)
            link, host = busiest / bw, total / agg
            priced = price_reshard(plan, cm)
            pred = cm.reshard(ParallelPlan.parse(src), ParallelPlan.parse(dst), include_optimizer=opt).time_s
            nan = float("nan")
            print(f"{n:>5} {label:<19} {src:<18} {dst:<18} {total / 1e6:>8.1f} {busiest / 1e6:>10.1f} "
                  f"{t * 1e3:>8.1f} {link * 1e3:>10.1f} {t / link if link else nan:>5.2f} "
                  f"{host * 1e3:>10.1f} {t / host if host else nan:>5.2f} {priced * 1e3:>10.1f} "
                  f"{pred * 1e3:>13.1f}")
        print(f"{'':>5} measured: point-to-point {bw / 1e9:.2f} GB/s (one 64 MiB message); all ranks "
              f"sending to all at once {agg / 1e9:.2f} GB/s in total (16 MiB per pair)")
    print("link bound = busiest rank's bytes / point-to-point bandwidth (what a network with a link "
          "per rank allows); host bound = all moved bytes / the all-to-all total (this host's "
          "processes share its cores and memory bandwidth); x = measured / bound; cm plan = the cost "
          "model pricing this exact plan (earl.policies.reshard.price_reshard); cm formula = "
          "CostModel.reshard's closed form")


if __name__ == "__main__":
    main()
