"""Bounded "it really learns" tests: the tutorial's settings solve CartPole-v0."""

from __future__ import annotations

import csv
import os

import pytest

from helpers import CONFIGS, run_cli


def best_return(run_dir: str) -> float:
    with open(os.path.join(run_dir, "eval_metrics.csv"), newline="") as handle:
        return max(float(r["average_return"]) for r in csv.DictReader(handle))


@pytest.mark.slow
@pytest.mark.parametrize("backend, sampling", [("tf_uniform", "direct"), ("py_uniform", "direct"),
                                               ("reverb", "dataset")])
def test_tutorial_settings_reach_195_on_cartpole_v0(tmp_path, backend, sampling):
    # The tutorial's hyperparameters; 10,000 of the tutorial's 20,000 iterations is the budget.
    # The uniform buffers are read in program order (direct), so their runs are reproducible.
    # Reverb is read through tf.data and is not; in 3 runs it reached 200 by iteration 3,000-5,000.
    run_dir = str(tmp_path / "run")
    result = run_cli("train", "--config", os.path.join(CONFIGS, "tutorial.yaml"), "--output-dir", run_dir,
                     "--quiet", "--set", "training.num_iterations=10000", "--set", f"replay.backend={backend}",
                     "--set", f"replay.sampling={sampling}", "--set", "video.enabled=false", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert best_return(run_dir) >= 195
