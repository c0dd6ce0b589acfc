"""The compare plot: per group, the across-seed statistic of the return with its 95% band, seeds faint."""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dqn_cartpole.run_folder.atomic import replacing  # noqa: E402


def plot_returns(groups: Sequence, path: str, statistic_name: str) -> str:
    """Draws every `GroupCurves` (label, x, seeds x points, line, low, high) on one axes; returns `path`."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, group in enumerate(groups):
        color = colors[index % len(colors)]
        for seed_x, seed_y in group.seeds:
            ax.plot(seed_x, seed_y, color=color, alpha=0.2, linewidth=0.8)
        ax.plot(group.x, group.line, color=color, linewidth=2,
                label=f"{group.label} ({len(group.seeds)} seed{'s' if len(group.seeds) != 1 else ''})")
        ax.fill_between(group.x, group.low, group.high, color=color, alpha=0.25, linewidth=0)
    ax.set_xlabel("env steps")
    ax.set_ylabel("average return (greedy evaluation)")
    ax.set_title(f"{statistic_name.upper()} across seeds with 95% bootstrap CI")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    with replacing(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def save_optuna_axes(ax, path: str) -> str:
    """Saves the figure of an `optuna.visualization.matplotlib` axes atomically and closes it."""
    fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
    fig.set_size_inches(8, 5)
    fig.tight_layout()
    with replacing(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def close(ax) -> None:
    plt.close(ax.figure)
