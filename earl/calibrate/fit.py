"""Fit the cost model's parameters to measured times, with held-out error.

Both shapes the profile uses are the same affine law in time:

* efficiency curve  eff(x) = peak_frac * x / (x + half_size) gives
  t(x) = x / (peak * eff(x)) = half_size / R + x / R  with R = peak * peak_frac;
* alpha-beta link   t(n) = alpha + n / bw.

So one fit, t(x) = fixed_s + x / rate, serves both: `to_curve(peak)` reads it as an efficiency
curve (peak_frac = rate / peak, half_size = fixed_s * rate) and `to_link()` as a link. The fit
minimises *relative* error (every size matters, not just the largest) with scipy's
`curve_fit` and a soft-L1 loss (a shared machine produces outliers). Compute curves are fitted
under the memory roofline, t = max(fixed_s + x / rate, memory time), exactly as the cost model
prices an operator. Every fourth point in size order is held out and the error reported is
the error on those.

    python -m earl.calibrate.fit          # recovers a known curve from synthetic noisy data
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import curve_fit, minimize_scalar

from earl.cost_model.profile import EfficiencyCurve, LinkParams

MIN_FIT_POINTS = 3  # points the fit needs
MIN_HELD_POINTS = 1  # points held out to measure it
HOLDOUT_EVERY = 4  # every 4th point in size order is held out


@dataclass(frozen=True, kw_only=True)
class AffineFit:
    """t(x) = fixed_s + x / rate, fitted on `n_fit` points and checked on `n_held` others."""

    fixed_s: float  # size-independent seconds per call (latency / small-size inefficiency)
    rate: float  # asymptotic units of x per second (FLOP/s or bytes/s)
    n_fit: int  # points used by the fit
    n_held: int  # held-out points
    heldout_median_err: float  # median |pred - measured| / measured on held-out points
    heldout_max_err: float  # worst held-out relative error
    fit_median_err: float  # median relative error on the fitted points
    size_min: float  # smallest size measured (FLOPs or bytes)
    size_max: float  # largest size measured

    def predict_s(self, x: float | np.ndarray) -> float | np.ndarray:
        return self.fixed_s + np.asarray(x, dtype=float) / self.rate

    def to_curve(self, peak: float) -> EfficiencyCurve:
        """As an efficiency curve against the datasheet (or measured) `peak` rate."""
        return EfficiencyCurve(peak_frac=self.rate / peak, half_size=self.fixed_s * self.rate)

    def to_link(self) -> LinkParams:
        return LinkParams(alpha_s=self.fixed_s, bw_bytes_s=self.rate)

    def quality(self) -> dict:
        """The profile's `fit_quality` entry for this fit."""
        return {"n_fit": self.n_fit, "n_held": self.n_held,
                "heldout_median_err": round(self.heldout_median_err, 4),
                "heldout_max_err": round(self.heldout_max_err, 4),
                "fit_median_err": round(self.fit_median_err, 4),
                "rate": self.rate, "fixed_s": self.fixed_s,
                "size_min": self.size_min, "size_max": self.size_max}


def split_holdout(sizes: Sequence[float], every: int = HOLDOUT_EVERY) -> tuple[list[int], list[int]]:
    """Indices to fit and to hold out: every `every`-th point in size order (offset so the
    smallest and largest are always fitted), at least MIN_HELD_POINTS held."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    held = [order[j] for j in range(1, len(order) - 1) if j % every == every // 2]
    if not held and len(order) >= MIN_FIT_POINTS + MIN_HELD_POINTS:
        held = [order[len(order) // 2]]
    fit = [i for i in order if i not in set(held)]
    return fit, held


def _rel_errors(x: np.ndarray, t: np.ndarray, floor: np.ndarray, fixed_s: float,
                rate: float) -> np.ndarray:
    return np.abs(np.maximum(fixed_s + x / rate, floor) - t) / t


def fit_affine(sizes: Sequence[float], times_s: Sequence[float], *, floor_s: Sequence[float] | None = None,
               what: str = "curve", every: int = HOLDOUT_EVERY, order_by: Sequence[float] | None = None) -> AffineFit:
    """Fit t = max(fixed_s + x / rate, floor) (fixed_s >= 0, rate > 0) to measured
    (size, seconds) pairs. `floor_s` is a known lower bound per point (the memory-roofline
    time of a GEMM or attention call, so memory-bound points do not drag the compute curve);
    None: no floor, a plain affine fit. `order_by`: the per-point key the held-out split goes
    by (default the sizes)."""
    x_all = np.asarray(sizes, dtype=float)
    t_all = np.asarray(times_s, dtype=float)
    f_all = np.zeros_like(t_all) if floor_s is None else np.asarray(floor_s, dtype=float)
    if x_all.shape != t_all.shape or f_all.shape != t_all.shape:
        raise ValueError(f"{what}: {x_all.size} sizes, {t_all.size} times, {f_all.size} floors")
    need = MIN_FIT_POINTS + MIN_HELD_POINTS
    if x_all.size < need:
        raise ValueError(f"{what}: only {x_all.size} measured points, need at least {need} "
                         "(raise --budget-s)")
    if np.any(x_all <= 0) or np.any(t_all <= 0) or not np.all(np.isfinite(t_all)):
        raise ValueError(f"{what}: sizes and times must be positive and finite")
    fit_idx, held_idx = split_holdout(list(x_all if order_by is None else order_by), every)
    x, t, fl = x_all[fit_idx], t_all[fit_idx], f_all[fit_idx]
    # Work in units where sizes and times are O(1), so the optimiser sees a well-scaled problem.
    xs, ts = float(np.median(x)), float(np.median(t))
    xn, tn, fn = x / xs, t / ts, fl / ts
    # Start from the relative-error weighted least-squares line through the points the floor
    # does not explain (all of them when fewer than two are left), clipped to the feasible set.
    free = tn > 1.5 * fn
    if free.sum() < 2:
        free = np.ones_like(tn, dtype=bool)
    w = 1.0 / tn[free]
    a_mat = np.stack([np.ones(free.sum()), xn[free]], axis=1) * w[:, None]
    (a0, b0), *_ = np.linalg.lstsq(a_mat, tn[free] * w, rcond=None)
    b_floor = 1e-9 * max(float(np.max(tn / xn)), 1e-12)
    p0 = [max(float(a0), 0.0), max(float(b0), b_floor * 10, float(np.min(tn / xn)) * 0.5)]
    idx = np.arange(xn.size, dtype=float)

    def model(ii, aa, bb):
        i = ii.astype(int)
        return np.maximum(aa + bb * xn[i], fn[i])

    try:
        (a, b), _ = curve_fit(model, idx, tn, p0=p0, sigma=tn, bounds=([0.0, b_floor], [np.inf, np.inf]),
                              method="trf", loss="soft_l1", f_scale=0.1, max_nfev=4000)
    except RuntimeError:  # no convergence (very noisy points): keep the least-squares start
        a, b = p0
    fixed_s = float(a) * ts
    rate = xs / (float(b) * ts)
    held_err = _rel_errors(x_all[held_idx], t_all[held_idx], f_all[held_idx], fixed_s, rate)
    fit_err = _rel_errors(x, t, fl, fixed_s, rate)
    return AffineFit(fixed_s=fixed_s, rate=rate, n_fit=len(fit_idx), n_held=len(held_idx),
                     heldout_median_err=float(np.median(held_err)),
                     heldout_max_err=float(np.max(held_err)),
                     fit_median_err=float(np.median(fit_err)),
                     size_min=float(np.min(x_all)), size_max=float(np.max(x_all)))


# the row penalties `fit_gemm` tries (rows to reach the curve; 0: none)
ROWS_HALF_GRID = (0.0, *(float(v) for v in np.geomspace(0.5, 128, 33)))


def fit_gemm(flops: Sequence[float], rows: Sequence[float], times_s: Sequence[float], *,
             floor_s: Sequence[float] | None = None, what: str = "matmul fit") -> tuple[AffineFit, float]:
    """(fit, gemm_rows_half): GEMM times fitted as t = max(fixed_s + w / rate, floor) with w =
    flops x (1 + rows_half / rows), the cost model's `gemm_work`. For each rows_half on a grid
    (0 included) the affine fit in w is made on the same points (held out by FLOPs, as
    `fit_affine` holds out), and the one with the smallest median error on its fitted points
    wins; held-out points never choose it."""
    f = np.asarray(flops, dtype=float)
    r = np.asarray(rows, dtype=float)
    if r.shape != f.shape or np.any(r <= 0):
        raise ValueError(f"{what}: every GEMM needs its row count (> 0), got {r.size} for {f.size} points")
    best: list[tuple[AffineFit, float]] = []  # the best (fit, rows_half) seen so far

    def err_at(half: float) -> float:
        fit = fit_affine(f * (1.0 + half / r), times_s, floor_s=floor_s, what=what, order_by=f)
        if not best or fit.fit_median_err < best[0][0].fit_median_err:
            best[:] = [(fit, half)]
        return fit.fit_median_err

    errs = [err_at(h) for h in ROWS_HALF_GRID]
    i = int(np.argmin(errs))
    if 0 < i < len(ROWS_HALF_GRID) - 1:  # refine between the grid neighbours (in log rows)
        lo, hi = math.log(max(ROWS_HALF_GRID[i - 1], ROWS_HALF_GRID[1] / 2)), math.log(ROWS_HALF_GRID[i + 1])
        minimize_scalar(lambda x: err_at(math.exp(x)), bounds=(lo, hi), method="bounded", options={"xatol": 0.01})
    return best[0]


# GEMM row counts fitted apart (`fit_row_factors`), left out of the smooth row penalty's fit:
# a CPU BLAS runs 1-3 rows on other kernels than its packed GEMM, which no smooth penalty in
# 1 / rows follows. MKL's kernels for 2 and 3 rows ran slower than its 4-row one on the 2-core
# EPYC VM (qwen2-27m's shapes 1.3-2.6x the 4-row time, one process, cold weights;
# docs/validate-history.md, twenty-third session); on the 2-core Xeon VM 1-3 rows stream the weights at
# ~17 GB/s and 4 rows and more pack them first at ~9 GB/s (4 rows take ~2x the 3-row time), so a
# penalty fitted through 1 row as well priced >= 4 rows 20-30% low (thirty-first session)
ROW_FACTOR_ROWS = (1, 2, 3)
ROW_FACTOR_GRID = np.geomspace(0.25, 8.0, 241)


def fit_row_factors(fit: AffineFit, rows_half: float, flops: Sequence[float], rows: Sequence[float],
                    times_s: Sequence[float], floor_s: Sequence[float] | None = None) -> dict[str, float]:
    """Row count -> the multiplier on a GEMM's priced FLOPs (`HardwareProfile.gemm_row_factors`,
    on top of `rows_half`'s penalty) that gives the smallest median |log error| of t = max(fixed_s
    + factor x w / rate, floor) over the points of that row count (ROW_FACTOR_ROWS, two points
    at least); row counts with fewer points get none."""
    f = np.asarray(flops, dtype=float)
    r = np.asarray(rows, dtype=float)
    t = np.asarray(times_s, dtype=float)
    fl = np.zeros_like(t) if floor_s is None else np.asarray(floor_s, dtype=float)
    out = {}
    for n in ROW_FACTOR_ROWS:
        at = r == n
        if at.sum() < 2:
            continue
        w = f[at] * (1.0 + rows_half / n)
        pred = np.maximum(fit.fixed_s + np.outer(ROW_FACTOR_GRID, w) / fit.rate, fl[at])
        err = np.median(np.abs(np.log(t[at] / pred)), axis=1)
        out[str(n)] = round(float(ROW_FACTOR_GRID[int(np.argmin(err))]), 4)
    return out


def synthetic_times(curve: EfficiencyCurve, peak: float, sizes: Sequence[float], *,
                    noise: float = 0.0, seed: int = 0) -> list[float]:
    """Times a device following `curve` exactly would take, with optional relative noise."""
    rng = np.random.default_rng(seed)
    out = []
    for x in sizes:
        t = x / (peak * curve(x))
        out.append(t * math.exp(noise * rng.standard_normal()) if noise else t)
    return out


if __name__ == "__main__":
    true = EfficiencyCurve(peak_frac=0.72, half_size=3e9)
    peak = 989e12
    sizes = list(np.logspace(6, 13, 24))
    f = fit_affine(sizes, synthetic_times(true, peak, sizes, noise=0.03))
    got = f.to_curve(peak)
    print(f"true peak_frac {true.peak_frac}, half_size {true.half_size:.3g}; fitted "
          f"{got.peak_frac:.4f}, {got.half_size:.4g}; held-out median error "
          f"{f.heldout_median_err:.2%} (max {f.heldout_max_err:.2%})")
