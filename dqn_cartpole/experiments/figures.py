"""The compare plots: per group, the across-seed statistic of the return with its 95% band (seeds faint, each held at
its last evaluation to the end, dashed); the share of runs solved by each env step; the performance profile of the
final policies' scores (rliable's plot)."""

from __future__ import annotations

from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dqn_cartpole.run_folder.atomic import replacing  # noqa: E402

SIZE = (7, 4.2)


def colors() -> list:
    return plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _save(fig, path: str) -> str:
    fig.tight_layout()
    with replacing(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def _seeds(count: int) -> str:
    return f"{count} seed{'s' if count != 1 else ''}"


def plot_returns(groups: Sequence, path: str, statistic_name: str) -> str:
    """Draws every `GroupCurves` (label, x, seeds, line, low, high) on one axes; returns `path`. A run that stopped
    before its group's last env step is drawn held at its last evaluated return from there (dashed), as the
    statistic counts it."""
    fig, ax = plt.subplots(figsize=SIZE)
    for index, group in enumerate(groups):
        color = colors()[index % len(colors())]
        for seed_x, seed_y in group.seeds:
            ax.plot(seed_x, seed_y, color=color, alpha=0.25, linewidth=0.8)
            if seed_x[-1] < group.x[-1]:
                ax.plot([seed_x[-1], group.x[-1]], [seed_y[-1]] * 2, color=color, alpha=0.25, linewidth=0.8,
                        linestyle="--")
        ax.plot(group.x, group.line, color=color, linewidth=2, label=f"{group.label} ({_seeds(len(group.seeds))})")
        ax.fill_between(group.x, group.low, group.high, color=color, alpha=0.25, linewidth=0)
    ax.set(xlabel="env steps", ylabel="average return (greedy evaluation)",
           title=f"{statistic_name.upper()} across seeds, 95% CI; a stopped run holds its last return (dashed)")
    ax.title.set_fontsize("medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return _save(fig, path)


def plot_solved(groups: dict, end: float, path: str) -> str:
    """The share of each group's solve-checking runs solved by each env step (`groups`: label -> (each run's env
    steps to its solve, inf if never; how many checked)), as a step line to `end`."""
    fig, ax = plt.subplots(figsize=SIZE)
    for index, (label, (steps, checked)) in enumerate(groups.items()):
        if not checked:
            continue
        solved = np.sort([s for s in steps if np.isfinite(s)])
        x = np.concatenate([[0.0], solved, [max(end, solved[-1] if solved.size else 0.0)]])
        y = np.concatenate([[0.0], np.arange(1, solved.size + 1) / checked, [solved.size / checked]])
        ax.step(x, y, where="post", color=colors()[index % len(colors())], linewidth=2,
                label=f"{label} ({solved.size} of {checked} solved)")
    ax.set(xlabel="env steps", ylabel="fraction of runs solved", ylim=(-0.03, 1.03),
           title="Runs solved (confirmed by the solve check) by each env step")
    ax.title.set_fontsize("medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    return _save(fig, path)


PROFILE_POINTS = 101


def plot_profile(scores: dict, target: Optional[float], path: str) -> str:
    """rliable's performance profile of each group's final policy scores: the fraction of its runs scoring above
    each return tau, with its 95% bootstrap band; the solve target marked."""
    from dqn_cartpole.experiments import stats

    values = [v for group in scores.values() for v in group]
    ends = values + ([target] if target is not None else [])
    low, high = (min(ends), max(ends)) if ends else (0.0, 1.0)
    margin = 0.1 * (high - low) or 1.0  # from below the lowest score or the target: where the profiles part
    taus = np.linspace(low - margin, high, PROFILE_POINTS)
    found = stats.profiles(scores, taus)
    fig, ax = plt.subplots(figsize=SIZE)
    palette = {label: colors()[i % len(colors())] for i, label in enumerate(scores)}
    if found:
        from rliable import plot_utils  # pylint: disable=import-outside-toplevel

        plot_utils.plot_performance_profiles({k: v[0] for k, v in found.items()}, taus,
                                             {k: np.stack([v[1], v[2]]) for k, v in found.items()}, ax=ax,
                                             colors={k: palette[k] for k in found}, xlabel="final policy score "
                                             "(average return over fresh episodes) tau",
                                             ylabel="fraction of runs scoring above tau", labelsize="medium",
                                             ticklabelsize="small")
        handles, labels = ax.get_legend_handles_labels()  # the profiles' lines (their bands have no label)
        ax.legend(handles, [f"{k} ({_seeds(len(scores[k]))})" for k in labels], fontsize="small", loc="lower left")
    else:
        ax.text(0.5, 0.5, "no run has a scored final policy", ha="center", va="center", transform=ax.transAxes)
    if target is not None:
        ax.axvline(target, color="#555", linestyle=":", linewidth=1)
    ax.set_title("Performance profile of the final policies, 95% CI (rliable)", fontsize="medium")
    return _save(fig, path)


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
