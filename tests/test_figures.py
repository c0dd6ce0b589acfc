"""The run's plots show their data: every value axis fits the data and the env's thresholds, on any env."""

import pytest

from dqn_cartpole.report import figures
from dqn_cartpole.report.facts import run_facts
from dqn_cartpole.run_folder import RunRecord


def record(env_id: str, returns: list, collect: list, gamma: float = 0.99) -> RunRecord:
    evals = [{"train_step": str(1000 * i), "env_steps": str(1000 * i + 500), "wall_s": str(10.0 + i),
              "average_return": str(r), "min_return": str(r - 20), "max_return": str(min(r + 20, 0) if r < 0 else r),
              "average_discounted_return": str(r / 10), "average_max_q_at_reset": str(r / 12)}
             for i, r in enumerate(returns)]
    trains = [{"train_step": str(500 + 1000 * i), "env_steps": str(1000 * i + 1000), "wall_s": str(10.5 + i),
               "loss": str(0.1 * (i + 1)), "loss_max": str(0.5 * (i + 1)), "collect_return": str(c), "epsilon": "0.1"}
              for i, c in enumerate(collect)]
    config = {"env": {"id": env_id}, "agent": {"gamma": gamma}, "training": {"train_steps_per_iteration": 1}}
    return RunRecord(root="/nowhere", version=1, config=config, train_rows=trains, eval_rows=evals)


@pytest.fixture
def drawn(monkeypatch):
    """The figures `plot_*` would save, kept open for inspection instead."""
    figs = []
    monkeypatch.setattr(figures, "_save", lambda fig, out_path, layout=True: figs.append(fig))
    yield figs
    for fig in figs:
        figures.plt.close(fig)


def test_value_limits_fit_the_data_and_the_lines():
    assert figures.value_limits([9.0, 500.0], [475.0]) == (0.0, 530.0)  # CartPole keeps zero in view
    low, high = figures.value_limits([-500.0, -83.0], [-100.0])  # Acrobot: a range of its own
    assert low < -500 and -83 < high < 0
    assert figures.value_limits([], []) == (0.0, 1.0)
    low, high = figures.value_limits([-120.0, -120.0])  # a flat line is still visible
    assert low < -120 < high


@pytest.mark.parametrize("env_id, returns, collect, line", [
    ("Acrobot-v1", [-500, -500, -240, -90], [-500, -430, -150], -100.0),
    ("MountainCar-v0", [-200, -200, -160, -104], [-200, -190, -140], -110.0),
    ("CartPole-v1", [9, 120, 500], [20, 180], 475.0),
])
def test_returns_plot_shows_the_curves_and_the_solve_line(drawn, env_id, returns, collect, line):
    run = record(env_id, returns, collect)
    figures.plot_returns(run, run_facts(run), "unused.png")
    (fig,) = drawn
    low, high = fig.axes[0].get_ylim()
    plotted = [float(r[c]) for r in run.eval_rows for c in ("min_return", "max_return")] + collect + [line]
    assert low <= min(plotted) and max(plotted) <= high
    lowest = 0 if min(plotted) > 0 else min(plotted)  # positive returns keep zero in view
    assert (high - low) < 1.2 * (max(plotted) - lowest)  # no wasted range: the curves fill the panel
    assert [ax.get_xlabel() for ax in fig.axes] == ["iterations", "env steps",
                                                   "wall-clock seconds (since the process started)"]
    labels = [line.get_label() for line in fig.axes[2].get_lines()]
    assert "greedy: average return" in labels
    assert "collect episodes (epsilon-greedy): mean return per log interval" in labels
    collect_line = next(l for l in fig.axes[1].get_lines() if l.get_label().startswith("collect"))
    assert list(collect_line.get_ydata()) == collect


def test_q_plot_compares_the_estimate_at_the_first_states_with_their_return(drawn):
    run = record("Acrobot-v1", [-500, -300, -90], [-500])
    figures.plot_q_values(run, run_facts(run), "unused.png")
    (fig,) = drawn
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines["max-Q at the episodes' first states (estimate)"] == [-500 / 12, -300 / 12, -90 / 12]
    assert lines["discounted return from those states (measured)"] == [-50.0, -30.0, -9.0]
    low, high = fig.axes[0].get_ylim()
    assert low <= -100 * (1 - 0.99 ** 500) / 1.0 and high < 0  # down to the min discounted return, no empty top


def test_loss_plot_draws_the_mean_and_the_max_of_each_interval(drawn):
    run = record("CartPole-v1", [9], [20, 30, 40])
    figures.plot_loss(run, run_facts(run), "unused.png")
    (fig,) = drawn
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines["mean over the log interval"] == pytest.approx([0.1, 0.2, 0.3])
    assert lines["max over the log interval"] == pytest.approx([0.5, 1.0, 1.5])
    assert fig.axes[0].get_yscale() == "log"


def test_loss_plot_of_a_log_without_the_max_draws_the_loss_alone(drawn):
    """A train log from before `loss_max` was written: one line, the loss at each log."""
    run = record("CartPole-v1", [9], [20, 30])
    for row in run.train_rows:
        row["loss_max"] = ""
    figures.plot_loss(run, run_facts(run), "unused.png")
    (fig,) = drawn
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines == {"loss at each log": pytest.approx([0.1, 0.2])}
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["loss at each log"]


def test_priorities_plot_draws_the_weights_range_and_the_priorities_written(drawn):
    run = record("CartPole-v1", [9], [20, 30])
    for row, (weight, mean, peak) in zip(run.train_rows, [(0.25, 0.9, 5.0), (0.5, 0.3, 2.0)]):
        row.update(importance_weight_min=str(weight), priority_mean=str(mean), priority_max=str(peak))
    assert figures.prioritized(run) and not figures.prioritized(record("CartPole-v1", [9], [20, 30]))
    figures.plot_priorities(run, run_facts(run), "unused.png")
    (fig,) = drawn
    weights, priorities = ({line.get_label(): list(line.get_ydata()) for line in ax.get_lines()} for ax in fig.axes)
    assert weights["smallest weight"] == pytest.approx([0.25, 0.5])
    assert priorities["mean written"] == pytest.approx([0.9, 0.3])
    assert priorities["largest written"] == pytest.approx([5.0, 2.0])
    assert fig.axes[1].get_yscale() == "log" and fig.axes[1].collections  # the band between the two
