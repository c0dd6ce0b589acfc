"""Bounded "it really learns" tests: the tutorial's settings solve CartPole-v0."""

from __future__ import annotations

import csv
import json
import os

import pytest

from helpers import CONFIGS, run_cli


def best_return(run_dir: str) -> float:
    with open(os.path.join(run_dir, "eval_metrics.csv"), newline="") as handle:
        return max(float(r["average_return"]) for r in csv.DictReader(handle))


@pytest.mark.slow
@pytest.mark.parametrize("backend, sampling", [("tf_uniform", "direct"), ("py_uniform", "direct")])
def test_tutorial_settings_reach_195_on_cartpole_v0(tmp_path, backend, sampling):
    # The tutorial's hyperparameters; 10,000 of the tutorial's 20,000 iterations is the budget.
    # The uniform buffers are read in program order (direct), so these runs are reproducible. Reverb
    # (read through tf.data, not reproducible) learns in tests/test_py_driver.py (the tutorial's own
    # PyDriver loop on Reverb) and in the default-config test below: with the tutorial's gamma 1 and a
    # target network updated every step, a compiled Reverb run reached 200, 191 and 113 in 3 runs.
    run_dir = str(tmp_path / "run")
    result = run_cli("train", "--config", os.path.join(CONFIGS, "tutorial.yaml"), "--output-dir", run_dir,
                     "--quiet", "--set", "training.num_iterations=10000", "--set", f"replay.backend={backend}",
                     # the compiled driver (tests/test_py_driver.py runs the tutorial's PyDriver loop to 195)
                     "--set", "collection.driver=compiled",
                     "--set", f"replay.sampling={sampling}", "--set", "video.enabled=false", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert best_return(run_dir) >= 195


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tf_uniform", "py_uniform", "reverb"])
def test_default_config_with_n_step_targets_solves_cartpole_v1_on_every_backend(tmp_path, backend):
    # The default config (2-step double DQN) switched to each backend with one key: replay.sampling
    # follows the backend. Solved means 475 averaged over 100 fresh greedy episodes. The budget is the
    # default's 30,000 iterations: the default solves seeds 0-9 in 2,500-18,500 env steps, and a Reverb run
    # (read through tf.data, not reproducible) once missed at 20,000 (best 455.9).
    run_dir = str(tmp_path / "run")
    result = run_cli("train", "--output-dir", run_dir, "--quiet", "--set", f"replay.backend={backend}",
                     "--set", "training.num_iterations=30000", "--set", "video.enabled=false",
                     "--set", "output.tensorboard=false", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(run_dir, "summary.json")) as handle:
        summary = json.load(handle)
    assert summary["solved_at_iteration"] is not None, f"not solved; best {summary['best_return']}"
    with open(os.path.join(run_dir, "policy", "final", "policy_info.json")) as handle:
        info = json.load(handle)
    assert info["average_return"] >= 475 and info["episodes"] == 100
