"""Fit the profile's intra-node link (alpha-beta) to measured collectives.

The cost model prices collectives with the ring/tree formulas of `earl.cost_model.comm` on a
link. Each op's link is fitted *through its formula*: the (alpha, bw) pair minimising the
relative error of predicted vs. measured time over the message sizes (every fourth held out).
Point-to-point gives the profile's `intra` link (transfers, dispatch); the others go to
`HardwareProfile.collective_links` (gloo's all-reduce, for one, is far slower than its p2p).

    OMP_NUM_THREADS=1 python -m earl.calibrate.linkfit     # 2 gloo ranks, fit, print
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from earl.calibrate.collectives import OPS, CollectiveResult, run_collectives
from earl.calibrate.fit import fit_affine, split_holdout
from earl.cost_model import comm
from earl.cost_model.profile import LinkParams

# our op names -> earl.cost_model.comm collective names
COMM_NAMES = {"p2p": "p2p", "all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
              "all_to_all": "alltoall"}


@dataclass(frozen=True, kw_only=True)
class OpLink:
    """One op's link, fitted through the cost model's formula for that op."""

    link: LinkParams  # alpha-beta such that comm.collective_s(op, ...) matches the measurement
    heldout_median_err: float  # held-out relative error through the formula
    heldout_max_err: float
    fit_median_err: float  # on the fitted points
    n_fit: int
    n_held: int


@dataclass(frozen=True, kw_only=True)
class LinkFit:
    """Per-op links; `link` (the profile's `intra`) is the point-to-point one."""

    ops: dict[str, OpLink]  # our op name (OPS) -> its link
    world: int  # ranks measured
    backend: str  # gloo | nccl

    @property
    def link(self) -> LinkParams:
        return (self.ops.get("p2p") or next(iter(self.ops.values()))).link

    @property
    def collective_links(self) -> dict[str, LinkParams]:
        """For HardwareProfile.collective_links, keyed by earl.cost_model.comm names."""
        links = {COMM_NAMES[op]: ol.link for op, ol in self.ops.items()}
        if "allgather" in links:  # same formula; a benchmark from before 2026-12-07 timed no reduce-scatter
            links.setdefault("reducescatter", links["allgather"])
        return links

    def quality(self) -> dict:
        return {"world": self.world, "backend": self.backend,
                **{op: {"alpha_s": ol.link.alpha_s, "bw_bytes_s": ol.link.bw_bytes_s,
                        "n_fit": ol.n_fit, "n_held": ol.n_held,
                        "heldout_median_err": round(ol.heldout_median_err, 4),
                        "heldout_max_err": round(ol.heldout_max_err, 4),
                        "fit_median_err": round(ol.fit_median_err, 4)}
                   for op, ol in self.ops.items()}}


def predict_s(op: str, nbytes: float, world: int, link: LinkParams) -> float:
    """The cost model's time for one measured op; `nbytes` is one rank's message
    (all-gather's formula takes the gathered result, `world` times larger; reduce-scatter's the
    whole tensor reduced, which its message is)."""
    name = COMM_NAMES[op]
    size = nbytes * world if op == "all_gather" else nbytes
    return comm.collective_s(name, size, world, link)


def fit_op_link(op: str, points: list[tuple[int, float]], world: int) -> OpLink:
    """Fit (alpha, bw) so the comm formula for `op` reproduces `points` [(bytes, seconds)]."""
    fit_idx, held_idx = split_holdout([b for b, _ in points])
    if len(fit_idx) < 3 or not held_idx:
        raise ValueError(f"{op} fit: only {len(points)} message sizes measured, need at least 4 "
                         "(raise --budget-s)")
    start = fit_affine([b for b, _ in points], [t for _, t in points], what=f"{op} fit")
    x0 = [math.log(max(start.fixed_s, 1e-7)), math.log(start.rate)]

    def rel_log(p, idx):
        link = LinkParams(alpha_s=math.exp(p[0]), bw_bytes_s=math.exp(p[1]))
        return np.array([math.log(predict_s(op, points[i][0], world, link) / points[i][1]) for i in idx])

    sol = least_squares(rel_log, x0, args=(fit_idx,), loss="soft_l1", f_scale=0.1, method="trf")
    link = LinkParams(alpha_s=math.exp(sol.x[0]), bw_bytes_s=math.exp(sol.x[1]))

    def rel(idx):
        return np.abs(np.expm1(rel_log(sol.x, idx)))

    held, fitted = rel(held_idx), rel(fit_idx)
    return OpLink(link=link, heldout_median_err=float(np.median(held)),
                  heldout_max_err=float(np.max(held)), fit_median_err=float(np.median(fitted)),
                  n_fit=len(fit_idx), n_held=len(held_idx))


def fit_link(res: CollectiveResult) -> LinkFit:
    ops = {op: fit_op_link(op, res.times[op], res.world) for op in OPS if res.times.get(op)}
    if not ops:
        raise ValueError("collective fit: nothing measured (raise --budget-s)")
    return LinkFit(ops=ops, world=res.world, backend=res.backend)


if __name__ == "__main__":

    lf = fit_link(run_collectives(budget_s=4.0))
    for op, ol in lf.ops.items():
        print(f"{op:14s} alpha {ol.link.alpha_s * 1e6:7.1f} us  bw {ol.link.bw_bytes_s / 1e9:6.2f} GB/s  "
              f"held-out error {ol.heldout_median_err:.1%} (max {ol.heldout_max_err:.1%})")
