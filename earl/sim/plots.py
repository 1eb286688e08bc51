"""PNG plots of a simulated study (matplotlib, Agg backend; no display needed).

    earl simulate --steps 10 --out /tmp/sim && ls /tmp/sim/*.png
"""

from __future__ import annotations

from pathlib import Path

LINESTYLES = ("-", "--", "-.", ":")  # policies that coincide stay visible
STAGE_COLUMNS = ("rollout_s", "experience_s", "dispatch_s", "train_s", "reshard_s", "sync_s", "restart_s")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by_policy(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["policy"], []).append(r)
    return out


def plot_throughput(rows: list[dict], path: Path) -> None:
    """Throughput per step per policy, and the context length the workload reached."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    groups = _by_policy(rows)
    for i, (label, rs) in enumerate(groups.items()):
        ax1.plot([r["step"] for r in rs], [r["throughput_tokens_per_gpu_s"] for r in rs], label=label,
                 ls=LINESTYLES[i % len(LINESTYLES)])
        ooms = [r for r in rs if r["oom_events"]]
        if ooms:
            ax1.scatter([r["step"] for r in ooms], [r["throughput_tokens_per_gpu_s"] for r in ooms],
                        marker="x", color="red", zorder=3)
    ax1.set_ylabel("trained tokens / s / GPU")
    ax1.set_title("Throughput (x: steps with OOM events)")
    ax1.legend(fontsize=8)
    first = next(iter(groups.values()))
    steps = [r["step"] for r in first]
    ax2.plot(steps, [r["context_mean"] for r in first], label="mean")
    ax2.plot(steps, [r["context_p95"] for r in first], label="p95")
    ax2.plot(steps, [r["context_max"] for r in first], label="max", alpha=0.6)
    ax2.set_ylabel("context tokens per episode")
    ax2.set_xlabel("training step")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_stages(rows: list[dict], path: Path) -> None:
    """Mean seconds per step in each stage, stacked, one bar per policy."""
    plt = _plt()
    groups = _by_policy(rows)
    labels = list(groups)
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(labels)), 4.5))
    bottom = [0.0] * len(labels)
    for col in STAGE_COLUMNS:
        vals = [sum(r.get(col) or 0.0 for r in groups[lb]) / len(groups[lb]) for lb in labels]
        ax.bar(labels, vals, bottom=bottom, label=col.removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("seconds per step (mean)")
    ax.set_title("Stage-time breakdown (restart: OOM restarts)")
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=15, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory(rows: list[dict], path: Path) -> None:
    """Smallest free fraction of GPU memory over the step's stages, per policy."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (label, rs) in enumerate(_by_policy(rows).items()):
        ax.plot([r["step"] for r in rs], [r["headroom_min"] for r in rs], label=label,
                ls=LINESTYLES[i % len(LINESTYLES)])
        ooms = [r for r in rs if r["oom_events"]]
        if ooms:
            ax.scatter([r["step"] for r in ooms], [r["headroom_min"] for r in ooms], marker="x", color="red",
                       zorder=3)
    ax.axhline(0.0, color="red", lw=0.8)
    ax.set_ylabel("memory headroom (fraction free)")
    ax.set_xlabel("training step")
    ax.set_title("Memory headroom (minimum over stages; x: steps with OOM events)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(rows: list[dict], folder: Path) -> list[Path]:
    folder = Path(folder)
    paths = [folder / "throughput.png", folder / "stages.png", folder / "memory.png"]
    plot_throughput(rows, paths[0])
    plot_stages(rows, paths[1])
    plot_memory(rows, paths[2])
    return paths
