"""The Ray soak (`make soak`, which CI runs after the suite; not in the default suite: about 10 minutes).

Ten `train --topology ray --collectors 2` runs in a row, each starting its own Ray instance as a new user's would,
on a short config, while two busy processes (a CPU hog) keep both cores loaded. Every run must end with exit status
0, its training whole (every iteration trained, train rows continuous) and nothing of it left behind. Every other
run gets one SIGKILL once it trains: of the learner, the replay server, a collector's process, a collector's Ray
worker, and the node's warm start-up process (each once), and must still end with exit 0, with no resume typed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers import cli_env, kill_tree, processes_of, rows, start_cli, wait_for

from dqn_cartpole.run_folder.placement import read_placement

pytest.importorskip("ray")
pytestmark = pytest.mark.soak

RUNS = 10
ITERATIONS = 3000
RUN_BUDGET_S = 420  # one run under the hog: Ray's start-up, the roles', training, a restart, the end
VICTIMS = ("learner", "replay server", "collector process", "collector worker", "warm process")
HOG = "while True: pass"


@pytest.fixture(scope="module")
def hog():
    """Two busy processes, one per core, for the whole soak."""
    busy = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
    try:
        yield busy
    finally:
        for process in busy:
            process.kill()
            process.wait(10)


def train_rows(run_dir: str) -> list:
    path = os.path.join(run_dir, "train_metrics.csv")
    return rows(path) if os.path.exists(path) else []


def running_roles(run_dir: str) -> dict:
    found = read_placement(run_dir)
    return {name: entry for name, entry in (found or {"roles": {}})["roles"].items()
            if entry.get("state") == "running" and entry.get("pid")}


def victim_pid(kind: str, run_dir: str) -> int:
    roles = running_roles(run_dir)
    if kind == "warm process":  # the roles' parent: they are its forks
        return psutil.Process(roles["learner"]["pid"]).ppid()
    if kind == "collector worker":
        return roles["collector 0"]["worker_pid"]
    if kind == "collector process":
        return roles["collector 1"]["pid"]
    return roles[kind]["pid"]


@pytest.mark.parametrize("index", range(RUNS))
def test_a_ray_run_under_a_cpu_hog_ends_with_exit_0_with_or_without_one_sigkill(hog, tmp_path, index):
    kind = VICTIMS[index // 2] if index % 2 else None
    run_dir = str(tmp_path / "run")
    began = time.monotonic()
    process = start_cli("train", "--topology", "ray", "--collectors", "2", "--seed", str(index), "--quiet",
                        "-n", str(ITERATIONS), "--set", "training.checkpoint_interval=500",
                        "--set", "training.log_interval=100", "--set", "video.enabled=false",
                        "--set", "evaluation.stop_when_solved=false", "--output-dir", run_dir,
                        log_dir=tmp_path, env=cli_env())

    def going() -> None:
        assert process.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        assert time.monotonic() - began < RUN_BUDGET_S, f"run {index} ran out of its {RUN_BUDGET_S} s"

    try:
        if kind is not None:
            # Once it trains (every role placed and the learner past its first checkpoint): one SIGKILL.
            wait_for(lambda: going() or (len(running_roles(run_dir)) == 5 and len(train_rows(run_dir)) >= 7),
                     RUN_BUDGET_S, f"run {index} to train")
            os.kill(victim_pid(kind, run_dir), signal.SIGKILL)
        status = process.wait(max(1.0, RUN_BUDGET_S - (time.monotonic() - began)))
        err = (tmp_path / "stderr").read_text()
        assert status == 0, f"run {index} ({kind or 'no kill'}): exit {status}\n{err[-3000:]}"
        wait_for(lambda: not processes_of(run_dir), 30, "every role to end")
    finally:
        kill_tree(process, run_dir)
    assert "Traceback" not in err, err[-3000:]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert summary["iterations"] == ITERATIONS, summary
    steps = [int(row["train_step"]) for row in train_rows(run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == ITERATIONS
    assert all(b - a <= 500 + 100 for a, b in zip(steps, steps[1:])), steps  # at most a checkpoint interval again
    if kind in ("learner", "replay server", "collector process", "collector worker"):
        role = {"collector process": "collector 1", "collector worker": "collector 0"}.get(kind, kind)
        assert re.search(f"warning: {role} (was killed by SIGKILL|was lost); restarting it", err), err[-3000:]
    if kind == "warm process":  # no role died with it
        assert "restarting it" not in err, err[-3000:]
    print(f"soak run {index}: {kind or 'no kill'}: exit {status} in {time.monotonic() - began:.1f} s")
