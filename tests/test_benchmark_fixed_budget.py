"""The fixed-budget benchmark (scripts/benchmark_fixed_budget.py): its table (fast, no benchmark run), and a stopped
benchmark stopping its runs (one smoke run, stopped while it trains; also through benchmark_common.run_train)."""

from __future__ import annotations

import glob
import os
import sys

import pytest

from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))


def test_the_fixed_budget_table_tells_a_run_that_never_solved_from_one_that_never_checked():
    """scripts/benchmark_fixed_budget.py: a run with the early stop off and agent.solved_target_update_* null never
    looks for its solve (summary.json's solve_checked false): its row says so, not "never"."""
    import benchmark_fixed_budget

    def row(seed, solved, checked, final):
        return {"seed": seed, "solved_env_steps": solved, "solve_checked": checked, "best": 250.0, "final": final,
                "holds": final >= 200, "target": 200.0}

    lines = benchmark_fixed_budget.table([row(1, 31000, True, 227.7), row(2, None, True, 165.0),
                                          row(3, None, False, 191.6)])
    assert [line.split(" | ")[1] for line in lines[2:5]] == ["31,000", "never", "not checked"]
    assert lines[-1].endswith("1/3 seeds' final policies solve (≥ 200).")


RUN_TRAIN = """import sys
sys.path.insert(0, sys.argv[1])
from benchmark_common import run_train
run_train(sys.argv[2], sys.argv[3], ["training.num_iterations=100000", "video.enabled=false"])
"""


@pytest.mark.parametrize("part", ["fixed budget", "time to solve"])
def test_a_stopped_benchmark_stops_its_runs_and_leaves_no_process(tmp_path, part):
    """SIGTERM to the benchmark while a run trains: the run gets Ctrl-C's stop (it saves a checkpoint) and the
    benchmark waits for it; before, the train process went on alone, orphaned. Both ways a benchmark part runs
    `train`: the fixed budget's runs at a time, and `benchmark_common.run_train` (the time to solve, the scale-out
    parts)."""
    import signal
    import subprocess

    import psutil

    from helpers import SMOKE, cli_env, wait_for

    env = cli_env(TMPDIR=str(tmp_path))  # the benchmark's runs go to a folder of its own under TMPDIR
    if part == "fixed budget":
        script = os.path.join(REPO, "scripts", "benchmark_fixed_budget.py")
        argv = [script, "--fixed-budget", "100000", "--config", SMOKE, "--seeds", "1"]
        pattern = str(tmp_path / "dqn-fixed-budget-*" / "s1")
    else:
        argv = ["-c", RUN_TRAIN, os.path.join(REPO, "scripts"), SMOKE, str(tmp_path / "run")]
        pattern = str(tmp_path / "run")
    bench = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    runs = []
    try:
        wait_for(lambda: glob.glob(os.path.join(pattern, "train_metrics.csv")), 120, "the run to train")
        runs = psutil.Process(bench.pid).children(recursive=True)
        assert runs
        bench.send_signal(signal.SIGTERM)
        _, stderr = bench.communicate(timeout=90)
    finally:
        if bench.poll() is None:
            bench.kill()
        left = [p for p in runs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for process in left:  # (what the test checks below: none)
            process.kill()
    assert not left, left
    assert bench.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    (run,) = glob.glob(pattern)
    assert os.listdir(os.path.join(run, "checkpoints"))  # stopped as Ctrl-C stops a run
