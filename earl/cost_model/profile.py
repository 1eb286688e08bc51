"""HardwareProfile: the numbers the cost model prices with.

A profile wraps a datasheet `HardwareSpec` with achieved-efficiency curves (matmul, attention,
memory bandwidth), per-link alpha-beta parameters and a version stamp. Datasheet profiles use
conservative defaults; `earl calibrate` measures and fits real ones and writes them as JSON,
loadable by name (shipped in `earl/cost_model/profiles/`) or by path.

    python -c "from earl.cost_model.profile import load_profile; print(load_profile('h100-sxm-80gb'))"
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import platform
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from earl.specs import HARDWARE_CATALOG, HardwareSpec, unknown_name_error

PROFILE_VERSION = 1
PROFILES_DIR = Path(__file__).parent / "profiles"
# an estimator_s key's suffix: the executor's advantage work where the batch statistics came summed
# with the metadata (earl.runtime.advantages.AdvantageSpec.priced_key): filling the advantages in
SUMMED = "/summed"


# the least achieved fraction of a datasheet peak a profile may hold: below a millionth it is no
# measurement, and the times it prices overflow (a denormal 2e-309 did, found by
# tests/test_bad_input.py's random profile values)
MIN_PEAK_FRAC = 1e-6


@dataclass(frozen=True, kw_only=True)
class EfficiencyCurve:
    """Achieved fraction of peak as a function of problem size:
    eff(x) = peak_frac * x / (x + half_size). x is FLOPs (compute) or bytes (memory)."""

    peak_frac: float  # asymptotic achieved fraction of the datasheet peak, [1e-6, 1.5]
    half_size: float  # problem size (FLOPs or bytes) reaching half of peak_frac

    def __post_init__(self):
        if not (MIN_PEAK_FRAC <= self.peak_frac <= 1.5):
            raise ValueError(f"EfficiencyCurve.peak_frac must be in [{MIN_PEAK_FRAC:g}, 1.5], got {self.peak_frac}")
        if not self.half_size >= 0:  # nan fails too
            raise ValueError(f"EfficiencyCurve.half_size must be >= 0, got {self.half_size}")

    def __call__(self, size: float) -> float:
        return self.peak_frac * size / (size + self.half_size) if size > 0 else self.peak_frac


@dataclass(frozen=True, kw_only=True)
class LinkParams:
    """alpha-beta model of one link class: t(bytes) = alpha_s + bytes / bw_bytes_s."""

    alpha_s: float  # per-message latency, s
    bw_bytes_s: float  # achieved bandwidth, bytes/s

    def __post_init__(self):
        if not (0 <= self.alpha_s < math.inf and self.bw_bytes_s > 0):  # nan fails too; inf bw: free link
            raise ValueError(f"LinkParams needs alpha_s >= 0 and bw_bytes_s > 0, got "
                             f"{self.alpha_s}, {self.bw_bytes_s}")

    def time_s(self, nbytes: float) -> float:
        return self.alpha_s + nbytes / self.bw_bytes_s


@dataclass(frozen=True, kw_only=True)
class DispatchPath:
    """Host-side terms of moving experience data between ranks (earl.cost_model.dispatch prices
    a TransferPlan with them). `earl calibrate` fits them from gloo runs of the runtime's own
    executor (earl.calibrate.dispatchfit); datasheet profiles carry the defaults below, which
    are assumptions and are named in every headline they move."""

    message_s: float = 20e-6  # per message a rank sends or receives (post, match, complete), s
    object_s: float = 5e-6  # per (sample, tensor) piece a rank packs, unpacks or copies, s
    copy_bw_bytes_s: float = 5e9  # bytes/s one process packs or unpacks (host copies), bytes/s
    sample_s: float = 20e-6  # per sample whose advantage a rank computes (statistics, fill), s
    # The single controller's extra serialisation (pickle, object store) on top of the packing
    # every rank does: per byte it moves (inf: none) and per piece. The EARL paper's "~1 TB took
    # over 20 minutes" through verl's controller is the `object-store` option (0.8 GB/s). On a
    # CPU host `earl calibrate` fits the per-byte term from the gloo runs: earl's own controller
    # stages the whole batch and runs on a core its peers share.
    controller_bw_bytes_s: float = float("inf")  # bytes/s
    controller_object_s: float = 0.0  # per piece, s
    host_parallel: int = 64  # processes of one node whose host work runs at once (CPU cores)
    # A synchronising round: a point where every rank waits for its peers (a barrier, a phase's
    # receives, one small collective), issued back to back as the runtime issues them. On a CPU
    # host it costs the wake-ups of ranks asleep on a socket, far above a collective's alpha
    # measured right after a barrier (2 gloo ranks here: ~0.5 ms a barrier in a loop, ~0.25 ms
    # after one). Measured by `earl calibrate` (earl.calibrate.dispatchfit.round_seconds: gloo
    # barriers in a loop at 2 and 4 processes); 0 on datasheets, whose links' alpha prices NCCL's latency.
    round_s: float = 0.0  # per round when the node's processes fit its host_parallel cores, s
    sync_s: float = 0.0  # extra per round when a node runs more processes than host_parallel, s
    # ... and where the ranks come to the round from other work, asleep on their sockets (the
    # runtime's dispatch, whose ranks arrive from their log-prob passes and leave for their
    # training step): the back-to-back barrier loop's figure beyond the cores, which `earl
    # calibrate` measures (earl.calibrate.dispatchfit.round_seconds). The executor called back to
    # back, as the calibration's points and the benchmarks call it, keeps its ranks awake and fits
    # `sync_s` below it (4 gloo ranks on 2 cores, thirteen calibrations of 2026-12-06: 0.08-0.68 ms
    # fitted in nine, 0.8-1.6 ms in four, against 1.6-2.0 ms in the loop; docs/validate-history.md,
    # twenty-ninth session). 0: not measured (`sync_s` stands for it)
    wake_sync_s: float = 0.0
    # A statistics reduction of the advantages (earl.runtime.advantages.reduce_small: a gather of
    # a few scalars to one rank and a scatter back) as the runtime issues it: timed in the
    # runtime's own advantage code right after a barrier, less its local work
    # (earl.calibrate.dispatchfit.reduce_seconds). Not two barrier rounds: 2 gloo ranks on 2 cores
    # here, 2026-12-05, 0.46-0.74 ms against 0.4-1.0; 4 ranks 1.3-2.2 ms against ~4 (the average
    # of the two the runtime then issued; a lone one, as it issues now: 0.45-0.89 / 1.8-2.4 ms).
    # 0: not measured, a reduction is priced as two rounds (`reduce_cost_s`).
    reduce_s: float = 0.0  # per reduction when the node's processes fit its host_parallel cores, s
    reduce_sync_s: float = 0.0  # extra per reduction when a node runs more processes than that, s
    # a node running more processes than host_parallel: its slowest rank's time stretches by
    # (processes / host_parallel) ** oversubscribed_exp (its waiting peers poll and take CPU
    # from it); the node's total work is shared over host_parallel regardless. 0: no stretch
    oversubscribed_exp: float = 0.0
    # a rank sends and receives over its intra-node link at once (NVLink ports are full duplex);
    # False on a CPU host, where a loopback send and a receive both cost the rank's CPU time (and
    # a collective's bytes cost each rank about the whole tensor: earl.cost_model.comm.bytes_group)
    full_duplex: bool = True
    # bytes/s of a rank's point-to-point traffic inside a node as the executor drives it (its
    # sends plus receives; None: the profile's `intra` link). On a CPU host the gloo runs fit it
    wire_bw_bytes_s: float | None = None
    # per synchronising round of the executor (each phase that sends, the two rounds of the
    # advantage statistics: earl.cost_model.dispatch.sync_rounds) when the dispatch starts on
    # cold caches, as a training step's does right after its log-prob passes; fitted from the
    # gloo runs on CPU, 0 on datasheets, s
    cold_round_s: float = 0.0
    # the same per byte the busiest rank sends and receives: the caches its buffers refill (the
    # calibration's cold-minus-warm times grow with the bytes, +0.05-0.2 ms at 0.5-8K tokens and
    # +0.2-1.2 ms at 65-131K at 2 gloo ranks on the 2-vCPU Xeon, not with the rounds alone;
    # docs/validate-history.md, thirtieth session); 0: rounds alone (profiles from before), s/byte
    cold_byte_s: float = 0.0
    # the share of a core the fitted gloo runs' ranks got beyond their own oversubscription
    # (earl.calibrate.hostload: measured / an idle host's); 1: no other load (datasheets)
    host_share: float = 1.0

    def __post_init__(self):
        if not 0 < self.host_share <= 1:
            raise ValueError(f"DispatchPath.host_share must be in (0, 1], got {self.host_share!r}")
        for k in ("message_s", "object_s", "sample_s", "controller_object_s", "round_s", "sync_s", "wake_sync_s",
                  "reduce_s", "reduce_sync_s", "oversubscribed_exp", "cold_round_s", "cold_byte_s"):
            if getattr(self, k) < 0:
                raise ValueError(f"DispatchPath.{k} must be >= 0 s, got {getattr(self, k)}")
        for k in ("copy_bw_bytes_s", "controller_bw_bytes_s"):
            if not getattr(self, k) > 0:
                raise ValueError(f"DispatchPath.{k} must be > 0 bytes/s, got {getattr(self, k)}")
        if not isinstance(self.host_parallel, int) or self.host_parallel < 1:
            raise ValueError(f"DispatchPath.host_parallel must be an int >= 1, got {self.host_parallel!r}")
        if self.wire_bw_bytes_s is not None and not self.wire_bw_bytes_s > 0:
            raise ValueError(f"DispatchPath.wire_bw_bytes_s must be > 0 bytes/s (or null: the intra link), "
                             f"got {self.wire_bw_bytes_s}")

    def round_cost_s(self, procs: int, asleep: bool = False, wake_s: float = 0.0) -> float:
        """Seconds of one synchronising round of ranks sharing a node that runs `procs`
        processes: `round_s`, plus `sync_s` when they outnumber its host_parallel cores (with
        `asleep`, ranks that come to it from other work: the largest of `sync_s`,
        `wake_sync_s` and `wake_s`, another measurement of the same wake-ups: the caller's
        `HardwareProfile.reshard_wake_s`, timed on ranks that arrive apart)."""
        if procs <= self.host_parallel:
            return self.round_s
        return self.round_s + (max(self.sync_s, self.wake_sync_s, wake_s) if asleep else self.sync_s)

    def reduce_cost_s(self, procs: int) -> float:
        """Seconds of one statistics reduction among ranks sharing a node that runs `procs`
        processes: `reduce_s`, plus `reduce_sync_s` when they outnumber its host_parallel cores;
        two rounds (`round_cost_s`) where the profile did not measure it."""
        if self.reduce_s <= 0:
            return 2 * self.round_cost_s(procs)
        return self.reduce_s + (self.reduce_sync_s if procs > self.host_parallel else 0.0)


# Named controller paths for `--set dispatch.controller=...` style options and the sensitivity
# study: what the single controller adds beyond packing like any other rank.
CONTROLLER_PATHS: dict[str, dict] = {
    "packing": {"controller_bw_bytes_s": float("inf"), "controller_object_s": 0.0},
    # EARL paper (Tan et al. 2025, sec. 1): ~1 TB of intermediate data took over 20 minutes
    # through verl's single controller (Ray object store + pickling): <= ~0.8 GB/s.
    "object-store": {"controller_bw_bytes_s": 0.8e9, "controller_object_s": 0.0},
}


def with_controller_path(profile: HardwareProfile, name: str) -> HardwareProfile:
    """`profile` with a named single-controller path (see CONTROLLER_PATHS)."""
    if name not in CONTROLLER_PATHS:
        raise unknown_name_error("controller path", name, CONTROLLER_PATHS)
    path = dataclasses.replace(profile.dispatch_path, **CONTROLLER_PATHS[name])
    return dataclasses.replace(profile, dispatch_path=path)


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """Everything device-specific the cost model needs."""

    hardware: HardwareSpec
    matmul: EfficiencyCurve  # GEMM efficiency vs FLOPs of one GEMM
    attention: EfficiencyCurve  # attention-kernel efficiency vs FLOPs of one call
    memory: EfficiencyCurve  # achieved fraction of HBM bandwidth vs bytes moved by one kernel
    intra: LinkParams  # GPU<->GPU inside a node (per direction, per GPU)
    op_overhead_s: float = 5e-6  # fixed cost per kernel launch / operator
    mem_reserve_frac: float = 0.08  # device memory kept free (fragmentation, workspace)
    mem_reserve_bytes: float = 1.0e9  # plus this many bytes (CUDA context, allocator slack)
    stamp: dict = field(default_factory=dict)  # source, device, torch, cuda, attention, date, host
    fit_quality: dict = field(default_factory=dict)  # held-out error per fitted curve
    # Per-collective links fitted by `earl calibrate` through earl.cost_model.comm's formulas
    # ("allreduce", "allgather", "alltoall", "p2p" -> LinkParams); empty: every op uses `intra`.
    collective_links: dict = field(default_factory=dict)
    # Decode attention (one query token per sequence) vs FLOPs of one call, when calibrated
    # apart from prefill (on CPU it runs ~3x below prefill at equal FLOPs); None: `attention`.
    attention_decode: EfficiencyCurve | None = None
    # Host seconds per generation-engine iteration (one prefill or decode forward) spent outside
    # the model: sampling, stop checks, mask and cache bookkeeping. Measured by `earl calibrate`
    # on the runtime's own engine; 0 for datasheet profiles.
    step_overhead_s: float = 0.0
    # ---- host-side costs of the runtime's own code, measured by `earl calibrate` (phase
    # "runtime", earl/calibrate/hostcost.py) on the runtime's functions; all optional and 0 (or
    # None) for datasheet profiles and for profiles written before they existed.
    # Achieved fraction of memory bandwidth of the elementwise ops (norms, rotary, activation,
    # residual adds) inside a real eager forward, fitted jointly with op_overhead_s on whole
    # forwards; on CPU these run ~4x below a large copy. None: `memory`.
    elementwise: EfficiencyCurve | None = None
    step_seq_overhead_s: float = 0.0  # engine: per running sequence per iteration (sampling, stop checks)
    step_kv_token_s: float = 0.0  # engine: per cached token per iteration (cache copies, masks)
    turn_overhead_s: float = 0.0  # engine: per turn (generate call: padded inputs, cache, texts), fixed
    turn_seq_overhead_s: float = 0.0  # ... and per sequence of the turn
    rollout_fixed_s: float = 0.0  # per rollout: first forward after other stages
    rollout_batch_s: float = 0.0  # per engine batch of episodes: opening it, its first turn
    rollout_episode_s: float = 0.0  # per episode: environment set-up, tokenising, bookkeeping
    logprob_pass_s: float = 0.0  # per log-prob micro-batch beyond its forward (slicing, copy back)
    logprob_token_s: float = 0.0  # ... and per padded token (mask, log-softmax and gather over the vocabulary)
    train_pass_s: float = 0.0  # per training micro-batch beyond 3 forwards (loss, its backward, stats)
    train_token_s: float = 0.0  # ... and per padded token (mask, log-softmax, entropy, their backward)
    optimizer_step_s: float = 0.0  # per optimizer step, fixed (zero_grad, clip, AdamW launch)
    optimizer_tensor_s: float = 0.0  # per optimizer step, per parameter tensor held
    experience_fixed_s: float = 0.0  # experience stage: fixed per rank (its batch's tensors allocated)
    experience_seq_s: float = 0.0  # experience stage: per sequence (collating, advantages)
    experience_token_s: float = 0.0  # experience stage: per token (padded tensors built on the host)
    # (the three also price the batch each rank collates after the training dispatch:
    # CostModel.collate_s, part of the dispatch's `leavers` lead)
    dispatch_fixed_s: float = 0.0  # a dispatch's host work: planning and executing it, fixed
    # (per sample, dispatch_seq_s prices the one-process path, where the runtime re-orders rows in
    # place; across processes dispatch_path's per-piece and per-sample terms price the executor)
    dispatch_seq_s: float = 0.0  # ... and per sample delivered
    # the rollout -> experience hand-off's host work where it waits for no one (one process, or
    # onto the layout aligned with the rollout's: TransferPlan.waits_for_peers false): building
    # the episodes' rows, planning, local copies, the delivery check; fixed, per episode and per
    # token the rank holds after it (0: priced as the dispatch it is, profiles before the fit);
    # and per episode of the whole step, which every rank plans, indexes and checks
    # (`handoff_sample_s`: at N ranks each holds 1 / N of them; 0 in profiles before the fit)
    handoff_fixed_s: float = 0.0
    handoff_seq_s: float = 0.0
    handoff_token_s: float = 0.0
    handoff_sample_s: float = 0.0
    # host work right after a rollout whose weights the caches cannot hold (each decode step
    # streamed them, evicting the episodes' Python objects and tensors): the hand-off's and the
    # experience batch's host terms above are measured after a small model's rollout and cost
    # `host_cold_factor` x as much once a rank's rollout weights exceed `host_cache_bytes` (the
    # per-core cache, L2, `earl calibrate` reads from the OS). The factor is measured by `earl
    # calibrate` on the same stage code run again right after a rollout of a 68 MiB model
    # (earl.calibrate.hostcost.COLD_MODEL; until the thirty-ninth session after streaming 64 MiB
    # through a tensor, which over-stated it on an AMD EPYC VM; CPU hosts only: a GPU's decode
    # steps stream its weights through the GPU's caches). 1 / 0: never cold (datasheets, GPU
    # calibrations, profiles before it)
    host_cold_factor: float = 1.0
    host_cache_bytes: float = 0.0
    # the spread of that host work from one run to the next (a robust coefficient of variation:
    # 1.4826 x the median absolute deviation over the median, the median over `earl calibrate`'s
    # cases of the hand-off and batch's repetitions): where N ranks each do their own and the
    # stage ends with the slowest, it costs 1 + host_spread x E[the largest of N standard normal
    # draws] x as much (`CostModel.slowest_of`); 0: no term (datasheets, profiles before it)
    host_spread: float = 0.0
    # ---- host costs of the multi-process runtime's FSDP2 path, measured by `earl calibrate`
    # (phase "fsdp", earl/calibrate/fsdpfit.py) on gloo ranks running the runtime's own
    # training step and weight sync; priced only where a `zero` plan with dp > 1 runs as FSDP2
    # (CostModel.train / .reshard with fsdp=True). 0 for datasheet profiles.
    fsdp_unit_s: float = 0.0  # per FSDP unit per training micro-batch: its hooks, DTensor host work
    # and the lockstep of its gathers / reduce-scatters beyond their alpha-beta price, s
    fsdp_tensor_s: float = 0.0  # per optimizer step, per parameter tensor of the FSDP2 model beyond
    # optimizer_tensor_s: DTensor dispatch of the gradient scaling, norm, clipping and AdamW, s
    reshard_tensor_s: float = 0.0  # weight sync from FSDP2 shards: per parameter tensor gathered
    # (its share of the bucket's gather beyond the price of the gather and its round, packing it
    # into the bucket, slicing it out, the concatenation, cast and copy into the destination), s
    reshard_byte_s: float = 0.0  # ... and per byte of the fp32 shards a rank gathers (the same work's
    # per-byte part: copies, the cast, the gather's bytes beyond the link's price), s/byte
    reshard_shard_byte_s: float = 0.0  # ... and per byte of the rank's own fp32 shard (whole / dp:
    # packing it into its buckets), s/byte
    reshard_fixed_s: float = 0.0  # ... and once per sync, whatever the model (the optimizer's
    # `weights()` walk, the destination's parameter dict, the buckets' first round), s. The four
    # are fitted on the same points (2- and 4-layer and wide models at 2 and 4 ranks); with the
    # per-tensor and whole-byte terms alone those fits priced the 2-layer and the wide syncs at 2
    # ranks at x0.88 and x0.83 their measured time and the wide one at 4 ranks at x1.12 (medians
    # over 40 recorded calibrations, 16 Xeon and 24 EPYC; docs/validate-history.md, forty-first session)
    # ... and once per sync whose ranks outnumber the host_parallel cores and come to it from
    # other work: the first gather round's wake-ups of the ranks asleep in it (the runtime's sync
    # follows its ranks' training steps, which end apart; its early ranks sleep in the first
    # all-gather until the last sends). Measured by the fsdp phase on ranks reaching the sync one
    # after another, as the runtime's do (earl.calibrate.fsdpfit.STAGGER_S); a runtime dispatch's
    # rounds beyond the cores pay it too where it is larger than `DispatchPath.wake_sync_s`
    # (`DispatchPath.round_cost_s`); 0: not measured, s
    reshard_wake_s: float = 0.0
    # ... and per FSDP2 training step, what a rank does from the step's start to its first
    # collective (the dp all-reduce of the token counts, earl.runtime.trainer.train_step): the
    # learning rate, the mini-batch order and the model's `zero_grad`, a fixed part (`train_lead_s`)
    # and one per parameter tensor of the model (`train_lead_tensor_s`: FSDP2's DTensor
    # parameters, 4.3-10.5 us each in nine fits on a 2-vCPU AMD EPYC VM). The ranks that leave a
    # runtime dispatch first do it on the cores the last one still needs (`CostModel.train_lead_s`,
    # priced by earl.cost_model.dispatch where the ranks outnumber the cores). Timed by the fsdp
    # phase on the runtime's own step; 0: not measured, s
    train_lead_s: float = 0.0
    train_lead_tensor_s: float = 0.0
    # the share of its wall a rank of that weight sync computes with a core of its own (CPU over
    # wall at 2 ranks on 2 cores; the rest waits for peers); where ranks outnumber the cores they
    # fill each other's waits (earl.calibrate.hostload.overlap_factor). 1: no overlap (datasheets)
    reshard_busy: float = 1.0
    # the share of a CPU core the host terms above are a busy process's at (earl.calibrate.
    # hostload: CPU seconds per wall second, at most 1); `earl validate` scales its CPU
    # predictions by host_share / the share each step got. 1: a dedicated core (datasheets, and
    # `earl calibrate`, whose one-process probes time short calls)
    host_share: float = 1.0
    # how much longer the slowest of the processes computing at once on every core of a host
    # takes than one process alone (CPU hosts: shared caches and memory bandwidth, SMT siblings,
    # a hypervisor's vCPUs, and the slowest of several draws from the host's noise), as a ratio
    # of wall times, >= 1: `earl calibrate` times one fixed eager loop alone and on all cores at
    # once (earl.calibrate.hostload.corun_slowdown); `earl validate --nproc N` stretches the
    # stages priced by one-process constants (rollout, experience) by it. 1: a device per rank
    corun_slowdown: float = 1.0
    # the host's speed while `earl calibrate` fitted the constants: CPU seconds per iteration of
    # the host probe (earl/runtime/hostprobe.py), the median of its readings between the
    # one-process phases' cases (`host_probe_s`; 0: not measured, as in GPU and datasheet
    # profiles) and, per process count ("2", "4"), on the gloo ranks of phases fsdp and dispatch
    # between their timed repeats (`host_probe_ranks_s`: N ranks read the loop slower than one
    # process by their own contention, which a run of N ranks shares); `earl validate` records a
    # CPU run's own reading over the one for its process count
    # (earl.calibrate.validate.host_speed)
    host_probe_s: float = 0.0
    host_probe_ranks_s: dict = field(default_factory=dict)
    dispatch_path: DispatchPath = field(default_factory=DispatchPath)  # see DispatchPath
    # ---- overlap of training communication with compute: assumptions of the software stack,
    # named in every headline they move and varied by study s8
    tp_comm_overlap: float = 0.0  # fraction of tensor-parallel communication hidden under GEMMs, [0, 1]
    # how a GEMM's compute time t_c and memory time t_m combine: (t_c^p + t_m^p)^(1/p). None: max(t_c,
    # t_m), a roofline that hides all traffic under the math (calibrated profiles fit their curves so);
    # measured GEMMs near the ridge (128-1,024 tokens per shard) take up to ~1.4x that max, fitted
    # p ~1.4-1.5 on the datasheet GPU profiles (see GEMM_FITS)
    gemm_norm: float | None = None
    # rows a GEMM needs to reach its curve's efficiency: an (m x k) @ (k x n) call is priced as
    # 2mkn (1 + gemm_rows_half / m) FLOPs on the `matmul` curve. A CPU BLAS packs the k x n
    # operand on every call, and a few rows do not amortise that: at 16 rows qwen2-27m's GEMMs
    # reach ~30-47 GFLOP/s on the 2-core EPYC VM where 256 rows reach ~60-75 (fitted ~8-12 rows
    # there; docs/validate-history.md, thirteenth session). 0: efficiency depends on FLOPs alone (the
    # datasheet GPU profiles, whose small-batch penalty is `gemm_norm`'s)
    gemm_rows_half: float = 0.0
    # row count (as a string, "2") -> a multiplier on that GEMM's priced FLOPs beyond the row
    # penalty: a BLAS whose kernels for a few rows are slower than the smooth penalty says (MKL on
    # the 2-core EPYC VM: 2- and 3-row GEMMs of qwen2-27m's shapes took 1.3-2.6x the 4-row ones'
    # time; docs/validate-history.md, twenty-third session). Fitted by `earl calibrate` on its GEMMs of
    # those rows (`earl.calibrate.fit.fit_row_factors`); none: 1
    gemm_row_factors: dict = field(default_factory=dict)
    # advantage estimator (earl.runtime.advantages.AdvantageSpec.key: "grpo", "reinforce++/per-turn",
    # ...) -> [s per sample, s per token of the sample] a rank computing its advantage pays
    # (`advantage_s`); `earl calibrate` times each (earl.calibrate.dispatchfit.measure_host). An
    # estimator it did not time costs dispatch_path.sample_s, GRPO's, what the calibration's gloo
    # dispatches compute. On the 2-vCPU EPYC a 200-token sample took ~16 us under GRPO and ~51 us
    # under the runtime's default REINFORCE++ with its per-turn baseline (docs/validate-history.md,
    # twenty-fourth session)
    estimator_s: dict = field(default_factory=dict)
    dp_grad_overlap: bool = True  # data-parallel gradient reduction bucketed and overlapped with backward
    grad_bucket_bytes: float = 80e6  # gradient bytes per bucket (Megatron DDP: 40M params in bf16)

    def __post_init__(self):
        if not 0 <= self.tp_comm_overlap <= 1:
            raise ValueError(f"HardwareProfile.tp_comm_overlap must be in [0, 1], got {self.tp_comm_overlap}")
        if not 0 < self.grad_bucket_bytes < math.inf:
            raise ValueError(f"HardwareProfile.grad_bucket_bytes must be > 0, got {self.grad_bucket_bytes}")
        for n in ("op_overhead_s", "mem_reserve_bytes", "step_overhead_s", *HOST_COST_FIELDS):
            v = getattr(self, n)
            if not (0 <= v < math.inf):
                raise ValueError(f"HardwareProfile.{n} must be a finite number >= 0, got {v!r}")
        if not 0 < self.host_share <= 1:
            raise ValueError(f"HardwareProfile.host_share must be in (0, 1], got {self.host_share!r}")
        if not 0 < self.reshard_busy <= 1:
            raise ValueError(f"HardwareProfile.reshard_busy must be in (0, 1], got {self.reshard_busy!r}")
        if not 0.0 <= self.host_spread < 1.0:
            raise ValueError(f"HardwareProfile.host_spread must be a number in [0, 1), got {self.host_spread!r}")
        if not 0.5 <= self.host_cold_factor < math.inf:
            raise ValueError(f"HardwareProfile.host_cold_factor must be a finite number >= 0.5, "
                             f"got {self.host_cold_factor!r}")
        if not 0 <= self.host_cache_bytes < math.inf:
            raise ValueError(f"HardwareProfile.host_cache_bytes must be a finite number >= 0 (0: unknown), "
                             f"got {self.host_cache_bytes!r}")
        if not 1 <= self.corun_slowdown < math.inf:
            raise ValueError(f"HardwareProfile.corun_slowdown must be a finite number >= 1, "
                             f"got {self.corun_slowdown!r}")
        for n, v in (("host_probe_s", self.host_probe_s),
                     *((f"host_probe_ranks_s[{k!r}]", v) for k, v in self.host_probe_ranks_s.items())):
            if not (isinstance(v, (int, float)) and 0 <= v < math.inf):
                raise ValueError(f"HardwareProfile.{n} must be a finite number >= 0 (0: not measured), got {v!r}")
        if any(not str(k).isdigit() or int(k) < 1 or not (isinstance(v, (int, float)) and 0.1 <= v < math.inf)
               for k, v in self.gemm_row_factors.items()):
            raise ValueError(f"HardwareProfile.gemm_row_factors: keys are GEMM row counts >= 1 (\"2\"), values "
                             f"finite multipliers >= 0.1, got {dict(sorted(self.gemm_row_factors.items()))}")
        for k, v in self.estimator_s.items():
            if not (isinstance(v, (tuple, list)) and len(v) == 2 and
                    all(isinstance(x, (int, float)) and 0 <= x < math.inf for x in v)):
                raise ValueError(f"HardwareProfile.estimator_s: each estimator maps to [s per sample, s per token], "
                                 f"both finite and >= 0; got {k!r}: {v!r}")
        if any(not str(k).isdigit() or int(k) < 2 for k in self.host_probe_ranks_s):
            raise ValueError(f"HardwareProfile.host_probe_ranks_s: keys are process counts >= 2 (\"2\", \"4\"), "
                             f"got {sorted(self.host_probe_ranks_s)}")
        if not (0 <= self.mem_reserve_frac < 1):
            raise ValueError(f"HardwareProfile.mem_reserve_frac must be in [0, 1), got {self.mem_reserve_frac!r}")
        if not (isinstance(self.gemm_rows_half, (int, float)) and 0 <= self.gemm_rows_half < math.inf):
            raise ValueError(f"HardwareProfile.gemm_rows_half must be a finite number >= 0 (0: off), "
                             f"got {self.gemm_rows_half!r}")
        if self.gemm_norm is not None and not 1 <= self.gemm_norm < math.inf:
            raise ValueError(f"HardwareProfile.gemm_norm must be a number >= 1 (or null: max), got {self.gemm_norm!r}")
        unknown = set(self.collective_links) - set(COLLECTIVES)
        if unknown:
            raise ValueError(f"HardwareProfile.collective_links: unknown collective {sorted(unknown)[0]!r}; "
                             f"valid: {', '.join(COLLECTIVES)}")

    @property
    def name(self) -> str:
        return self.hardware.name

    def advantage_s(self, estimator: str | None, tokens: float) -> float:
        """Seconds one sample of `tokens` tokens costs the rank computing its advantage under
        `estimator` (an `estimator_s` key, earl.runtime.advantages.AdvantageSpec.priced_key;
        None or one not timed: dispatch_path.sample_s)."""
        if estimator is not None and estimator not in self.estimator_s and estimator.endswith(SUMMED):
            estimator = estimator[:-len(SUMMED)]  # a profile from before it was timed apart: the
            # whole estimator's price (the sums as well), an over-price by its local sums' share
        if estimator is None or estimator not in self.estimator_s:
            return self.dispatch_path.sample_s
        per_sample, per_token = self.estimator_s[estimator]
        return per_sample + per_token * tokens

    def link_for(self, collective: str) -> LinkParams:
        """The intra-node link to price `collective` with: its own fitted link if calibrated."""
        return self.collective_links.get(collective, self.intra)

    # ---- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["version"] = PROFILE_VERSION
        # JSON has no infinity: an absent controller cap is written as null
        if math.isinf(d["dispatch_path"]["controller_bw_bytes_s"]):
            d["dispatch_path"]["controller_bw_bytes_s"] = None
        return d

    def save(self, path: str | Path) -> Path:
        from earl.trace import atomic_write_text

        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    @staticmethod
    def from_dict(d: dict, source: str = "<dict>") -> HardwareProfile:
        """A profile from its JSON form; every section, key, type and range checked, each error
        one line naming `source`, the key, the bad value and what is allowed."""
        from earl.config_machinery import build, convert

        if not isinstance(d, dict):
            raise ValueError(f"{source}: a hardware profile must be a JSON object of keys to values, got "
                             f"{type(d).__name__} {str(d)[:40]!r}")
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"{source}: profile version {d.get('version')!r} is not supported "
                             f"(expected {PROFILE_VERSION})")
        known = {f.name for f in dataclasses.fields(HardwareProfile)} | {"version"}
        for k in d:
            if k not in known:
                raise unknown_name_error(f"key in {source}: profile key", str(k), known)

        def section(name: str, cls: type, optional: bool = False):
            if d.get(name) is None:
                if optional:
                    return None
                raise ValueError(f"{source}: profile is missing field {name!r}")
            return build(cls, d[name], where=source, section=name)

        def scalar(name: str, required: bool = False, default: float = 0.0) -> float:
            if name not in d:
                if required:
                    raise ValueError(f"{source}: profile is missing field {name!r}")
                return default
            return convert(name, d[name], float, where=source)

        def mapping(name: str) -> dict:
            v = d.get(name, {})
            if not isinstance(v, dict):
                raise ValueError(f"{source}: {name} must be a mapping, got {str(v)[:40]!r}")
            return v

        links = mapping("collective_links")
        try:
            return HardwareProfile(
                hardware=section("hardware", HardwareSpec),
                matmul=section("matmul", EfficiencyCurve),
                attention=section("attention", EfficiencyCurve),
                memory=section("memory", EfficiencyCurve),
                intra=section("intra", LinkParams),
                op_overhead_s=scalar("op_overhead_s", required=True),
                mem_reserve_frac=scalar("mem_reserve_frac", required=True),
                mem_reserve_bytes=scalar("mem_reserve_bytes", required=True),
                stamp=dict(mapping("stamp")),
                fit_quality=dict(mapping("fit_quality")),
                collective_links={str(k): build(LinkParams, v, where=source, section=f"collective_links.{k}")
                                  for k, v in links.items()},
                attention_decode=section("attention_decode", EfficiencyCurve, optional=True),
                step_overhead_s=scalar("step_overhead_s"),
                elementwise=section("elementwise", EfficiencyCurve, optional=True),
                dispatch_path=_dispatch_path(mapping("dispatch_path") or None, source),
                tp_comm_overlap=scalar("tp_comm_overlap", default=0.0),
                dp_grad_overlap=bool(d.get("dp_grad_overlap", True)),
                grad_bucket_bytes=scalar("grad_bucket_bytes", default=80e6),
                gemm_norm=None if d.get("gemm_norm") is None else scalar("gemm_norm"),
                gemm_rows_half=scalar("gemm_rows_half", default=0.0),
                gemm_row_factors={str(k): convert(f"gemm_row_factors.{k}", v, float, where=source)
                                  for k, v in mapping("gemm_row_factors").items()},
                estimator_s={str(k): _pair(f"estimator_s.{k}", v, source) for k, v in mapping("estimator_s").items()},
                host_share=scalar("host_share", default=1.0),
                corun_slowdown=scalar("corun_slowdown", default=1.0),
                host_cold_factor=scalar("host_cold_factor", default=1.0),
                host_cache_bytes=scalar("host_cache_bytes", default=0.0),
                host_spread=scalar("host_spread", default=0.0),
                reshard_busy=scalar("reshard_busy", default=1.0),
                host_probe_s=scalar("host_probe_s", default=0.0),
                host_probe_ranks_s={str(k): convert(f"host_probe_ranks_s.{k}", v, float, where=source)
                                    for k, v in mapping("host_probe_ranks_s").items()},
                **{k: scalar(k) for k in HOST_COST_FIELDS},
            )
        except ValueError as e:
            msg = str(e).splitlines()[0]
            raise ValueError(msg if source in msg else f"{source}: {msg}") from None


def _pair(name: str, value, source: str) -> tuple[float, float]:
    """A profile's [a, b] pair of numbers (estimator_s: s per sample, s per token)."""
    from earl.config_machinery import convert

    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"{source}: {name} must be [s per sample, s per token], got {value!r}")
    return tuple(convert(name, x, float, where=source) for x in value)


def _dispatch_path(d: dict | None, source: str = "<dict>") -> DispatchPath:
    """A profile's dispatch path, checked like every other section (a missing or null
    controller_bw_bytes_s is "no extra controller cost"); defaults for profiles written before
    it existed."""
    from earl.config_machinery import build, convert

    if not d:
        return DispatchPath()
    d = dict(d)
    bw = d.pop("controller_bw_bytes_s", None)
    path = build(DispatchPath, d, where=source, section="dispatch_path")
    if bw is None:
        return path
    return dataclasses.replace(path, controller_bw_bytes_s=convert("dispatch_path.controller_bw_bytes_s", bw, float,
                                                                   where=source))


# collectives priced by earl.cost_model.comm; the keys a profile's collective_links may have
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "p2p")

# optional float fields read with a default of 0 (profiles written before they existed)
HOST_COST_FIELDS = ("step_seq_overhead_s", "step_kv_token_s", "turn_overhead_s", "turn_seq_overhead_s",
                    "logprob_pass_s", "logprob_token_s", "train_pass_s", "train_token_s", "optimizer_step_s",
                    "optimizer_tensor_s", "experience_fixed_s", "experience_seq_s", "experience_token_s",
                    "dispatch_fixed_s",
                    "dispatch_seq_s", "handoff_fixed_s", "handoff_seq_s", "handoff_token_s", "handoff_sample_s",
                    "rollout_fixed_s", "rollout_batch_s", "rollout_episode_s",
                    "fsdp_unit_s", "fsdp_tensor_s", "reshard_tensor_s", "reshard_byte_s", "reshard_shard_byte_s",
                    "reshard_fixed_s", "reshard_wake_s",
                    "train_lead_s", "train_lead_tensor_s")


# Datasheet GPU profiles' GEMM and copy curves, fitted (least squares on log time, soft-L1;
# `python studies/s10_fidelity.py` reprints the fit's errors) to per-operator GEMM times measured
# on real GPUs: Vidur (Agrawal et al., MLSys 2024; github.com/microsoft/vidur,
# data/profiling/compute/{h100,a100}/<model>/mlp.csv, CUDA-event medians of the QKV, output, MLP
# up and down projections of Llama-2-7B and -70B per tensor-parallel shard, tp 1-8, 1-4,096
# tokens, every size the set has); Qwen-72B of the same set held out (studies/kernel_refs.py
# holds the figures). What they show: large GEMMs reach ~74% of the bf16 peak (H100 ~735 of 989
# TFLOP/s, A100 ~232 of 312), weight streaming at small M ~90% / ~83% of HBM bandwidth (less
# for the small weights of wide tensor parallelism), and near the ridge (128-1,024 tokens per
# shard) compute and memory time do not hide each other: they combine as a p-norm, p ~1.4-1.5.
# Not modelled: cuBLAS's tile and wave quantisation (a step of up to +25% just past 1,024
# tokens), which leaves a median |error| of ~5% over all sizes, ~3% at powers of two. H200: the
# H100 chip and its curves (its bandwidth from the datasheet).
GEMM_FITS: dict[str, dict] = {
    "a100-sxm-80gb": {"matmul": (0.745, 3.1e8), "memory": (0.83, 7.7e6), "gemm_norm": 1.35},
    "h100-sxm-80gb": {"matmul": (0.744, 3.3e9), "memory": (0.90, 8e6), "gemm_norm": 1.5},
    "h200-sxm-141gb": {"matmul": (0.744, 3.3e9), "memory": (0.90, 8e6), "gemm_norm": 1.5},
}
# any other GPU: the H100 class's shape
GEMM_FIT_DEFAULT = GEMM_FITS["h100-sxm-80gb"]


def slowed(profile: HardwareProfile, factor: float) -> HardwareProfile:
    """`profile` for a device `factor` times slower at everything: every rate divided by it,
    every fixed time multiplied, so every price the cost model makes from it is `factor` times
    the original's. For ranks that get a 1 / factor share of a CPU host's cores
    (earl.calibrate.validate_async: each async pool's share), or a what-if of slower devices."""
    if not (0 < factor < math.inf):
        raise ValueError(f"slowed: factor must be a finite number > 0, got {factor!r}")
    if factor == 1:
        return profile

    def link(lp: LinkParams) -> LinkParams:
        return LinkParams(alpha_s=lp.alpha_s * factor, bw_bytes_s=lp.bw_bytes_s / factor)

    hw, dp = profile.hardware, profile.dispatch_path
    hw = dataclasses.replace(hw, peak_flops=hw.peak_flops / factor, hbm_bw_bytes_s=hw.hbm_bw_bytes_s / factor,
                             intra_bw_bytes_s=hw.intra_bw_bytes_s / factor,
                             intra_latency_s=hw.intra_latency_s * factor)
    dp = dataclasses.replace(
        dp, **{k: getattr(dp, k) * factor for k in ("message_s", "object_s", "sample_s", "controller_object_s",
                                                     "round_s", "sync_s", "wake_sync_s", "reduce_s", "reduce_sync_s",
                                                     "cold_round_s", "cold_byte_s")},
        copy_bw_bytes_s=dp.copy_bw_bytes_s / factor, controller_bw_bytes_s=dp.controller_bw_bytes_s / factor,
        wire_bw_bytes_s=None if dp.wire_bw_bytes_s is None else dp.wire_bw_bytes_s / factor)
    return dataclasses.replace(
        profile, hardware=hw, intra=link(profile.intra), dispatch_path=dp,
        estimator_s={k: (a * factor, b * factor) for k, (a, b) in profile.estimator_s.items()},
        collective_links={k: link(v) for k, v in profile.collective_links.items()},
        **{k: getattr(profile, k) * factor for k in ("op_overhead_s", "step_overhead_s", *HOST_COST_FIELDS)})


def datasheet_profile(hw: HardwareSpec) -> HardwareProfile:
    """Defaults before calibration. GPU: GEMM and copy curves fitted to measured kernels
    (GEMM_FITS); attention kernels (FlashAttention-2/3 papers) reach roughly 50-70% of peak."""
    gpu = hw.name != "cpu"
    fit = GEMM_FITS.get(hw.name, GEMM_FIT_DEFAULT) if gpu else None
    return HardwareProfile(
        hardware=hw,
        matmul=(EfficiencyCurve(peak_frac=fit["matmul"][0], half_size=fit["matmul"][1]) if gpu
                else EfficiencyCurve(peak_frac=0.5, half_size=2e6)),
        attention=EfficiencyCurve(peak_frac=0.55 if gpu else 0.3, half_size=4e9 if gpu else 4e6),
        memory=(EfficiencyCurve(peak_frac=fit["memory"][0], half_size=fit["memory"][1]) if gpu
                else EfficiencyCurve(peak_frac=0.6, half_size=2e5)),
        gemm_norm=fit["gemm_norm"] if gpu else None,
        intra=LinkParams(alpha_s=hw.intra_latency_s, bw_bytes_s=0.8 * hw.intra_bw_bytes_s),
        op_overhead_s=5e-6 if gpu else 20e-6,
        mem_reserve_frac=0.08,
        mem_reserve_bytes=1.0e9 if gpu else 0.5e9,
        stamp={"source": "datasheet", "device": hw.name},
        # experience tensors are packed where they live (device memory on a GPU: a copy reads
        # and writes, so ~half the memory bandwidth); every GPU of a node packs at once
        # (views, one concatenation per message: ~1 us a piece; advantages vectorised)
        dispatch_path=DispatchPath(copy_bw_bytes_s=0.45 * hw.hbm_bw_bytes_s, object_s=1e-6, sample_s=2e-6,
                                   host_parallel=max(1, hw.gpus_per_node)),
    )


def list_profiles() -> list[str]:
    """Names loadable with `load_profile`: the datasheet catalog plus shipped measured files."""
    shipped = [p.stem for p in PROFILES_DIR.glob("*.json")]
    return sorted(set(HARDWARE_CATALOG) | set(shipped))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A profile by catalog name, shipped profile name, or JSON file path."""
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        if not p.is_file():
            raise ValueError(f"no profile file at {p}")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not valid JSON ({e})") from None
        return HardwareProfile.from_dict(d, source=str(p))
    key = str(name_or_path).lower()
    shipped = PROFILES_DIR / f"{key}.json"
    if shipped.is_file():
        return HardwareProfile.from_dict(json.loads(shipped.read_text()), source=str(shipped))
    if key in HARDWARE_CATALOG:
        return datasheet_profile(HARDWARE_CATALOG[key])
    raise unknown_name_error("hardware profile", str(name_or_path), list_profiles())


def environment_stamp(device: str, attention_backend: str = "unknown") -> dict:
    """The stamp a profile measured now would carry."""
    stamp = {
        "source": "calibrated",
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "attention": attention_backend,
    }
    try:
        import torch

        stamp["torch"] = torch.__version__
        stamp["cuda"] = torch.version.cuda or "none"
    except ImportError:
        stamp["torch"] = "none"
    return stamp


def check_stamp(profile: HardwareProfile, current: dict) -> list[str]:
    """Mismatches between a calibrated profile's stamp and the running environment; each is
    also emitted as a warning (never a silent guess)."""
    if profile.stamp.get("source") != "calibrated":
        return []
    problems = [f"{k}: profile has {profile.stamp.get(k)!r}, running {current.get(k)!r}"
                for k in ("device", "torch", "cuda") if profile.stamp.get(k) != current.get(k)]
    for p in problems:
        warnings.warn(f"profile {profile.name!r} stamp mismatch: {p}", stacklevel=2)
    return problems
