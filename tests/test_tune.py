"""`tune` end to end on the smoke config: two processes share one journal-file study, a killed worker's
trial is failed by the next worker, the study is resumed with more trials; and the multi-machine
path against a real PostgreSQL server on loopback, started (and stopped) by the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from helpers import CONFIGS, REPO, run_cli

import postgres_server
from dqn_cartpole.config import load_config
from dqn_cartpole.experiments import train_worker
from dqn_cartpole.run_folder import read_run

SMOKE = os.path.join(CONFIGS, "smoke.yaml")
SPACE = "agent.learning_rate: {low: 5e-4, high: 5e-3, log: true}\ntraining.batch_size: {choices: [16, 32]}\n"
ENV = dict(os.environ, PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy")
C51 = ("--set", "agent.kind=c51", "--set", "agent.td_loss=huber")  # smoke's td_loss is DQN's squared


def tune_argv(tmp_path, trials, *extra, space_text=SPACE):
    space = tmp_path / "space.yaml"
    space.write_text(space_text)
    return ["tune", "--config", SMOKE, "--space", str(space), "--trials", str(trials), "--study", "t",
            "--set", f"output.root={tmp_path}", "--set", "video.enabled=false",
            "--set", "evaluation.stop_when_solved=true", *extra]  # a study needs runs that can solve (smoke's never do)


def start(argv):
    return subprocess.Popen([sys.executable, "-m", "dqn_cartpole", *argv], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def load(storage):
    import optuna

    return optuna.load_study(study_name="t", storage=storage)


def journal(tmp_path):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "tune" / "t" / "journal.log")))


def kill_tree(process: subprocess.Popen) -> list:
    """SIGKILLs a tune worker and its training processes (which live in their own sessions)."""
    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(tree, timeout=30)
    process.communicate(timeout=30)
    return tree


def running(process: psutil.Process) -> bool:
    """Whether `process` has not ended (a zombie has: only its adopter has not reaped it yet)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def running_trial(worker: subprocess.Popen, tmp_path, number: str) -> bool:
    """Whether the tune worker runs the trial's training (in a reused train process, which a trial's log names as
    soon as the run is handed to it)."""
    return worker.poll() is None and (tmp_path / "tune" / "t" / "logs" / f"{number}.log").is_file()


def test_two_workers_share_a_journal_study_and_it_resumes(tmp_path):
    from optuna.trial import TrialState

    workers = [start(tune_argv(tmp_path, 2)), start(tune_argv(tmp_path, 2))]
    try:
        outputs = [w.communicate(timeout=300) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-2000:]
    study = load(journal(tmp_path))
    trials = study.trials
    assert len(trials) == 2
    assert {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED}
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both processes ran trials
    for trial in trials:
        run = read_run(str(tmp_path / "tune" / "t" / "trials" / f"{trial.number:04d}"))
        assert run.config["agent"]["learning_rate"] == pytest.approx(trial.params["agent.learning_rate"])
        assert run.config["training"]["batch_size"] == trial.params["training.batch_size"]
    folder = tmp_path / "tune" / "t"
    best = load_config(str(folder / "best.yaml"))  # a full config, ready for train --config
    assert best.agent.learning_rate == pytest.approx(study.best_trial.params["agent.learning_rate"])
    assert len((folder / "trials.csv").read_text().splitlines()) == 3
    assert (folder / "history.png").stat().st_size > 0

    # A worker killed mid-trial leaves a RUNNING trial; the next worker on this host fails it. (Killed as soon as
    # the trial's run process started: what the run had done by then does not matter.)
    # Killed alone: its train process gets SIGTERM when it dies, and ends.
    killed, trainers = start(tune_argv(tmp_path, 4)), []
    try:
        deadline = time.time() + 120
        while not running_trial(killed, tmp_path, "0002") and time.time() < deadline and killed.poll() is None:
            time.sleep(0.2)
        assert running_trial(killed, tmp_path, "0002"), "trial 2 never started"
        trainers = [p for p in psutil.Process(killed.pid).children() if train_worker.WORKER_MODULE in p.cmdline()]
        assert trainers
        killed.kill()
        killed.communicate(timeout=30)
        deadline = time.time() + 60
        while any(map(running, trainers)) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(map(running, trainers)), "a train process ends with its parent"
        summary = tmp_path / "tune" / "t" / "trials" / "0002" / "summary.json"
        assert not summary.is_file() or json.loads(summary.read_text())["stopped_by"] == "SIGTERM", \
            "its run was stopped (or killed before it wrote anything), not trained to its end"
    finally:
        tree = kill_tree(killed) if killed.poll() is None else trainers
    assert not [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert load(journal(tmp_path)).trials[2].state == TrialState.RUNNING

    resumed = run_cli(*tune_argv(tmp_path, 4), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "trial 2: marked FAILED" in resumed.stderr
    trials = load(journal(tmp_path)).trials
    assert len(trials) == 4
    assert trials[2].state == TrialState.FAIL and "died" in trials[2].user_attrs["reason"]
    assert trials[3].state in (TrialState.COMPLETE, TrialState.PRUNED)


@pytest.fixture
def postgres():
    server, why = postgres_server.start()
    if server is None:
        pytest.skip(f"no PostgreSQL server can be started here: {why}")
    try:
        yield server
    finally:
        server.stop()


def test_a_study_in_postgresql_is_shared_through_the_database(tmp_path, postgres):
    import optuna
    from optuna.trial import TrialState

    proc = run_cli(*tune_argv(tmp_path, 2, "--storage", postgres.url, "--jobs", "2"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    storage = optuna.storages.RDBStorage(postgres.url)
    trials = load(storage).trials
    assert len(trials) == 2 and {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED}
    assert (tmp_path / "tune" / "t" / "best.yaml").exists() or all(t.state == TrialState.PRUNED for t in trials)
    assert not (tmp_path / "tune" / "t" / "journal.log").exists()  # the database, not the default journal
    storage.engine.dispose()


# ---------------------------------------------------------------------------- objectives and seeds


def record(solved: bool, config=None, **summary):
    from dqn_cartpole.run_folder.record import RunRecord

    config = config or {"training": {"initial_collect_steps": 1000, "num_iterations": 9000,
                                     "collect_steps_per_iteration": 1}}
    if solved:
        summary.setdefault("solved_at_iteration", 100)
    return RunRecord(root="r", version=1, config=config, summary=summary)


def test_each_objective_scores_a_solve_by_its_figure_and_an_unsolved_run_by_twice_its_budget():
    from dqn_cartpole.experiments.objectives import score

    solved = record(True, solved_env_steps=2500, solved_wall_s=7.5, solved_cpu_s=6.25, env_steps=2500,
                    wall_s=11.0, cpu_s=9.0)
    assert [score(solved, o) for o in ("env_steps", "wall_s", "cpu_s")] == [2500.0, 7.5, 6.25]
    whole = record(False, env_steps=10_000, wall_s=30.0, cpu_s=20.0)  # ran its whole budget of 10,000 env steps
    assert [score(whole, o) for o in ("env_steps", "wall_s", "cpu_s")] == [20_000.0, 60.0, 40.0]
    diverged = record(False, env_steps=2_500, wall_s=5.0, cpu_s=4.0, diverged_at_iteration=1500)  # a quarter
    assert [score(diverged, o) for o in ("env_steps", "wall_s", "cpu_s")] == [20_000.0, 40.0, 32.0]


def test_the_fixed_budget_objective_scores_the_final_policy_negated_and_a_diverged_run_by_its_last_evaluation():
    from dqn_cartpole.experiments.objectives import score, verdict

    held = record(True, final_policy_return=497.5, final_policy_episodes=100, final_return=500.0)
    assert score(held, "final_return") == -497.5
    assert verdict(held, "final_return", -497.5) == "final policy 497.5 over 100 fresh episodes"
    unsolved = record(False, final_policy_return=131.0, final_policy_episodes=100, final_return=150.0)
    assert score(unsolved, "final_return") == -131.0  # a run that never confirmed a solve is scored all the same
    diverged = record(False, final_return=42.0, diverged_at_iteration=1500)  # ended before it scored policy/final
    assert score(diverged, "final_return") == -42.0
    assert "no final policy score" in verdict(diverged, "final_return", -42.0)
    assert score(record(False), "final_return") == float("inf")  # no return at all: below any run that has one
    assert score(record(False, final_policy_return=-80.0), "final_return") == 80.0  # Acrobot's returns are negative


def test_a_fixed_budget_study_needs_runs_that_train_their_whole_budget(tmp_path):
    from dqn_cartpole.errors import UserError
    from dqn_cartpole.experiments.tune import continue_command, plan_tune

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    common = dict(config_path=SMOKE, trials=2, jobs=1, storage_url=None, study_name="t", sampler_seed=0,
                  seeds_text="0-1", objective="final_return")
    with pytest.raises(UserError, match=r"--set evaluation.stop_when_solved=true: evaluation.stop_when_solved is true, "
                                        r"so a run stops at its solve and never scores its final policy"):
        plan_tune(space_path=str(space), overrides=[f"output.root={tmp_path}", "evaluation.stop_when_solved=true"],
                  **common)
    stopping = tmp_path / "stopping.yaml"
    stopping.write_text(SPACE + "evaluation.stop_when_solved: {choices: [false, true]}\n")
    with pytest.raises(UserError, match=r"evaluation.stop_when_solved: True would let a run stop at its solve"):
        plan_tune(space_path=str(stopping), overrides=[f"output.root={tmp_path}"], **common)
    plan = plan_tune(space_path=str(space), overrides=[f"output.root={tmp_path}"], **common)  # smoke trains it all
    assert "--seeds 0,1 --objective final_return" in continue_command(plan)
    assert sorted(os.listdir(tmp_path)) == ["space.yaml", "stopping.yaml"]  # planning writes no study


def test_seeds_and_objective_are_checked_and_kept_for_the_continue_command(tmp_path):
    from dqn_cartpole.errors import UserError
    from dqn_cartpole.experiments.tune import continue_command, plan_tune

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    common = dict(config_path=SMOKE, space_path=str(space), trials=2, jobs=1, storage_url=None, study_name="t",
                  sampler_seed=0)
    solving = "evaluation.stop_when_solved=true"
    for seeds, overrides, objective, problem in (
            ("0-", [], "cpu_s", "expected seeds like 0-4"),
            ("0-4", ["training.seed=3"], "cpu_s", "give the seeds with --seeds"),
            ("0-4", [], "seconds", "--objective seconds: expected one of env_steps, wall_s, cpu_s")):
        with pytest.raises(UserError, match=problem):
            plan_tune(overrides=[f"output.root={tmp_path}", solving, *overrides], seeds_text=seeds, objective=objective,
                      **common)
    plan = plan_tune(overrides=[f"output.root={tmp_path}", solving], seeds_text="0-2,5", objective="wall_s", **common)
    assert plan.seeds == (0, 1, 2, 5) and plan.objective == "wall_s"
    assert "--seeds 0,1,2,5 --objective wall_s" in continue_command(plan)


def test_a_trial_trains_every_seed_and_scores_their_mean(tmp_path):
    """On C51, over one of its own keys (its atoms): tune drives a C51 study as it does a DQN one."""
    from dqn_cartpole.experiments.objectives import score

    proc = run_cli(*tune_argv(tmp_path, 1, "--seeds", "3,4", "--objective", "cpu_s", "--seed", "0",
                              "--set", "training.num_iterations=100", *C51,
                              space_text=SPACE + "agent.num_atoms: {choices: [11, 21]}\n"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (trial,) = load(journal(tmp_path)).trials
    folder = tmp_path / "tune" / "t" / "trials" / "0000"
    runs = [read_run(str(folder / f"s{seed}")) for seed in (3, 4)]
    assert [run.config["training"]["seed"] for run in runs] == [3, 4]
    assert all(run.config["agent"]["kind"] == "c51" for run in runs)
    assert [run.config["agent"]["num_atoms"] for run in runs] == [trial.params["agent.num_atoms"]] * 2
    for seed in (3, 4):  # the trial's atoms reached each run's network: its atoms.json has that many
        atoms = json.loads((folder / f"s{seed}" / "atoms.json").read_text())
        assert len(atoms["support"]) == trial.params["agent.num_atoms"], (seed, len(atoms["support"]))
    assert all(run.get("exit_status") == 0 for run in runs)
    assert all(run.get("solved_cpu_s") is None and run.get("cpu_s") > 0 for run in runs)  # smoke never solves
    assert trial.value == pytest.approx((score(runs[0], "cpu_s") + score(runs[1], "cpu_s")) / 2)
    assert [row["seed"] for row in trial.user_attrs["seeds"]] == [3, 4]
    assert trial.user_attrs["solved_seeds"] == "0/2" and trial.user_attrs["objective"] == "cpu_s"
    assert "s3 unsolved" in (tmp_path / "tune" / "t" / "trials.csv").read_text()


def test_a_fixed_budget_trial_scores_its_seeds_final_policies(tmp_path):
    """`--objective final_return`: each seed trains its whole budget and scores policy/final over fresh episodes; the
    trial's value is the mean of those returns, negated (the study minimises)."""
    proc = run_cli(*tune_argv(tmp_path, 1, "--seeds", "3,4", "--objective", "final_return", "--seed", "0",
                              "--set", "evaluation.stop_when_solved=false", "--set", "training.num_iterations=100",
                              "--set", "evaluation.final_episodes=5"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (trial,) = load(journal(tmp_path)).trials
    folder = tmp_path / "tune" / "t" / "trials" / "0000"
    runs = [read_run(str(folder / f"s{seed}")) for seed in (3, 4)]
    finals = [run.get("final_policy_return") for run in runs]
    assert all(final is not None for final in finals) and [r.get("final_policy_episodes") for r in runs] == [5, 5]
    assert trial.value == pytest.approx(-(finals[0] + finals[1]) / 2)
    assert [row["final_policy_return"] for row in trial.user_attrs["seeds"]] == finals
    assert f"seeds' final policies reach the solve target, their mean return {-trial.value:.1f}" in proc.stdout
    assert "unsolved" not in trial.user_attrs["per_seed"]  # smoke never confirms a solve; that is not its score
    best = (tmp_path / "tune" / "t" / "best.yaml").read_text()
    assert "the final policy's average return over fresh episodes, negated" in best.splitlines()[0]


def test_the_rainbow_space_plans_with_the_switches_and_a_bad_switch_value_is_refused(tmp_path):
    from dqn_cartpole.errors import UserError
    from dqn_cartpole.experiments.tune import plan_tune

    common = dict(config_path=os.path.join(CONFIGS, "rainbow.yaml"), trials=16, jobs=1, storage_url=None,
                  study_name=None, overrides=[f"output.root={tmp_path}", "video.enabled=false"], sampler_seed=0,
                  seeds_text="0,1")
    plan = plan_tune(space_path=os.path.join(CONFIGS, "tune", "rainbow-switches-space.yaml"), **common)
    keys = {param.key for param in plan.params}
    assert {"network.dueling", "network.noisy", "replay.priority_exponent", "replay.importance_exponent"} <= keys
    preset = plan_tune(space_path=os.path.join(CONFIGS, "tune", "rainbow-space.yaml"), **common)  # every part on
    assert {"replay.priority_exponent", "network.noisy_sigma0"} <= {p.key for p in preset.params} and not {
        "network.dueling", "network.noisy"} & {p.key for p in preset.params}
    bad = tmp_path / "space.yaml"
    bad.write_text("network.noisy: {choices: [true, 3]}\n")
    with pytest.raises(UserError, match="network.noisy: 3 is not a valid value"):
        plan_tune(space_path=str(bad), **common)
    assert os.listdir(tmp_path) == ["space.yaml"]  # planning writes no study
