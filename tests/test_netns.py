"""Across machines, simulated: the replay server, the learner and the evaluator in one network namespace, a
collector in another, joined by a veth pair on private test addresses that the test creates and removes. The replay
is the server's shared table (`distributed.replay: server`), which the server checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from helpers import SMOKE, cli_command, cli_env

SUBNET = f"10.231.{os.getpid() % 250}"  # private test addresses, one /24 per test process
ROLE = ("--config", SMOKE, "--set", "replay.backend=reverb", "--set", "video.enabled=false",
        "--set", "distributed.replay=server")


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def netns_problem() -> str:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs the `ip` command (iproute2)"
    probe = f"dqnprobe{os.getpid()}"
    result = ip("netns", "add", probe)
    ip("netns", "del", probe)
    return "" if result.returncode == 0 else f"`ip netns add` failed: {result.stderr.strip()}"


@pytest.fixture
def two_machines():
    """Namespaces A (10.231.x.1) and B (10.231.x.2) on a veth pair; removed afterwards."""
    problem = netns_problem()
    if problem:
        pytest.skip(problem)
    a, b = f"dqnA{os.getpid()}", f"dqnB{os.getpid()}"
    try:
        for args in (("netns", "add", a), ("netns", "add", b),
                     ("link", "add", "dqnvA", "netns", a, "type", "veth", "peer", "name", "dqnvB", "netns", b),
                     ("-n", a, "addr", "add", f"{SUBNET}.1/24", "dev", "dqnvA"),
                     ("-n", b, "addr", "add", f"{SUBNET}.2/24", "dev", "dqnvB"),
                     ("-n", a, "link", "set", "dqnvA", "up"), ("-n", b, "link", "set", "dqnvB", "up"),
                     ("-n", a, "link", "set", "lo", "up"), ("-n", b, "link", "set", "lo", "up")):
            result = ip(*args)
            assert result.returncode == 0, f"ip {' '.join(args)}: {result.stderr}"
        yield a, b
    finally:
        ip("netns", "del", a)  # the veth pair goes with its namespaces
        ip("netns", "del", b)


def start_in(namespace: str, log_path: str, *args: str) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(["ip", "netns", "exec", namespace, *cli_command(*args)], env=cli_env(),
                                stdout=log, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def test_a_collector_in_another_namespace_feeds_the_learner(two_machines, tmp_path):
    a, b = two_machines
    server_address = f"{SUBNET}.1:8470"
    run_dir = str(tmp_path / "run")  # server and learner share it (machine A)
    server = start_in(a, str(tmp_path / "server.log"), "replay-server", *ROLE, "--replay-address", server_address,
                      "--run-dir", run_dir)
    collector = learner = evaluator = None
    try:
        deadline = time.monotonic() + 180
        while "replay server ready" not in (tmp_path / "server.log").read_text():
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.5)
        learner = start_in(a, str(tmp_path / "learner.log"), "learn", *ROLE, "--replay-address", "localhost:8470",
                           "--run-dir", run_dir, "--quiet")
        evaluator = start_in(a, str(tmp_path / "evaluator.log"), "evaluate-live", *ROLE,
                             "--replay-address", "localhost:8470", "--run-dir", run_dir)
        collector = start_in(b, str(tmp_path / "collector.log"), "collect", *ROLE, "--replay-address", server_address,
                             "--run-dir", str(tmp_path / "collector-b"), "--collector-id", "1")
        assert learner.wait(400) == 0, (tmp_path / "learner.log").read_text()[-3000:]
        with open(os.path.join(run_dir, "summary.json")) as handle:
            summary = json.load(handle)
        assert summary["train_steps"] == 300 and summary["final_return"] is not None  # the evaluator's
        # The run's stop reaches machine B over the veth pair: its collector leaves by itself, status 0.
        assert collector.wait(60) == 0, (tmp_path / "collector.log").read_text()[-3000:]
        assert evaluator.wait(60) == 0, (tmp_path / "evaluator.log").read_text()[-3000:]
        # Machine B cannot reach A's loopback: only the veth address serves it.
        wrong = subprocess.run(["ip", "netns", "exec", b, *cli_command(
            "collect", *ROLE, "--set", "distributed.connect_timeout_s=2", "--replay-address", "localhost:8470",
            "--run-dir", str(tmp_path / "wrong"))], env=cli_env(), capture_output=True, text=True, timeout=120)
        assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
        assert "no Reverb server answered within 2 s" in wrong.stderr
    finally:
        for process in (collector, evaluator, learner, server):
            if process is not None:
                stop(process)
    assert "Stored checkpoint" in (tmp_path / "server.log").read_text()
