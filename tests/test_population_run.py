"""`train --population K` end to end: K complete run folders that `compare` reads, a SIGKILL then `--resume`, a seed
that solves early and stops training while the others go on, and the refusals (one line, exit 2, nothing written)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import pytest

from helpers import REPO, cli_env, rows, run_cli

SMOKE = os.path.join(REPO, "dqn_cartpole", "configs", "smoke.yaml")


def newest_checkpoint_state(pop: str) -> dict:
    newest = sorted(glob.glob(os.path.join(pop, "checkpoints", "ckpt-*")))[-1]
    with open(os.path.join(newest, "state.json"), encoding="utf-8") as handle:
        return json.load(handle)


def summary(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory):
    """A population of 3 on the smoke config, SIGKILLed during its second checkpoint, then resumed to its end."""
    pop = str(tmp_path_factory.mktemp("population") / "pop")
    killed = run_cli("train", "--population", "3", "--config", SMOKE, "--output-dir", pop, "--quiet",
                     env=cli_env(DQN_CARTPOLE_TEST_KILL="checkpoint-write:2"), timeout=240)
    resumed = run_cli("train", "--resume", pop, "--quiet", timeout=240)
    return pop, killed, resumed


def test_a_killed_population_resumes_to_three_complete_run_folders(killed_then_resumed):
    pop, killed, resumed = killed_then_resumed
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming the population" in resumed.stdout + resumed.stderr
    for seed in (0, 1, 2):
        run_dir = os.path.join(pop, f"s{seed}")
        done = summary(run_dir)
        assert done["exit_status"] == 0 and done["iterations"] == 300 and done["resumed_from"]
        assert done["train_steps"] == 300 and done["population"]["index"] == seed
        for name in ("config.yaml", "train_metrics.csv", "eval_metrics.csv", "report.html",
                     "plots/returns.png", "policy/final", "policy/best"):
            assert os.path.exists(os.path.join(run_dir, name)), name
        steps = [int(row["train_step"]) for row in rows(os.path.join(run_dir, "train_metrics.csv"))]
        assert steps == list(range(50, 301, 50))  # the rows after the last checkpoint were not kept twice
        evaluated = [int(row["train_step"]) for row in rows(os.path.join(run_dir, "eval_metrics.csv"))]
        assert evaluated == [0, 100, 200, 300]
    assert os.path.exists(os.path.join(pop, "s0", "videos", "trained-agent.mp4"))  # the first seed's only
    assert not os.path.exists(os.path.join(pop, "s1", "videos"))


def test_each_member_policy_loads_alone_and_compare_reads_them(killed_then_resumed, tmp_path):
    """In this process (no start-up to pay): each seed's policy/final is a SavedModel of its own, and `compare`
    reads the population folder as three runs of one config."""
    import tensorflow as tf
    from tf_agents.trajectories import time_step as ts

    import dqn_cartpole as dq

    pop = killed_then_resumed[0]
    for seed in (0, 2):
        policy = tf.saved_model.load(os.path.join(pop, f"s{seed}", "policy", "final"))
        action = policy.action(ts.restart(tf.zeros([1, 4]), batch_size=1)).action.numpy()
        assert action.shape == (1,) and action[0] in (0, 1)
    comparison = dq.compare([pop], tmp_path / "cmp")
    assert len(comparison.cells) == 1 and comparison.cells[0][1] == "3", comparison.table


def test_a_seed_that_solves_stops_training_while_the_others_go_on(tmp_path):
    """Seeds 0 and 1 reach the (lowered) solve target at iteration 250, seed 2 never: 0 and 1 stop there, and
    their train-step counts stay at 250 while seed 2 trains to 1000."""
    pop = str(tmp_path / "pop")
    done = run_cli("train", "--population", "3", "--set", "training.num_iterations=1000",
                   "--set", "evaluation.solve_return=200", "--set", "evaluation.solve_margin=0",
                   "--set", "evaluation.solve_episodes=20", "--set", "video.enabled=false",
                   "--set", "training.checkpoint_interval=250", "--output-dir", pop, "--quiet", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    solved = {seed: summary(os.path.join(pop, f"s{seed}")) for seed in (0, 1, 2)}
    assert [solved[s]["solved_at_iteration"] for s in (0, 1, 2)] == [250, 250, None]
    assert [solved[s]["train_steps"] for s in (0, 1, 2)] == [250, 250, 1000]
    final = newest_checkpoint_state(pop)  # the population's last checkpoint, at iteration 1000
    assert final["iteration"] == 1000
    assert [final["seeds"][str(s)]["train_steps"] for s in (0, 1, 2)] == [250, 250, 1000]
    assert max(int(r["train_step"]) for r in rows(os.path.join(pop, "s0", "train_metrics.csv"))) <= 250


@pytest.mark.parametrize("overlap, taken_in", [("process", 300), ("inline", 250)])
def test_an_evaluation_beside_the_training_decides_a_fixed_number_of_iterations_later(tmp_path, overlap, taken_in):
    """With `evaluation.overlap: process` (the default) the seeds' episodes are played in a child process while the
    population trains on, and each outcome is taken in 50 iterations later (`evaluation_lag`): seeds 0 and 1 reach
    the target with the weights of iteration 250, which are policy/final and the solve's, and stop at 300. In line,
    they stop at 250."""
    pop = str(tmp_path / "pop")
    done = run_cli("train", "--population", "3", "--set", "training.num_iterations=1000",
                   "--set", "evaluation.solve_return=200", "--set", "evaluation.solve_margin=0",
                   "--set", "evaluation.solve_episodes=20", "--set", "video.enabled=false",
                   "--set", f"evaluation.overlap={overlap}", "--output-dir", pop, "--quiet", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    solved = [summary(os.path.join(pop, f"s{seed}")) for seed in (0, 1)]
    assert [s["solved_at_iteration"] for s in solved] == [250, 250]
    assert [s["train_steps"] for s in solved] == [taken_in, taken_in]
    for seed, done in zip((0, 1), solved):
        with open(os.path.join(pop, f"s{seed}", "policy", "final", "policy_info.json"), encoding="utf-8") as handle:
            info = json.load(handle)
        assert info["train_step"] == 250 and info["iteration"] == 250 and info["solved"], info
        evaluated = rows(os.path.join(pop, f"s{seed}", "eval_metrics.csv"))
        # each row names its copy's train step and env steps, not those of the iteration it was taken in at
        assert [int(row["train_step"]) for row in evaluated] == [0, 250]
        assert done["solved_env_steps"] == int(evaluated[-1]["env_steps"]) == info["env_steps"]
        assert (done["env_steps"] > done["solved_env_steps"]) == (taken_in > 250)
    where = solved[0]["population"]["phases"]["parallel"]
    assert ("evaluations (another process)" in where) == (overlap == "process"), where


@pytest.mark.parametrize("args, says", [
    (["--set", "agent.kind=c51"], "--population: agent.kind: c51"),
    (["--set", "replay.backend=reverb"], "--population: replay.backend: reverb"),
    (["--set", "network.dueling=true"], "--population: network.dueling"),
    (["--track", "mlflow"], "--population: tracking.backend"),
    (["--topology", "local"], "--population: trains in one process"),
    (["--video-seeds", "7"], "--video-seeds: 7 is not one of the population's seeds"),
])
def test_what_a_population_cannot_run_is_refused_in_one_line(tmp_path, args, says):
    pop = tmp_path / "pop"
    refused = run_cli("train", "--population", "2", "--output-dir", str(pop), *args, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and says in refused.stderr, refused.stderr
    assert not pop.exists()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_a_full_disk_is_one_line_with_the_resume_command(tmp_path):
    """A 3 MB tmpfs (in a private mount namespace) fills up under the population's replay and checkpoints."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=3m tmpfs {mount}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    pop = mount / "pop"
    train = (f"{sys.executable} -m dqn_cartpole train --quiet --population 2 --config {SMOKE} "
             f"--set video.enabled=false --set replay.capacity=100000 --output-dir {pop}")
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=3m tmpfs {mount} && exec {train}"],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy"),
                          capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert len(errors) == 1 and "disk full" in errors[0] and f"train --resume {pop}" in errors[0], proc.stderr
