"""Fast unit tests of the experiments package: grid parsing, statistics, search space, grouping, the executor here."""

from __future__ import annotations

import numpy as np
import pytest

from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import compare, compare_table, grid, space, stats, storage
from dqn_cartpole.run_folder import RunRecord


def test_seeds_ranges_and_lists():
    assert grid.parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert grid.parse_seeds("1-2,7") == [1, 2, 7]
    for bad in ("a", "3-1", "1,1", "-2"):
        with pytest.raises(UserError):
            grid.parse_seeds(bad)


def test_grid_expands_every_combination_with_yaml_values():
    points = grid.expand([grid.parse_axis("agent.learning_rate=[1e-3,2e-3]"),
                          grid.parse_axis("network.fc_layer_params=[[32],[64,64]]")])
    assert [p.overrides for p in points] == [
        ("agent.learning_rate=1e-3", "network.fc_layer_params=[32]"),
        ("agent.learning_rate=1e-3", "network.fc_layer_params=[64, 64]"),
        ("agent.learning_rate=2e-3", "network.fc_layer_params=[32]"),
        ("agent.learning_rate=2e-3", "network.fc_layer_params=[64, 64]")]
    assert points[1].label == "learning_rate=1e-3__fc_layer_params=64_64"
    assert grid.expand([])[0].label == "base"


@pytest.mark.parametrize("text, needle", [
    ("agent.learning_rate", "expected section.key=[value"),
    ("agent.learning_rate=1e-3", "expected a list"),
    ("agent.learning_rate=[]", "empty"),
    ("learning_rate=[1]", "one dot"),
    ("training.seed=[1,2]", "--seeds"),
    ("output.root=[a,b]", "output keys"),
    ("agent.n_step=[1,1]", "twice"),
])
def test_bad_grid_entries(text, needle):
    with pytest.raises(UserError, match=needle.replace("[", r"\[")):
        grid.parse_axis(text)


def test_iqm_and_bootstrap_interval():
    assert stats.aggregate("iqm")(np.array([[1.0], [2], [3], [4], [100]])) == 3.0  # the middle 50%: 2, 3, 4
    one = stats.estimate([7.0])
    assert (one.value, one.low, one.high, one.format()) == (7.0, 7.0, 7.0, "7")
    same = stats.estimate([5.0, 5.0, 5.0], "median")
    assert (same.low, same.high) == (5.0, 5.0)
    spread = stats.estimate([10.0, 20, 30, 40, 50, 60], "median")
    assert spread.value == 35.0 and 10.0 <= spread.low < 35.0 < spread.high <= 60.0
    assert spread == stats.estimate([10.0, 20, 30, 40, 50, 60], "median")  # seeded: the same every time
    assert stats.estimate([]).format() == "-" and stats.estimate([1234.5, 2345.6]).format(1).startswith("1,790.0 [")
    line, low, high = stats.band(np.array([[1.0, 2.0], [3.0, 2.0], [5.0, 2.0]]), "mean")
    assert list(line) == [3.0, 2.0] and high[1] == low[1] == 2.0 and low[0] < 3.0 < high[0]


def test_every_bootstrap_is_seeded_and_leaves_numpys_global_generator_as_it_was():
    """rliable draws its resamples from np.random's global generator: seeded for each estimate, then put back."""
    values = np.random.default_rng(1).normal(size=40)
    first = stats.estimate(values)
    np.random.seed(123)
    before = np.random.random()
    np.random.seed(123)
    assert stats.estimate(values) == first and stats.improvement(values[:20], values[20:]) == \
        stats.improvement(values[:20], values[20:])
    assert np.random.random() == before


def test_the_per_point_statistics_and_the_profile_are_rliables():
    """The vectorised forms used inside the bootstrap give what rliable's own functions give, point by point."""
    from rliable import library, metrics

    curves = np.random.default_rng(3).uniform(0, 500, size=(7, 1, 4))
    assert stats.aggregate("iqm") is metrics.aggregate_iqm and stats.aggregate("mean") is metrics.aggregate_mean
    assert stats.aggregate("median")(np.array([[1.0], [2.0], [9.0]])) == 2.0  # across runs, not rliable's
    for name in ("iqm", "mean", "median"):
        expected = [stats.aggregate(name)(curves[:, :, i]) for i in range(4)]
        assert stats.per_point(name)(curves) == pytest.approx(expected)
    taus = np.linspace(0, 500, 11)
    assert list(stats.score_distribution(curves[:, :, 0], taus)) == list(library.score_distributions(curves[:, :, 0],
                                                                                                     taus))
    profile, low, high = stats.profiles({"a": [100.0, 200.0, 300.0]}, taus)["a"]
    assert profile[0] == 1.0 and profile[-1] == 0.0 and np.all(low <= profile) and np.all(profile <= high)


def test_space_entries_and_their_errors(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("agent.learning_rate: {low: 1e-4, high: 1e-2, log: true}\nagent.n_step: {low: 1, high: 3}\n"
                    "network.fc_layer_params: {choices: [[32], [64, 64]]}\n")
    lr, n_step, layers = space.load_space(str(path))
    assert (lr.kind, lr.low, lr.high, lr.log) == ("float", 1e-4, 1e-2, True)
    assert (n_step.kind, n_step.low, n_step.high) == ("int", 1, 3)
    assert layers.choices == ((32,), (64, 64))
    for text, needle in (("agent.learnin_rate: {low: 1, high: 2}", "did you mean 'agent.learning_rate'"),
                         ("agent.td_loss: {low: 1, high: 2}", "needs choices"),
                         ("agent.n_step: {low: 1.5, high: 3}", "integer"),
                         ("agent.learning_rate: {low: 0, high: 1, log: true}", "log range"),
                         ("training.seed: {low: 0, high: 9}", "cannot be tuned"),
                         ("agent.gamma: {low: 0.9, hi: 1}", "unknown field")):
        path.write_text(text + "\n")
        with pytest.raises(UserError, match=needle):
            space.load_space(str(path))


def test_suggested_values_round_trip_as_overrides():
    import optuna

    params = [space.Param("agent.learning_rate", "float", 1e-4, 1e-2, True),
              space.Param("network.fc_layer_params", "choice", choices=((32,), (64, 64)))]
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask()
    lr, layers = space.suggest(trial, params)
    assert lr.startswith("agent.learning_rate=") and 1e-4 <= float(lr.split("=")[1]) <= 1e-2
    assert layers in ("network.fc_layer_params=[32]", "network.fc_layer_params=[64, 64]")


def _run(lr, seed, root="r"):
    config = {"agent": {"learning_rate": lr, "gamma": 0.99}, "training": {"seed": seed},
              "output": {"root": f"/x/{seed}"}}
    return RunRecord(root=f"{root}{lr}{seed}", version=1, config=config)


def test_runs_are_grouped_by_the_keys_that_differ_ignoring_seed_and_output():
    groups = compare.group_runs([_run(1e-3, 0), _run(2e-3, 0), _run(1e-3, 1), _run(2e-3, 1)])
    assert [(g.label, len(g.runs)) for g in groups] == [("agent.learning_rate=0.001", 2),
                                                         ("agent.learning_rate=0.002", 2)]
    assert [g.label for g in compare.group_runs([_run(1e-3, 0), _run(1e-3, 1)])] == ["all runs"]


def test_storage_urls():
    assert storage.describe("postgresql://me:secret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert storage.is_rdb("postgresql+psycopg2://h/x") and not storage.is_rdb("outputs/tune/x/journal.log")
    with pytest.raises(UserError, match="unsupported"):
        storage.check_url("redis://localhost/0")
    assert storage.worker_alive(storage.worker_id()) is True
    assert storage.worker_alive("some-other-host:1:1") is None


def _many(folder, seed, lr, **extra):
    config = {"agent": {"learning_rate": lr, "gamma": lr, "n_step": lr, "epsilon_end": lr},
              "training": {"seed": seed}, **extra}
    return RunRecord(root=f"/sweeps/{folder}/s{seed}", version=1, config=config)


def test_groups_that_differ_in_many_keys_are_named_after_their_sweep_folder():
    groups = compare.group_runs([_many("fast", 0, 1.0), _many("fast", 1, 1.0), _many("slow", 0, 0.5)])
    assert [g.label for g in groups] == ["fast", "slow"]
    assert groups[0].settings == {"agent.epsilon_end": 1.0, "agent.gamma": 1.0, "agent.learning_rate": 1.0,
                                  "agent.n_step": 1.0}
    table = compare_table.markdown([compare_table.group_row(g) for g in groups], groups, [])
    assert "| key | fast | slow |" in table and "| agent.gamma | 1.0 | 0.5 |" in table


def test_single_runs_in_one_folder_are_named_after_their_own_folders():
    """Two runs side by side (e.g. outputs/default-run and outputs/tutorial-run) are not 'group outputs'."""
    a = RunRecord(root="/work/outputs/default-run", version=1, config=_many("x", 0, 1.0).config)
    b = RunRecord(root="/work/outputs/tutorial-run", version=1, config=_many("x", 0, 0.5).config)
    assert [g.label for g in compare.group_runs([a, b])] == ["default-run", "tutorial-run"]
    same_names = [RunRecord(root=f"/work/{where}/run", version=1, config=_many("x", 0, lr).config)
                  for where, lr in (("a", 1.0), ("b", 0.5))]
    assert [g.label for g in compare.group_runs(same_names)] == ["a", "b"]  # the folder that tells them apart


def test_groups_side_by_side_in_one_folder_are_lettered_with_their_keys_listed():
    runs = [RunRecord(root=f"/sweeps/grid/p{i}", version=1, config=_many("grid", 0, lr).config)
            for i, lr in enumerate((1.0, 0.5))]
    groups = compare.group_runs([runs[0], runs[1]])
    assert [g.label for g in groups] == ["/sweeps/grid/p0".rsplit("/", 1)[1], "p1"]  # each its own folder
    grid = [RunRecord(root=f"/sweeps/grid/s{seed}-{lr}", version=1, config=_many("grid", seed, lr).config)
            for seed in (0, 1) for lr in (1.0, 0.5)]
    groups = compare.group_runs(grid)
    assert [g.label for g in groups] == ["A", "B"]
    assert "| key | A | B |" in compare_table.markdown([compare_table.group_row(g) for g in groups], groups, [])


def test_keys_that_do_not_apply_to_any_run_are_not_differences():
    """Two single-process runs whose distributed sections differ are one group (the roles never ran)."""
    runs = [_run(1e-3, 0), _run(1e-3, 1)]
    runs[1].config["distributed"] = {"samples_per_insert": 64.0}
    runs[1].config["replay"] = {"backend": "tf_uniform", "prefetch": 7}
    runs[0].config["replay"] = {"backend": "tf_uniform", "prefetch": 2}
    assert [g.label for g in compare.group_runs(runs)] == ["all runs"]


def test_the_table_has_the_fixed_budget_protocols_final_policy_and_the_share_that_solves():
    """Runs that scored policy/final at their end (early stop off): its IQM over them and the share that reaches the
    solve target (the env's threshold, else the config's); runs without a score are left out of both."""
    def run(seed, score, env="CartPole-v1", target=None):
        config = {"env": {"id": env}, "evaluation": {"solve_return": target}, "training": {"seed": seed}}
        summary = {"final_policy_return": score, "final_policy_episodes": 100, "final_return": 500.0,
                   "best_return": 500.0}
        return RunRecord(root=f"/runs/s{seed}", version=1, config=config, summary=summary)

    scores = [500.0, 500.0, 391.3, 500.0, 474.9]
    groups = compare.group_runs([run(seed, score) for seed, score in enumerate(scores)] + [run(9, None)])
    row = compare_table.group_row(groups[0])
    assert row["scored"] == 5 and row["held"] == 0 and row["final policy solves"] == pytest.approx(3 / 5)
    assert row["final policy score (IQM)"].value == pytest.approx((500.0 + 500.0 + 474.9) / 3)
    table = compare_table.markdown([row], groups, [])
    assert "| final policy score (IQM) | final policy solves |" in table.splitlines()[0] + " |"
    assert table.splitlines()[2].endswith("| 3/5 (60%) |")
    assert "5 of 5 ran their whole budget" in table and "stopped on their solve" not in table
    assert "final policy solves fraction" in compare_table.csv_table([row]).splitlines()[0]
    own_target = compare_table.group_row(compare.group_runs([run(0, 300.0, target=250.0)])[0])
    assert own_target["final policy solves"] == 1.0  # the config's solve_return, not CartPole's 475
    unscored = compare_table.group_row(compare.group_runs([run(0, None)])[0])
    assert unscored["final policy solves"] is None
    assert compare_table.markdown([unscored], [], []).splitlines()[2].endswith("| - | - |")


# ---------------------------------------------------------------------------- the executor seam, here


def test_local_slots_run_a_request_and_say_how_it_ended(tmp_path):
    """`LocalSlots` as both drivers use it: room while a slot is free, "started" then "landed" with the run's own exit
    status and last error line (a config that does not exist: `train` refuses it at once, exit 2), its log where
    the request put it, and nothing left running."""
    import time

    from dqn_cartpole.experiments.executor import LocalSlots, RunRequest

    slots = LocalSlots(1, str(tmp_path / "logs"))
    request = RunRequest("a", str(tmp_path / "run"), str(tmp_path / "logs" / "a.log"), str(tmp_path / "none.yaml"))
    assert slots.room() == 1
    slots.submit(request)
    assert slots.room() == 0
    events, deadline = [], time.monotonic() + 60
    while slots.flights and time.monotonic() < deadline:
        events += slots.step(0.2)
    slots.close()
    assert [e[0] for e in events] == ["started", "landed"] and events[0][1:] == ("a", 1, None)
    ended = events[1][2]
    assert (ended.key, ended.status, ended.log_path) == ("a", 2, request.log_path)
    assert "none.yaml" in ended.error and ended.error in (tmp_path / "logs" / "a.log").read_text()
    assert slots.room() == 1 and not slots.flights and not slots.slots.workers


def test_evaluations_are_passed_on_once_each_and_a_row_being_written_waits(tmp_path):
    from dqn_cartpole.experiments.run_actor import new_evaluations

    path = str(tmp_path / "eval_metrics.csv")
    with open(path, "w") as handle:
        handle.write("env_steps,average_return\n100,9.5\n200,12\n300,\n")
    assert new_evaluations(path, 0) == ([(100, 9.5), (200, 12.0)], 2)
    with open(path, "w") as handle:  # the row written in full
        handle.write("env_steps,average_return\n100,9.5\n200,12\n300,20\n")
    assert new_evaluations(path, 2) == ([(300, 20.0)], 3)
    assert new_evaluations(path, 3) == ([], 3)
