"""Bounded "it really learns" tests: the tutorial's settings solve CartPole-v0, the default config CartPole-v1.

The runs train in this process through the Python API (`dqn_cartpole.train`), one after another, which saves each
one TensorFlow's import in a new process; one default-config run is also a `python -m dqn_cartpole train` process,
and the same run trained here afterwards must solve at the same env step, with the same evaluations.
"""

from __future__ import annotations

import json
import os

import pytest

from helpers import run_cli

import dqn_cartpole as dq

TIMED = ("wall_s",)  # the eval columns that hold seconds


@pytest.mark.slow
@pytest.mark.parametrize("backend, sampling", [("tf_uniform", "direct"), ("py_uniform", "direct")])
def test_tutorial_settings_reach_195_on_cartpole_v0(tmp_path, backend, sampling):
    # The tutorial's hyperparameters; 10,000 of the tutorial's 20,000 iterations is the budget.
    # The uniform buffers are read in program order (direct), after each iteration's write, so these runs are
    # reproducible (tests/test_replay.py checks py_uniform's; it was not before, and once reached 191.2). Reverb
    # (read through tf.data, not reproducible) learns in tests/test_py_driver.py (the tutorial's own
    # PyDriver loop on Reverb) and in the default-config test below: with the tutorial's gamma 1 and a
    # target network updated every step, a compiled Reverb run reached 200, 191 and 113 in 3 runs.
    run = dq.train("tutorial", tmp_path / "run", progress=False, overrides={
        "training.num_iterations": 10000, "replay.backend": backend, "replay.sampling": sampling,
        # the compiled driver (tests/test_py_driver.py runs the tutorial's PyDriver loop to 195)
        "collection.driver": "compiled", "video.enabled": False,
        # it stops at a confirmed solve (100 fresh episodes); one that is never confirmed runs the whole budget
        "evaluation.stop_when_solved": True})
    assert max(run.eval_metrics["average_return"]) >= 195


# The default config (3-step double DQN) switched to a backend with one key: replay.sampling follows the backend.
# Solved means 475 averaged over 100 fresh greedy episodes. The budget is the default's 30,000 iterations: the
# default solves seeds 0-9 in 2,500-18,500 env steps, and a Reverb run (read through tf.data, not reproducible)
# once missed at 20,000 (best 455.9).
DEFAULT = {"training.num_iterations": 30000, "video.enabled": False, "output.tensorboard": False}


def assert_solved(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as handle:
        summary = json.load(handle)
    assert summary["solved_at_iteration"] is not None, f"not solved; best {summary['best_return']}"
    with open(os.path.join(run_dir, "policy", "final", "policy_info.json")) as handle:
        info = json.load(handle)
    assert info["average_return"] >= 475 and info["episodes"] == 100
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["py_uniform", "reverb"])
def test_default_config_with_n_step_targets_solves_cartpole_v1_on_every_backend(tmp_path, backend):
    run = dq.train(None, tmp_path / "run", progress=False, overrides={**DEFAULT, "replay.backend": backend})
    assert_solved(run.path)


# The fixed-budget protocol (issue 37): the early stop off, a fixed budget, and policy/final (the weights at the last
# step) must still solve. Seed 125 confirms its solve at iteration 4,750; trained on from there (main at d42e41e, with
# the target's Polyak averaging but no hold), its evaluations swung between 150 and 500 and policy/final scored 201.4
# over 100 fresh episodes at this budget: the default forgot after its solve. Holding the weights that passed the
# check (agent.solved_learning_rate: 0) keeps it at 492.1. (Seed 102 at 12,000, this test before, held either way.)
# This test shares its two runs with the check that a run in this process trains as a fresh process does (it
# stopped at the solve before).
FIXED_SEED, FIXED_BUDGET = 125, 10000
FIXED = {**DEFAULT, "training.seed": FIXED_SEED, "training.num_iterations": FIXED_BUDGET,
         "evaluation.stop_when_solved": False}


@pytest.mark.slow
def test_default_config_holds_its_solve_for_a_fixed_budget_and_a_run_in_this_process_trains_the_same(tmp_path):
    """The default on tf_uniform, early stop off: its final policy solves on 100 fresh episodes (an outside check,
    `Run.evaluate`, and the run's own score in policy_info.json), its first confirmed solve is marked, and the same
    run trained in this process afterwards confirms that solve at the same env step, with the same evaluations."""
    fresh = str(tmp_path / "fresh")
    result = run_cli("train", "--output-dir", fresh, "--quiet", *[a for key, value in FIXED.items()
                                                                   for a in ("--set", f"{key}={value}")], timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    outside = dq.Run.open(fresh).evaluate(100, final=True, seed=1_000_000)
    assert outside.mean >= 475, f"policy/final after {FIXED_BUDGET} iterations: {outside}"
    expected = assert_solved(fresh)
    assert expected["iterations"] == FIXED_BUDGET and expected["final_policy_episodes"] == 100
    held = ("the weights at the last step: those that passed the solve check at iteration "
            f"{expected['solved_at_iteration']:,}")
    assert expected["policies"]["final"]["what"].startswith(held)  # held since (agent.solved_learning_rate 0)
    here = dq.train(None, tmp_path / "here", progress=False, overrides=FIXED)  # after the runs above, if any
    summary = assert_solved(here.path)
    for key in ("solved_env_steps", "solved_at_iteration", "solved_return", "env_steps", "best_return",
                "final_policy_return"):
        assert summary[key] == expected[key], key
    fresh_evals = dq.Run.open(fresh).eval_metrics
    for column, values in here.eval_metrics.items():
        if column not in TIMED:
            assert values.tolist() == fresh_evals[column].tolist(), column
