"""`train --topology ray` on a three-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head and two
worker nodes of 1 CPU each, shared by the module's tests), and its one-line answers to bad input.

One run of the default config with three collectors: they land on at least two nodes; the learner is SIGKILLed
after a checkpoint, and Ray starts it again from that checkpoint with its buffer, with no resume typed; then a
worker node that holds a collector is removed, and its collectors come back on another node; the run solves and
exits 0, its metrics continuous, and nothing of it is left (processes, the Reverb port; after the module, no
raylet or gcs_server of the cluster). Every failure of one role (a collector's, the evaluator's, the server's
processes too) is run, timed and reported by `scripts/benchmark.py --scale-out ... --ray-failures`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from helpers import REPO, cli_command, cli_env, kill_tree, port_is_free, processes_of, rows, run_cli, start_cli, \
    wait_for

pytest.importorskip("ray")

SEED = 1
CHECKPOINT_INTERVAL = 200
BUDGET_S = 420  # the run: start-up, the learner's restart, the lost node, the solve


@pytest.fixture(scope="module")
def cluster():
    """A head and two worker nodes (1 CPU each) on this machine; afterwards none of their processes is left."""
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                         "object_store_memory": 100 * 2 ** 20})
    session = made.head_node.get_session_dir_path()
    try:
        for _ in range(2):
            made.add_node(num_cpus=1, object_store_memory=100 * 2 ** 20)
        made.wait_for_nodes()
        yield made
    finally:
        made.shutdown()
        wait_for(lambda: not ray_processes(session), 30, "the cluster's raylets and gcs_server to end")


def ray_processes(session_dir: str) -> list:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(session_dir in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


def placement(run_dir: str) -> dict:
    try:
        with open(os.path.join(run_dir, "roles", "placement.json")) as handle:
            return json.load(handle)["roles"]
    except (OSError, ValueError, KeyError):
        return {}


def running_collectors(run_dir: str) -> dict:
    return {name: entry for name, entry in placement(run_dir).items()
            if name.startswith("collector") and entry.get("state") == "running" and entry.get("pid")}


def train_step(run_dir: str) -> int:
    path = os.path.join(run_dir, "train_metrics.csv")
    found = rows(path) if os.path.exists(path) else []
    return int(found[-1]["train_step"]) if found else 0


def test_a_ray_run_spreads_its_collectors_survives_its_learners_sigkill_and_a_lost_node_and_solves(cluster, tmp_path):
    run_dir = str(tmp_path / "run")
    began = time.monotonic()
    process = start_cli("train", "--topology", "ray", "--collectors", "3", "--seed", str(SEED), "--quiet",
                        "--set", f"training.checkpoint_interval={CHECKPOINT_INTERVAL}",
                        "--set", "training.log_interval=50", "--set", "video.enabled=false",
                        "--output-dir", run_dir, log_dir=tmp_path, env=cli_env(RAY_ADDRESS=cluster.address))

    def going() -> None:
        assert process.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        assert time.monotonic() - began < BUDGET_S, "the Ray run ran out of its time budget"

    try:
        wait_for(lambda: going() or len(running_collectors(run_dir)) == 3, 180, "three collectors placed")
        first_nodes = {name: entry["node_id"] for name, entry in running_collectors(run_dir).items()}
        assert len(set(first_nodes.values())) >= 2, first_nodes  # SPREAD
        port = int(re.search(r"port (\d+)", (tmp_path / "stdout").read_text()).group(1))

        # The learner, SIGKILLed after a checkpoint: Ray starts it again from there, with its buffer.
        wait_for(lambda: going() or train_step(run_dir) >= CHECKPOINT_INTERVAL + 100, 180, "train step 300")
        learner = placement(run_dir)["learner"]
        killed_at = train_step(run_dir)
        os.kill(learner["pid"], signal.SIGKILL)
        log = os.path.join(run_dir, "roles", "learner.log")
        wait_for(lambda: going() or "Resumed from" in open(log).read(), 120, "the learner's restart")
        resumed = re.search(r"Resumed from (ckpt-\d+): iteration \d+ of \d+, train step (\d+), (\d+) transitions",
                            open(log).read())
        with open(os.path.join(run_dir, "checkpoints", resumed.group(1), "state.json")) as handle:
            state = json.load(handle)
        assert int(resumed.group(3)) == state["replay_size"] > 0  # its own buffer, from the checkpoint
        assert 0 <= killed_at - int(resumed.group(2)) <= CHECKPOINT_INTERVAL + 50
        restarted = placement(run_dir)["learner"]
        assert restarted["restarts"] == 1 and restarted["pid"] != learner["pid"]

        # A worker node that holds a collector, lost: its collectors come back on another node.
        by_node: dict = {}
        for name, entry in running_collectors(run_dir).items():
            by_node.setdefault(entry["node_id"], []).append(name)
        victim = max((node for node in cluster.worker_nodes if node.node_id in by_node),
                     key=lambda node: len(by_node[node.node_id]))
        moved = by_node[victim.node_id]
        cluster.remove_node(victim, allow_graceful=False)
        wait_for(lambda: going() or all(name in running_collectors(run_dir) and
                                        running_collectors(run_dir)[name]["node_id"] != victim.node_id
                                        for name in moved), 120, f"{moved} back on another node")

        status = process.wait(max(1.0, BUDGET_S - (time.monotonic() - began)))
        assert status == 0, (tmp_path / "stderr").read_text()[-3000:]
        wait_for(lambda: not processes_of(run_dir), 30, "every role to end")
        wait_for(lambda: port_is_free(port), 30, f"port {port} to close")
    finally:
        kill_tree(process, run_dir)

    err = (tmp_path / "stderr").read_text()
    assert "Traceback" not in err and f"warning: learner was killed by SIGKILL; restarting it" in err, err[-3000:]
    assert all(f"warning: {name} was lost" in err for name in moved), err[-3000:]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert summary["solved_at_iteration"] is not None, summary
    steps = [int(r["train_step"]) for r in rows(os.path.join(run_dir, "train_metrics.csv"))]
    assert steps == sorted(set(steps)) and all(b - a <= CHECKPOINT_INTERVAL + 50 for a, b in zip(steps, steps[1:]))
    for name in moved:  # its rows reached the run folder from both nodes, counted on across the move
        index = int(name.split()[-1])
        counted = [int(r["env_steps"]) for r in rows(os.path.join(run_dir, "roles", f"collector-{index}.csv"))]
        assert len(counted) >= 2 and counted == sorted(counted), counted
    report = open(os.path.join(run_dir, "report.html")).read()
    assert "Where the roles ran" in report and victim.node_id[:8] in report


# ---------------------------------------------------------------------------- bad input: one line, exit 2, nothing made

HIDE_RAY = ("import sys; sys.modules['ray'] = None; sys.argv[0] = 'dqn_cartpole'; "
            "from dqn_cartpole.cli.main import main; sys.exit(main(sys.argv[1:]))")


def one_line_exit_2(result: subprocess.CompletedProcess, starts: str) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), result.stderr[-2000:]
    return lines[0]


def test_without_ray_installed_topology_ray_is_one_line_naming_the_extra(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-c", HIDE_RAY, "train", "--topology", "ray", "--output-dir",
                             str(run_dir)], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60)
    line = one_line_exit_2(result, "error: --topology ray needs Ray, which is not installed")
    assert 'pip install "dqn_cartpole[ray]"' in line
    assert not run_dir.exists()


def test_a_silent_cluster_address_is_one_line_within_the_connect_timeout(tmp_path):
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as silent:  # accepts connections, never answers
        silent.bind(("::", 0))
        silent.listen()
        port = silent.getsockname()[1]
        began = time.monotonic()
        result = run_cli("train", "--topology", "ray", "--address", f"localhost:{port}", "--set",
                         "distributed.connect_timeout_s=2", "--output-dir", str(tmp_path / "run"), timeout=60)
        took = time.monotonic() - began
    line = one_line_exit_2(result, f"error: --address localhost:{port}: no Ray cluster answers there within 2 s")
    assert "ray start --head" in line
    assert took < 2 + 10  # the timeout, plus an interpreter's start
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, starts", [
    (("--topology", "ray", "--collectors", "0"), "error: --collectors: must be positive, got 0"),
    (("--topology", "ray", "--collectors", "two"), "error: dqn-cartpole train: argument --collectors: invalid int"),
    (("--topology", "ray", "--collectors", "5000"), "error: --collectors: at most 1024"),
    (("--collectors", "2",), "error: --collectors: only for --topology local or ray"),
    (("--topology", "local", "--address", "10.0.0.1:6379"), "error: --address: only for --topology ray"),
    (("--topology", "ray", "--address", "nowhere"), "error: --address 'nowhere': expected HOST:PORT"),
])
def test_bad_topology_arguments_are_one_line_and_touch_nothing(tmp_path, args, starts):
    existing = tmp_path / "earlier-run"
    existing.mkdir()
    (existing / "config.yaml").write_text("an earlier run's file\n")
    for output in (tmp_path / "new-run", existing):
        result = subprocess.run(cli_command("train", *args, "--output-dir", str(output)), cwd=REPO, env=cli_env(),
                                capture_output=True, text=True, timeout=60)
        one_line_exit_2(result, starts)
    assert not (tmp_path / "new-run").exists()
    assert (existing / "config.yaml").read_text() == "an earlier run's file\n"
