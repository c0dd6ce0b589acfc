"""Reused train processes (experiments/train_worker.py): a run in a worker is the run a fresh process trains.

One worker trains seed 7 of the default config (a solve in 1,250 env steps, videos off), then a run of another seed
and length, then seed 7 again; a fresh `train` process trains seed 7 once, beside it. All three seed-7 runs must give the same
training and evaluation rows (times apart), the same env steps to solve and the same summary figures: the first
run in a worker, and one after another run in it. A run that fails (its folder is a file) ends its worker with the run's exit
status, and the next run gets a new worker.
"""

import os
import time

import psutil
import pytest

from helpers import CONFIGS, rows

from dqn_cartpole.experiments import train_worker
from dqn_cartpole.processes.commands import child_command, train_argv

DEFAULT = os.path.join(CONFIGS, "default.yaml")
SHORT = ["video.enabled=false", "training.log_interval=50"]
TIME_COLUMNS = {"wall_s", "train_steps_per_s"}
SAME_IN_SUMMARY = ("solved_env_steps", "solved_at_iteration", "solved_return", "iterations", "env_steps",
                   "best_return", "final_return", "train_steps")


def run_in(slots, run_dir, seed, *extra):
    """One run on `slots`; (its exit status, the worker's pid)."""
    argv = train_argv(DEFAULT, [*SHORT, f"training.seed={seed}", *extra], run_dir)
    child = slots.start(run_dir, child_command(argv), os.path.join(os.path.dirname(run_dir), "logs",
                                                                     os.path.basename(run_dir) + ".log"))
    deadline = time.monotonic() + 180
    while child.returncode is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert isinstance(child, train_worker.ReusedRun), "the default config trains in a reused worker"
    return child.returncode, child.process.pid


def same_rows(a, b, name):
    left, right = rows(os.path.join(a, name)), rows(os.path.join(b, name))
    assert len(left) == len(right) > 1, (name, len(left), len(right))
    for one, other in zip(left, right):
        assert {k: v for k, v in one.items() if k not in TIME_COLUMNS} == \
               {k: v for k, v in other.items() if k not in TIME_COLUMNS}, name


def summary(run_dir):
    import json

    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def test_a_run_in_a_reused_worker_is_the_run_a_fresh_process_trains(tmp_path):
    fresh = str(tmp_path / "fresh")
    slots, baseline = train_worker.WorkerSlots(2, str(tmp_path / "logs")), None
    try:
        # the fresh process trains beside the worker (the test's wall time: the worker's)
        baseline = slots.start(fresh, child_command(train_argv(DEFAULT, [*SHORT, "training.seed=12"], fresh)),
                               str(tmp_path / "logs" / "fresh.log"), reuse=False)
        first, pid = run_in(slots, str(tmp_path / "first"), 12)
        assert psutil.Process(pid).environ()["OMP_NUM_THREADS"] == "1", "as Ray sets it in a one-CPU worker"
        other, pid_other = run_in(slots, str(tmp_path / "other"), 1, "training.num_iterations=100")
        again, pid_again = run_in(slots, str(tmp_path / "again"), 12)
        assert (first, other, again) == (0, 0, 0)
        assert pid == pid_other == pid_again, "the three runs share one worker"
        (tmp_path / "bad").write_text("a file where the run folder would go")
        bad, pid_bad = run_in(slots, str(tmp_path / "bad"), 12)
        assert bad == 2 and pid_bad == pid
        assert psutil.Process(pid).wait(timeout=30) == 2, "a failed run ends its worker, with the run's status"
        assert (tmp_path / "bad").read_text() == "a file where the run folder would go"
        assert "error: " in (tmp_path / "logs" / "bad.log").read_text()
        assert not [w for w in slots.workers if w.idle], "the run after a failure gets a new worker"
        baseline.process.wait(timeout=120)
        assert baseline.returncode == 0, baseline.output()[-2000:]
    finally:
        slots.close()
        if baseline is not None:
            baseline.stop(10)
    assert summary(fresh)["solved_env_steps"] == 1750  # seed 12 solves early: the test stays short
    for reused in ("first", "again"):
        run_dir = str(tmp_path / reused)
        same_rows(fresh, run_dir, "train_metrics.csv")
        same_rows(fresh, run_dir, "eval_metrics.csv")
        assert {k: summary(run_dir)[k] for k in SAME_IN_SUMMARY} == {k: summary(fresh)[k] for k in SAME_IN_SUMMARY}
    assert summary(str(tmp_path / "other"))["iterations"] == 100
    assert not [w for w in slots.workers if w.alive]


def test_only_runs_that_train_alike_in_a_worker_are_reused(tmp_path):
    """A worker runs TensorFlow on one thread, as a fresh process sets it only for the compiled driver with direct
    sampling; any other run stays a fresh process."""
    run_dir = str(tmp_path / "r")
    assert train_worker.reusable(train_argv(DEFAULT, ["training.seed=3"], run_dir))
    assert not train_worker.reusable(train_argv(DEFAULT, ["collection.driver=py"], run_dir))
    assert not train_worker.reusable(train_argv(DEFAULT, ["replay.backend=reverb"], run_dir))
    assert not train_worker.reusable(train_argv(DEFAULT, ["agent.learning_rate=fast"], run_dir))


@pytest.mark.parametrize("code,status", [(-2, 130), (-15, 143), (-9, -9), (0, 1), (3, 3)])
def test_a_worker_that_died_without_answering_reads_as_a_fresh_process_would(code, status):
    assert train_worker._died_status(code) == status  # pylint: disable=protected-access
