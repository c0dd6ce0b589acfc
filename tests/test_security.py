"""No network port by surprise: a Reverb run says where it listens (the default run, which listens on nothing, is
sampled by tests/test_packaging.py, as installed from a wheel).

Sockets are read from /proc: a process's listening sockets are the LISTEN (TCP) or bound (UDP)
entries of /proc/<pid>/net/{tcp,tcp6,udp,udp6} whose inode is one of its open file descriptors.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from helpers import CONFIGS, run_cli, start_cli

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/net/tcp"), reason="needs Linux /proc")

TCP_LISTEN = "0A"
UDP_UNCONNECTED = "07"


def listening(pid: int) -> set[tuple[str, str, int]]:
    """(protocol, local address, port) of every socket `pid` listens on (TCP) or is bound to (UDP)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            match = re.fullmatch(r"socket:\[(\d+)\]", target)
            if match:
                inodes.add(match.group(1))
    except FileNotFoundError:
        return set()
    found = set()
    for proto, state in (("tcp", TCP_LISTEN), ("tcp6", TCP_LISTEN), ("udp", UDP_UNCONNECTED),
                         ("udp6", UDP_UNCONNECTED)):
        try:
            with open(f"/proc/{pid}/net/{proto}") as handle:
                lines = handle.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == state and fields[9] in inodes and int(port, 16) != 0:
                found.add((proto, address, int(port, 16)))
    return found


def test_reverb_run_prints_its_port_and_exposure_then_stops_and_resumes_with_its_table(tmp_path):
    run_dir = str(tmp_path / "run")
    args = ["train", "--quiet", "--config", os.path.join(CONFIGS, "smoke.yaml"), "--output-dir", run_dir,
            "--set", "replay.backend=reverb", "--set", "replay.sampling=dataset", "--set", "video.enabled=false",
            "--set", "output.tensorboard=false", "--set", "training.num_iterations=1000000"]
    proc = start_cli(*args, log_dir=tmp_path)
    stderr = tmp_path / "stderr"
    port, ports = None, set()
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            match = re.search(r"Reverb replay server on port (\d+)", stderr.read_text())
            if match and os.path.isdir(os.path.join(run_dir, "checkpoints")) and any(
                    n.startswith("ckpt-") and "." not in n for n in os.listdir(os.path.join(run_dir, "checkpoints"))):
                port = int(match.group(1))
                ports = {p for _, _, p in listening(proc.pid)}
                break
            time.sleep(0.05)
        assert port is not None, stderr.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = stderr.read_text()
    exposure = [line for line in text.splitlines() if "Reverb replay server on port" in line]
    assert exposure == [f"Reverb replay server on port {port}, listening on ALL network interfaces (*:{port}) with no "
                        f"authentication; set replay.backend: tf_uniform to open no port."]
    assert port in ports  # the line tells the truth: the process listens there
    assert proc.returncode == 143, text[-3000:]
    assert "SIGTERM received" in text and "Traceback" not in text

    ckpt = sorted(n for n in os.listdir(os.path.join(run_dir, "checkpoints")) if n.startswith("ckpt-"))[-1]
    ckpt_dir = os.path.join(run_dir, "checkpoints", ckpt)
    assert os.listdir(os.path.join(ckpt_dir, "reverb"))  # Reverb's own checkpoint of the table
    with open(os.path.join(ckpt_dir, "state.json")) as handle:
        state = json.load(handle)
    result = run_cli("train", "--quiet", "--resume", run_dir,
                     "--set", f"training.num_iterations={state['iteration'] + 100}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len([line for line in result.stderr.splitlines() if "Reverb replay server on port" in line]) == 1
    assert f"{state['replay_size']} transitions in replay" in result.stderr  # the table came back
    with open(os.path.join(run_dir, "summary.json")) as handle:
        assert json.load(handle)["iterations"] == state["iteration"] + 100
    with open(os.path.join(run_dir, "train_metrics.csv")) as handle:
        last = handle.read().splitlines()[-1].split(",")
    # Rows come every log_interval (50): a SIGTERM under load can land between two multiples of it.
    last_row = (state["iteration"] + 100) // 50 * 50
    assert int(last[0]) == last_row and int(last[4]) > state["replay_size"]
