"""The run's plots, drawn from its metrics CSVs (read with `read_run`) so they can be redrawn at any time.

- returns.png: the greedy return against iterations, env steps and wall-clock seconds, the
  min-max band across the evaluation's episodes, the collect (epsilon-greedy) episodes' mean
  return, the solve threshold, the env's best or worst possible return and policy/best marked;
- loss.png: the TD loss's mean and max over each log interval, on a log scale;
- epsilon.png: the exploration rate of the collect policy;
- q_values.png: max_a Q(s0, a) at the states the evaluation's greedy episodes start from, against
  the discounted return those episodes get (over-estimation shows as the first line above the second);
- atoms.png (a distributional agent, C51, when atoms.json exists): at a few of the Q probe's fixed states, the
  probability over the atoms of each action's return under the saved policy's weights, its expectation marked;
- priorities.png (prioritized replay, when train_metrics.csv has its columns): the importance weights' range
  (the smallest of each log interval up to 1, the batch's largest) and the mean and largest priority written;
- collectors.png (a distributed run, when roles/collector-I.csv exist): each collector's env
  steps/s and the age of its weights over time, and the learner's policy lag when logged.

Every value axis is scaled to the run's data and its env's thresholds (CartPole's returns run
0..500, Acrobot's -500..-60, MountainCar's -200..-90). No TensorFlow is imported here.
"""

from __future__ import annotations

from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")  # headless
import matplotlib.pyplot as plt  # noqa: E402

from dqn_cartpole.report.facts import RunFacts, best_eval_row, run_facts  # noqa: E402
from dqn_cartpole.run_folder import RunLayout, RunRecord, read_run  # noqa: E402
from dqn_cartpole.run_folder.atoms import Atoms, read_atoms  # noqa: E402
from dqn_cartpole.run_folder.atomic import replacing  # noqa: E402

BAND_COLOR, LINE_COLOR, BEST_COLOR, COLLECT_COLOR = "tab:blue", "tab:blue", "tab:orange", "tab:gray"
MARGIN = 0.06  # of the data's range, above and below
# (column, divisor or None for the run's train steps per iteration, axis label)
X_AXES = (("train_step", None, "iterations"), ("env_steps", 1.0, "env steps"),
          ("wall_s", 1.0, "wall-clock seconds (since the process started)"))


def rows_with(rows: list[dict], *names: str) -> list[dict]:
    """The rows where every named column has a value."""
    return [r for r in rows if all(r.get(n) not in (None, "") for n in names)]


def values(rows: list[dict], name: str, scale: float = 1.0) -> list[float]:
    return [float(r[name]) / scale for r in rows]


def value_limits(data: Sequence[float], lines: Sequence[Optional[float]] = ()) -> tuple[float, float]:
    """The (low, high) of a value axis that shows every data point and every reference line, with a margin.

    Returns starting near zero keep zero in view (CartPole: 0..500); negative ones get their own range
    (Acrobot: about -530..-40). An empty plot gets (0, 1).
    """
    points = [v for v in (*data, *lines) if v is not None]
    if not points:
        return 0.0, 1.0
    low, high = min(points), max(points)
    if 0 < low <= 0.25 * high:
        low = 0.0
    span = high - low or max(abs(high), 1.0)
    return (low if low == 0.0 else low - MARGIN * span), high + MARGIN * span


def plot_returns(record: RunRecord, facts: RunFacts, out_path: str) -> None:
    """Greedy (and collect) returns against iterations, env steps and wall-clock seconds."""
    rows = rows_with(record.eval_rows, "train_step", "env_steps", "average_return")
    collect = rows_with(record.train_rows, "train_step", "env_steps", "collect_return")
    fig, axes = plt.subplots(1, len(X_AXES), figsize=(15, 4.6), sharey=True)
    for ax, (x_name, scale, x_label) in zip(axes, X_AXES):
        _returns_panel(ax, rows, collect, record.eval_rows, facts, x_name, scale or facts.train_steps_per_iteration)
        ax.set_xlabel(x_label)
    spread = rows_with(rows, "min_return", "max_return")
    data = values(rows, "average_return") + values(spread, "min_return") + values(spread, "max_return") + values(
        collect, "collect_return")
    axes[0].set(ylim=value_limits(data, (facts.solve_return, facts.max_return, facts.min_return)),
                ylabel="return (sum of rewards in an episode)")
    episodes = f", {facts.num_eval_episodes} greedy episodes per evaluation" if facts.num_eval_episodes else ""
    fig.suptitle(f"{facts.env_id}: average return of the greedy policy{episodes}")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))  # room for the legend under the panels, clear of the data
    _save(fig, out_path, layout=False)


def _returns_panel(ax, rows: list[dict], collect: list[dict], all_rows: list[dict], facts: RunFacts, x_name: str,
                   scale: float) -> None:
    rows, collect = rows_with(rows, x_name), rows_with(collect, x_name)
    spread = rows_with(rows, "min_return", "max_return")
    if spread:
        ax.fill_between(values(spread, x_name, scale), values(spread, "min_return"), values(spread, "max_return"),
                        color=BAND_COLOR, alpha=0.2, linewidth=0, label="greedy: min-max over the episodes")
    ax.plot(values(rows, x_name, scale), values(rows, "average_return"), color=LINE_COLOR, marker="o", markersize=3,
            label="greedy: average return")
    if collect:
        ax.plot(values(collect, x_name, scale), values(collect, "collect_return"), color=COLLECT_COLOR,
                linewidth=1, alpha=0.8, label="collect episodes (epsilon-greedy): mean return per log interval")
    for level, style, label in ((facts.solve_return, "--", "solved"), (facts.max_return, ":", "max return"),
                                (facts.min_return, ":", "min return")):
        if level is not None:
            ax.axhline(level, color="tab:green" if label == "solved" else "grey", linestyle=style, linewidth=1,
                       label=f"{label} ({level:g})")
    best = best_eval_row(all_rows)
    if best is not None and best.get(x_name) not in (None, ""):
        bx, by = float(best[x_name]) / scale, float(best["average_return"])
        ax.plot([bx], [by], marker="*", markersize=14, color=BEST_COLOR, linestyle="none",
                label=f"policy/best ({by:.1f})")
    ax.grid(alpha=0.3)


def plot_loss(record: RunRecord, facts: RunFacts, out_path: str) -> None:
    """The TD loss on a log scale: its mean over each log interval, and its max."""
    rows = [r for r in rows_with(record.train_rows, "train_step", "loss") if float(r["loss"]) > 0]
    fig, ax = plt.subplots(figsize=(7, 4))
    mean_and_max_on_a_log_axis(ax, rows, facts.train_steps_per_iteration, ("loss", "mean over the log interval"),
                               ("loss_max", "max over the log interval"), alone="loss at each log")
    ax.set(ylabel="TD loss (log scale)", title=f"{facts.env_id}: training loss")
    _save(fig, out_path)


def mean_and_max_on_a_log_axis(ax, rows: list[dict], scale: int, mean: tuple[str, str], peak: tuple[str, str],
                               alone: str = "", band: bool = False) -> None:
    """A log interval's mean (a column, its label) as a line against iterations, under its largest value (the rows
    whose `peak` column is above 0; with none, the mean alone, labelled `alone`), on a log axis; `band` shades
    between the two."""
    peaks = [r for r in rows_with(rows, peak[0]) if float(r[peak[0]]) > 0]
    if peaks:
        x = values(peaks, "train_step", scale)
        if band:
            ax.fill_between(x, values(peaks, mean[0]), values(peaks, peak[0]), color="tab:red", alpha=0.15)
        ax.plot(x, values(peaks, peak[0]), color="tab:red", alpha=0.5, linewidth=1, label=peak[1])
    ax.plot(values(rows, "train_step", scale), values(rows, mean[0]), color="tab:blue", linewidth=2,
            label=mean[1] if peaks else alone)
    ax.set_yscale("log")
    ax.set_xlabel("iterations")
    ax.grid(alpha=0.3, which="both")
    if rows:
        ax.legend(loc="best", fontsize=8)


def plot_epsilon(record: RunRecord, facts: RunFacts, out_path: str) -> None:
    """The collect policy's epsilon (probability of a random action)."""
    rows = rows_with(record.train_rows, "train_step", "epsilon")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(values(rows, "train_step", facts.train_steps_per_iteration), values(rows, "epsilon"), color="tab:purple")
    ax.set(ylim=(0, 1.05), xlabel="iterations", ylabel="epsilon (probability of a random action)",
           title=f"{facts.env_id}: exploration rate of the collect policy")
    ax.grid(alpha=0.3)
    _save(fig, out_path)


def plot_q_values(record: RunRecord, facts: RunFacts, out_path: str) -> None:
    """At each evaluation: max-Q at its episodes' first states next to the discounted return they get (gamma)."""
    rows = rows_with(record.eval_rows, "train_step", "average_discounted_return")
    q_rows = rows_with(rows, "average_max_q_at_reset")
    scale = facts.train_steps_per_iteration
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(values(q_rows, "train_step", scale), values(q_rows, "average_max_q_at_reset"), color="tab:red",
            marker="o", markersize=3, label="max-Q at the episodes' first states (estimate)")
    ax.plot(values(rows, "train_step", scale), values(rows, "average_discounted_return"), color="tab:blue",
            marker="o", markersize=3, label="discounted return from those states (measured)")
    bounds = []
    for bound, label in ((facts.max_discounted_return, "max"), (facts.min_discounted_return, "min")):
        if bound is not None:
            ax.axhline(bound, color="grey", linestyle=":", linewidth=1,
                       label=f"{label} discounted return ({bound:.1f})")
            bounds.append(bound)
    data = values(q_rows, "average_max_q_at_reset") + values(rows, "average_discounted_return")
    ax.set(ylim=value_limits(data, bounds), xlabel="iterations", ylabel=f"discounted return (gamma = {facts.gamma:g})",
           title=f"{facts.env_id}: value estimate vs discounted return")
    if not data:
        ax.text(0.5, 0.5, "no Q-value data in this run's CSVs", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    if data:
        ax.legend(loc="best", fontsize=8)
    _save(fig, out_path)


def plot_priorities(record: RunRecord, facts: RunFacts, out_path: str) -> None:
    """Prioritized replay over training: left, the importance weights' range over each log interval (from its
    smallest to 1, each batch's largest); right, the mean and the largest priority written, on a log scale."""
    weights = rows_with(record.train_rows, "train_step", "importance_weight_min")
    rows = [r for r in rows_with(record.train_rows, "train_step", "priority_mean", "priority_max")
            if float(r["priority_mean"]) > 0]
    scale = facts.train_steps_per_iteration
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    x = values(weights, "train_step", scale)
    left.fill_between(x, values(weights, "importance_weight_min"), [1.0] * len(x), color=BAND_COLOR, alpha=0.2,
                      label="range over the log interval")
    left.plot(x, values(weights, "importance_weight_min"), color=LINE_COLOR, linewidth=2, label="smallest weight")
    left.set(ylim=(0, 1.05), xlabel="iterations", ylabel="importance weight (batch's largest = 1)",
             title=f"{facts.env_id}: importance weights")
    left.grid(alpha=0.3)
    left.legend(loc="best", fontsize=8)
    mean_and_max_on_a_log_axis(right, rows, scale, ("priority_mean", "mean written"),
                               ("priority_max", "largest written"), band=True)
    right.set(ylabel="priority (log scale)", title=f"{facts.env_id}: priorities written by the learner")
    _save(fig, out_path)


def prioritized(record: RunRecord) -> bool:
    """Whether the run's train log has prioritized replay's columns filled (a uniform run leaves them empty)."""
    return bool(rows_with(record.train_rows, "train_step", "importance_weight_min"))


def collector_seconds(rows_by_id: dict) -> dict:
    """Each collector's row times, in seconds since the first row of any collector (`unix_s`), so
    collectors started apart, or restarted, share one axis; older CSVs fall back to their own `wall_s`."""
    stamps = [r.get("unix_s") for rows in rows_by_id.values() for r in rows]
    if stamps and all(stamp not in (None, "") for stamp in stamps):
        start = min(float(stamp) for stamp in stamps)
        return {i: [float(r["unix_s"]) - start for r in rows] for i, rows in rows_by_id.items()}
    return {i: values(rows, "wall_s") for i, rows in rows_by_id.items()}


def plot_collectors(record: RunRecord, facts: RunFacts, out_path: str) -> None:
    """Each collector's env steps/s and weight age over time; the learner's policy lag, if logged."""
    rows_by_id = {i: rows_with(rows, "wall_s", "env_steps_per_s", "weights_age_s")
                  for i, rows in record.collector_rows.items()}
    lag_rows = rows_with(record.train_rows, "train_step", "policy_lag")
    fig, axes = plt.subplots(1, 3 if lag_rows else 2, figsize=(16 if lag_rows else 11, 4))
    seconds = collector_seconds(rows_by_id)
    for i, rows in rows_by_id.items():
        axes[0].plot(seconds[i], values(rows, "env_steps_per_s"), marker=".", label=f"collector {i}")
        axes[1].plot(seconds[i], values(rows, "weights_age_s"), marker=".", label=f"collector {i}")
    for ax, title, y_label in ((axes[0], "collection speed", "env steps/s (average since the collector started)"),
                               (axes[1], "age of each collector's weights", "seconds since its last weight pull")):
        ax.set(ylabel=y_label, xlabel="seconds since the first collector row", title=title, ylim=(0, None))
        ax.grid(alpha=0.3)
        if rows_by_id:
            ax.legend(loc="best", fontsize=8)
    if lag_rows:
        x = values(lag_rows, "train_step", facts.train_steps_per_iteration)
        axes[2].plot(x, values(lag_rows, "policy_lag"), color="tab:blue", label="mean over the sampled items")
        max_rows = rows_with(lag_rows, "policy_lag_max")
        axes[2].plot(values(max_rows, "train_step", facts.train_steps_per_iteration),
                     values(max_rows, "policy_lag_max"), color="tab:red", alpha=0.6, label="max")
        axes[2].set(xlabel="iterations", ylabel="learner train step - collecting train step",
                    title="policy lag of the learner's batches", ylim=(0, None))
        axes[2].grid(alpha=0.3)
        axes[2].legend(loc="best", fontsize=8)
    fig.suptitle(f"{facts.env_id}: {len(rows_by_id)} collector(s)")
    _save(fig, out_path)


ACTION_COLORS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:brown", "tab:olive")


def state_text(state) -> str:
    """A state's numbers, short (CartPole's: cart position, cart velocity, pole angle, pole angular velocity)."""
    return "[" + ", ".join(f"{x:+.2f}" for x in state) + "]"


def plot_atoms(atoms: Atoms, facts: RunFacts, out_path: str) -> None:
    """One panel per state: each action's probability over the atoms (a step line), its expected return dashed."""
    num_states, num_actions, _ = atoms.probabilities.shape
    fig, axes = plt.subplots(1, num_states, figsize=(3.6 * num_states, 3.4), sharey=True, squeeze=False)
    width = (atoms.support[-1] - atoms.support[0]) / max(len(atoms.support) - 1, 1)
    expected = atoms.expected_q()
    for s, ax in enumerate(axes[0]):
        for a in range(num_actions):
            color = ACTION_COLORS[a % len(ACTION_COLORS)]
            greedy = " (greedy)" if a == int(expected[s].argmax()) else ""
            ax.bar(atoms.support, atoms.probabilities[s, a], width=width, color=color, alpha=0.45,
                   label=f"action {a}: E = {expected[s, a]:.1f}{greedy}")
            ax.axvline(expected[s, a], color=color, linestyle="--", linewidth=1)
        ax.set_title(f"state {atoms.state_indices[s]}: {state_text(atoms.states[s])}", fontsize=8)
        ax.set_xlabel(f"return (gamma = {facts.gamma:g})")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=7)
    axes[0][0].set_ylabel("probability")
    step = "" if atoms.train_step is None else f", train step {atoms.train_step:,}"
    fig.suptitle(f"{facts.env_id}: the return distribution per action at {num_states} of the Q probe's states "
                 f"(policy/{atoms.policy}{step})", fontsize=10)
    _save(fig, out_path)


def _save(fig, out_path: str, layout: bool = True) -> None:
    if layout:
        fig.tight_layout()
    try:
        with replacing(out_path, ".tmp.png") as tmp:  # a reader never sees half a PNG
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)


def plot_run(layout: RunLayout, record: Optional[RunRecord] = None) -> list[str]:
    """Redraws every plot of a run folder from its CSVs; returns their paths."""
    record = record or read_run(layout.root)
    facts = run_facts(record)
    drawn = []
    for draw, path in ((plot_returns, layout.returns_plot), (plot_loss, layout.loss_plot),
                       (plot_epsilon, layout.epsilon_plot), (plot_q_values, layout.q_values_plot)):
        draw(record, facts, path)
        drawn.append(path)
    if prioritized(record):
        plot_priorities(record, facts, layout.priorities_plot)
        drawn.append(layout.priorities_plot)
    if record.collector_rows:
        plot_collectors(record, facts, layout.collectors_plot)
        drawn.append(layout.collectors_plot)
    atoms = read_atoms(layout.atoms)
    if atoms is not None:
        plot_atoms(atoms, facts, layout.atoms_plot)
        drawn.append(layout.atoms_plot)
    return drawn
