"""Across machines, simulated: two network namespaces on a veth pair with private test addresses that the test
creates and removes. Machine A runs the Ray head and the command; machine B joins the cluster. Both use the
commands the scaling-out guide gives (docs/scale-out.md: `ray start --head` / `ray start --address`, token
authentication on), then
`train --topology ray --address` runs the smoke config with the shared replay on the server
(`distributed.replay: server`), prioritized (Ape-X): a collector placed on machine B feeds the learner over the veth
pair, and its rows reach the run folder on A. While it runs, each machine's listening sockets are read (`ss -ltnp`): what
docs/security.md says a cluster run opens. A driver without the cluster's token gets one line."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

import psutil
import pytest

from helpers import SMOKE, cli_command, cli_env, rows, wait_for

pytest.importorskip("ray")

SUBNET = f"10.231.{os.getpid() % 250}"  # private test addresses, one /24 per test process
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def netns_problem() -> str:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None or shutil.which("ss") is None:
        return "needs the `ip` and `ss` commands (iproute2)"
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


@pytest.fixture
def ray_cluster(two_machines):
    """A Ray head on machine A and a worker on machine B, with a token; (A, B, token env). Afterwards every process
    of this cluster (found by its temp dir, which is this test's) is killed: `ray stop` would stop every Ray on
    the machine."""
    a, b = two_machines
    temp = tempfile.mkdtemp(prefix="dqnray", dir="/tmp")  # short: Ray's sockets' paths must fit 107 bytes
    token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
    env = cli_env(**token)
    try:
        for namespace, args in ((a, ("--head", f"--node-ip-address={SUBNET}.1", "--port=6379", f"--temp-dir={temp}")),
                                (b, (f"--address={SUBNET}.1:6379", f"--node-ip-address={SUBNET}.2"))):
            started = subprocess.run(["ip", "netns", "exec", namespace, RAY, "start", "--num-cpus=1", *args],
                                     env=env, capture_output=True, text=True, timeout=120)
            assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield a, b, token
    finally:
        for process in psutil.process_iter(["cmdline"]):
            if any(temp in part for part in process.info["cmdline"] or []):
                process.send_signal(signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


def listening(namespace: str) -> list[tuple[str, int, int, str]]:
    """(address, port, pid, process name) of each TCP socket listening in `namespace`."""
    out = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-ltnpH"], capture_output=True, text=True,
                         timeout=30).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        address, _, port = fields[3].rpartition(":")
        match = re.search(r'\("([^"]+)",pid=(\d+)', line)
        if match:
            found.append((address, int(port), int(match.group(2)), match.group(1)))
    return found


def test_a_collector_on_another_machine_of_a_ray_cluster_feeds_the_learner(ray_cluster, tmp_path):
    a, b, token = ray_cluster
    run_dir = str(tmp_path / "run")
    role = ("--topology", "ray", "--address", f"{SUBNET}.1:6379", "--config", SMOKE, "--quiet",
            "--set", "distributed.replay=server", "--set", "video.enabled=false",
            "--set", "replay.backend=reverb", "--set", "replay.prioritized=true")  # Ape-X: see the last lines
    # Without the cluster's token: one line, nothing made.
    refused = subprocess.run(["ip", "netns", "exec", a, *cli_command("train", *role, "--output-dir", run_dir)],
                             env=cli_env(RAY_USAGE_STATS_ENABLED="0"), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "uses token authentication: set RAY_AUTH_MODE=token" in refused.stderr
    assert not os.path.exists(run_dir)

    with open(tmp_path / "out", "w") as out:
        driver = subprocess.Popen(["ip", "netns", "exec", a, *cli_command("train", *role, "--collectors", "2",
                                                                           "--output-dir", run_dir)],
                                  env=cli_env(**token), stdout=out, stderr=subprocess.STDOUT)
    try:
        csv = os.path.join(run_dir, "train_metrics.csv")
        def first_row() -> bool:
            assert driver.poll() is None, (tmp_path / "out").read_text()[-3000:]
            return os.path.exists(csv) and bool(rows(csv))

        wait_for(first_row, 240, "the first train row")
        on_a, on_b = listening(a), listening(b)
        placed = json.load(open(os.path.join(run_dir, "roles", "placement.json")))["roles"]
        assert driver.wait(240) == 0, (tmp_path / "out").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    text = (tmp_path / "out").read_text()
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert summary["train_steps"] == 300 and summary["final_return"] is not None  # the evaluator's
    # Prioritized replay across machines: the learner drew by priority (importance weights under 1) and wrote
    # priorities back (tests/test_prioritized.py checks a collector's own, computed as it writes).
    train_rows = rows(os.path.join(run_dir, "train_metrics.csv"))
    assert all(float(r["importance_weight_min"]) < 1.0 and float(r["priority_max"]) > 0 for r in train_rows), \
        train_rows
    on_b_collectors = [n for n, e in placed.items() if n.startswith("collector") and e["node_ip"] == f"{SUBNET}.2"]
    assert on_b_collectors, placed  # SPREAD put one on machine B
    for name in on_b_collectors:  # its rows crossed to machine A's run folder
        assert rows(os.path.join(run_dir, "roles", f"collector-{name.split()[-1]}.csv")), name
    # What a cluster run opens (docs/security.md): on A, the Reverb port it announced (every interface) beside
    # Ray's own; on B, only Ray's (its raylet, its agent, its actors' workers): a collector opens no port.
    reverb_port = int(re.search(r"port (\d+), a learner", text).group(1))
    server_pid = placed["replay server"]["pid"]
    assert (reverb_port, server_pid) in {(port, pid) for _, port, pid, _ in on_a}, on_a
    assert not any(port == 8265 for _, port, _, _ in on_a + on_b)  # no dashboard
    role_pids = {entry["pid"] for entry in placed.values()}
    assert not [s for s in on_b if s[2] in role_pids], on_b
    assert {name for _, _, _, name in on_b} <= {"raylet", "ray::RuntimeEnv", "ray::RoleHost"}, on_b
    print("\nmachine A listens:", sorted((p, n) for _, p, _, n in on_a), "\nmachine B listens:",
          sorted((p, n) for _, p, _, n in on_b))
