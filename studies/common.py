"""Shared helpers for the evaluation studies: arguments, output folder, CSV, figures, tables.

Every study script in this folder is a plain program (`python studies/s2_data_volume.py
--out /tmp/s2 --quick`, or `earl study s2`). It defines `run(out, quick) -> DataFrame`, which
writes `<name>.csv` and `<name>.png` into `out` and prints its key table, and ends with
`main(run, __doc__)`. Writes go through a temp file and a rename, so a failed study never
leaves half a CSV or PNG behind.

    python studies/s2_data_volume.py --quick --out /tmp/s2
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from PIL import Image  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from earl.cost_model import CostModel  # noqa: E402
from earl.cost_model.profile import with_controller_path  # noqa: E402
from earl.sim.sweep import parse_jobs, require_ray  # noqa: E402
from earl.trace import atomic_write_text  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "figures"

# The EARL paper's setting (Qwen2.5-72B-Instruct on 16 nodes x 8 H100-80GB, NVLink inside a
# node, 200 Gbps between nodes); every study starts from these and says where it departs.
MODEL = "qwen2.5-72b"
HARDWARE = "h100-sxm-80gb"
PAPER_GPUS = 128
NETWORKS = {"TCP": "tcp-200g", "RDMA": "rdma-200g"}
GIB = 2**30

console = Console(width=None if sys.stdout.isatty() else 140)


def parse_args(doc: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    first = (doc or "").strip().splitlines()[0] if doc else None
    ap = argparse.ArgumentParser(description=first)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    ap.add_argument("--quick", action="store_true", help="few points, for tests (seconds)")
    ap.add_argument("--jobs", default="auto", help="processes for the study's simulated variants: N, "
                    "'ray', or 'auto' (the core count); results equal the serial run's")
    return ap.parse_args(argv)


def gloo_study_args(doc: str | None, argv: list[str] | None, worlds: str, reps: int,
                    ops: tuple[str, ...] = ()) -> tuple[list[int], int, str | None]:
    """(process counts, timed repeats, op) of a study that times gloo ranks: `--worlds` (comma-
    separated integers >= 2, default `worlds`), `--reps` (>= 3, default `reps`) and, where the
    study times several `ops`, `--op` (default the first; None where it times one); bad values
    exit 2 with one line naming them."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--worlds", default=worlds, help=f"process counts, comma-separated (default {worlds})")
    ap.add_argument("--reps", type=int, default=reps, help=f"timed repeats (default {reps})")
    if ops:
        ap.add_argument("--op", choices=ops, default=ops[0], help=f"what to time (default {ops[0]})")
    args = ap.parse_args(argv)
    bad = f"--worlds must be integers >= 2, comma-separated, got {args.worlds!r}"
    try:
        got = [int(w) for w in args.worlds.split(",")]
    except ValueError:
        ap.error(bad)
    if not got or min(got) < 2:
        ap.error(bad)
    if args.reps < 3:
        ap.error(f"--reps must be >= 3, got {args.reps}")
    return got, args.reps, getattr(args, "op", None)


def main(run, doc: str | None, argv: list[str] | None = None) -> None:
    """Parse `--out/--quick/--jobs`, run the study, report where its files went. A study whose
    `run` takes `jobs` runs its variants in parallel (earl/sim/sweep.py)."""
    args = parse_args(doc, argv)
    try:
        jobs = parse_jobs(args.jobs)
        if jobs == "ray":
            require_ray()
    except ValueError as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise SystemExit(2) from None
    if args.quick and args.out.resolve() == DEFAULT_OUT.resolve():
        print(f"error: --quick writes reduced figures and never replaces the full ones in {DEFAULT_OUT}; "
              "pass --out another folder", file=sys.stderr)
        raise SystemExit(2)
    t0 = time.perf_counter()
    if "jobs" in inspect.signature(run).parameters:
        run(args.out, quick=args.quick, jobs=jobs)
    else:
        run(args.out, quick=args.quick)
    console.print(f"[dim]done in {time.perf_counter() - t0:.1f} s; outputs in {args.out}[/]")


def write_csv(df: pd.DataFrame, out: Path, name: str) -> Path:
    path = Path(out) / f"{name}.csv"
    atomic_write_text(path, df.to_csv(index=False, float_format="%.6g"))
    os.chmod(path, 0o644)
    return path


def save_figure(fig, out: Path, name: str, assumptions: str) -> Path:
    """Stamp the assumptions under the axes, save as PNG atomically, close the figure."""
    wrapped = textwrap.fill("Assumptions: " + " ".join(assumptions.split()), width=int(fig.get_figwidth() * 18))
    lines = wrapped.count("\n") + 1
    fig.text(0.01, 0.005, wrapped, ha="left", va="bottom", fontsize=7, color="0.3")
    fig.tight_layout(rect=(0, (0.08 + 0.125 * lines) / fig.get_figheight(), 1, 1))
    path = Path(out) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        # palette PNG: line plots need few colours; keeps committed figures ~100 KB
        with Image.open(tmp) as im:
            small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        small.save(tmp, format="PNG", optimize=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        plt.close(fig)
    return path


def fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if math.isinf(v):
            return "inf"
        if v == 0:
            return "0"
        a = abs(v)
        return f"{v:,.0f}" if a >= 1000 else f"{v:.3g}"
    return str(v)


def print_table(df: pd.DataFrame, title: str, columns: list[str] | None = None) -> None:
    cols = columns or list(df.columns)
    t = Table(title=title, title_justify="left")
    for c in cols:
        t.add_column(c, justify="left" if df[c].dtype == object else "right")
    for _, row in df[cols].iterrows():
        t.add_row(*(fmt(row[c]) for c in cols))
    console.print(t)


def object_store(cm: CostModel) -> CostModel:
    """`cm` with the single controller behind an object store (pickling, Ray-style hops) at
    0.8 GB/s: the EARL paper's "~1 TB took over 20 minutes" through verl's controller. A named
    option, not the default (earl.cost_model.profile.CONTROLLER_PATHS)."""
    return cm.with_profile(with_controller_path(cm.profile, "object-store"))


def controller_note(cm: CostModel) -> str:
    """One phrase for the assumptions footers: the dispatch path in use."""
    path, net = cm.profile.dispatch_path, cm.cluster.network
    ctrl = ("packs like any rank (no extra serialisation)" if math.isinf(path.controller_bw_bytes_s)
            else f"serialises at {path.controller_bw_bytes_s / 1e9:g} GB/s")
    return (f"dispatch priced on the dispatcher's TransferPlan (earl.cost_model.dispatch): the controller {ctrl}; "
            f"{path.message_s * 1e6:g} us per message, {path.object_s * 1e6:g} us per (sample, tensor) piece, "
            f"packing at {path.copy_bw_bytes_s / 1e12:.2g} TB/s; receiving NICs keep "
            f"{net.incast_efficiency:.0%} under incast on {net.name} (assumed)")


def human_bytes(b: float) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= k:
            return f"{b / k:.1f} {unit}"
    return f"{b:.0f} B"


def context_label(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)
