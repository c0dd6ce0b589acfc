"""The run's plots, drawn from its metrics CSVs so they can be redrawn at any time."""

from __future__ import annotations

import os
from typing import Optional

import matplotlib

matplotlib.use("Agg")  # headless
import matplotlib.pyplot as plt  # noqa: E402

from dqn_cartpole.run_folder.layout import RunLayout  # noqa: E402
from dqn_cartpole.run_folder.atomic import replacing  # noqa: E402
from dqn_cartpole.run_folder.metrics import column, read_csv  # noqa: E402


def plot_returns(eval_csv: str, out_path: str, max_return: Optional[float], title: str = "") -> None:
    """Average greedy return against train iterations, with the env's maximum as a line."""
    rows = read_csv(eval_csv)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(column(rows, "train_step"), column(rows, "average_return"), marker="o", markersize=3)
    if max_return is not None:
        ax.axhline(max_return, color="grey", linestyle="--", linewidth=1, label=f"max return ({max_return:g})")
        ax.legend(loc="lower right")
    ax.set_xlabel("Iterations")
    ax.set_ylabel("Average Return")
    ax.set_title(title or "Average return (greedy policy)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _save(fig, out_path)


def plot_loss(train_csv: str, out_path: str, title: str = "") -> None:
    """Training loss on a log scale."""
    rows = [r for r in read_csv(train_csv) if r.get("loss") not in (None, "") and float(r["loss"]) > 0]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(column(rows, "train_step"), column(rows, "loss"), linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("Iterations")
    ax.set_ylabel("TD loss")
    ax.set_title(title or "Training loss")
    ax.grid(alpha=0.3, which="both")
    _save(fig, out_path)


def _save(fig, out_path: str) -> None:
    fig.tight_layout()
    try:
        with replacing(out_path, ".tmp.png") as tmp:  # a reader never sees half a PNG
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)


def plot_run(layout: RunLayout, max_return: Optional[float], env_id: str = "") -> list[str]:
    """Redraws both plots of a run folder; returns their paths."""
    plot_returns(layout.eval_metrics, layout.returns_plot, max_return, title=f"{env_id} average return".strip())
    plot_loss(layout.train_metrics, layout.loss_plot, title=f"{env_id} training loss".strip())
    return [layout.returns_plot, layout.loss_plot]
