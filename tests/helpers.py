"""Running the CLI as a user would: one launcher for every test that starts `python -m dqn_cartpole`."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from typing import Optional

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs")
SMOKE = os.path.join(CONFIGS, "smoke.yaml")
KILL_ENV = "DQN_CARTPOLE_TEST_KILL"  # run_folder.checkpointing's crash points


def cli_env(**extra: str) -> dict:
    """The environment of a CLI process: this checkout on the path, quiet SDL, no crash point unless given."""
    env = dict(os.environ, PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy")
    env.pop(KILL_ENV, None)
    env.update(extra)
    return env


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "dqn_cartpole", *args]


def run_cli(*args: str, cwd: Optional[str] = None, timeout: float = 300,
            env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """`python -m dqn_cartpole ARGS` to the end; returns the finished process with text output."""
    return subprocess.run(cli_command(*args), cwd=cwd or REPO, env=env or cli_env(), capture_output=True,
                          text=True, timeout=timeout)


def start_cli(*args: str, log_dir, env: Optional[dict] = None) -> subprocess.Popen:
    """Starts `python -m dqn_cartpole ARGS` in the background, its output in log_dir/stdout and log_dir/stderr."""
    with open(os.path.join(log_dir, "stdout"), "w") as out, open(os.path.join(log_dir, "stderr"), "w") as err:
        return subprocess.Popen(cli_command(*args), cwd=REPO, env=env or cli_env(), stdout=out, stderr=err)


def run_python(code: str, cwd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs a snippet in a fresh interpreter that cannot import this project."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------- the roles' processes and ports


def rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def processes_of(run_dir: str) -> list[psutil.Process]:
    """Live processes whose command line names `run_dir` (the launcher's children all do)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if any(run_dir in part for part in cmdline) and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


def port_is_free(port: int) -> bool:
    """Nothing listens on `port` (SO_REUSEADDR: closed connections in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("::", port))
        except OSError:
            return False
    return True


def server_port(log_dir) -> int:
    match = re.search(r"replay server on port (\d+)", (log_dir / "stdout").read_text())
    assert match, (log_dir / "stdout").read_text()
    return int(match.group(1))


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def kill_tree(process: subprocess.Popen, run_dir: str) -> None:
    """Test cleanup: the launcher and anything still running for its run folder."""
    if process.poll() is None:
        process.kill()
        process.wait(30)
    for child in processes_of(run_dir):
        child.kill()


def assert_all_gone(run_dir: str, port: int) -> None:
    wait_for(lambda: not processes_of(run_dir), 30, "every child to exit")
    wait_for(lambda: port_is_free(port), 30, f"port {port} to close")


def free_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::", 0))
        return probe.getsockname()[1]


def cartpole_agent(stack):
    """The default config's agent on CartPole (its data spec and its weights), built in this process."""
    from dqn_cartpole.config import load_config
    from dqn_cartpole.distributed import parts

    config = load_config(None, ["replay.backend=reverb"])
    _, _, agent = parts.agent_with_envs(config, 1, 0, stack)
    return config, agent


def write_checkpoint(root: str, iteration: int, finished: bool = False, num_iterations: int = 1000,
                     damage: bool = False, run_state: Optional[dict] = None) -> str:
    """A checkpoint folder as CheckpointWriter lays it out (state.json and a manifest, no TF files), under `root`;
    `run_state` is the saved run state, if any; `damage` spoils state.json after its manifest was written."""
    from dqn_cartpole.run_folder import checkpointing  # pylint: disable=import-outside-toplevel

    path = os.path.join(root, checkpointing.checkpoint_name(iteration))
    os.makedirs(path)
    state = {"format": checkpointing.FORMAT, "iteration": iteration, "finished": finished,
             "config": {"training": {"num_iterations": num_iterations}}}
    if run_state is not None:
        state["run_state"] = run_state
    with open(os.path.join(path, checkpointing.STATE_FILE), "w") as handle:
        json.dump(state, handle)
    data = open(os.path.join(path, checkpointing.STATE_FILE), "rb").read()
    files = {checkpointing.STATE_FILE: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    with open(os.path.join(path, checkpointing.MANIFEST_FILE), "w") as handle:
        json.dump({"format": checkpointing.FORMAT, "iteration": iteration, "files": files}, handle)
    if damage:
        with open(os.path.join(path, checkpointing.STATE_FILE), "a") as handle:
            handle.write(" ")
    return path


# ---------------------------------------------------------------------------- a C51 run, checked by hand

C51_SETS = ("agent.kind=c51", "agent.td_loss=huber")  # on configs/smoke.yaml (a DQN config: td_loss squared)


def c51_atoms_by_hand(policy_dir: str, states, num_atoms: int, min_q: float, max_q: float):
    """(probabilities [B, actions, atoms], expected Q [B, actions]) of a saved C51 policy at `states`, computed in
    NumPy from its SavedModel's variables alone (Dense ReLU layers, then every action's atom logits)."""
    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(policy_dir, "variables", "variables"))
    count = sum(1 for name in reader.get_variable_to_shape_map() if name.startswith("model_variables/"))
    weights = [reader.get_tensor(f"model_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(count)]
    x = np.asarray(states, np.float64)
    for i in range(0, len(weights) - 2, 2):
        x = np.maximum(x @ weights[i] + weights[i + 1], 0.0)
    logits = (x @ weights[-2] + weights[-1]).reshape(len(x), -1, num_atoms)
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probabilities = z / z.sum(axis=-1, keepdims=True)
    return probabilities, probabilities @ np.linspace(min_q, max_q, num_atoms)


def check_c51_run(run_dir: str) -> None:
    """A finished C51 run's diagnostics are its network's: atoms.json (each action's probabilities sum to 1, equal
    to policy/final's by hand at the Q probe's states), plots/atoms.png shown in report.html with its caption, and
    the last train row's Q probe (mean max Q over its 500 states) the expected Q-values of policy/final by hand."""
    import json

    import numpy as np

    from dqn_cartpole.core.q_probe import QProbe
    from dqn_cartpole.run_folder import read_run

    record = read_run(run_dir)
    agent, env = record.config["agent"], record.config["env"]
    support = (agent["num_atoms"], agent["min_q_value"], agent["max_q_value"])
    with open(os.path.join(run_dir, "atoms.json")) as handle:
        atoms = json.load(handle)
    probabilities = np.asarray(atoms["probabilities"])
    assert probabilities.shape == (4, 2, support[0]) and atoms["policy"] == "final", \
        (probabilities.shape, atoms["policy"])
    np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, rtol=1e-5)
    probe_states = QProbe.states_of(env["id"], record.config["training"]["seed"], env["max_episode_steps"])
    np.testing.assert_allclose(atoms["states"], probe_states[atoms["state_indices"]])
    by_hand, _ = c51_atoms_by_hand(os.path.join(run_dir, "policy", "final"), atoms["states"], *support)
    np.testing.assert_allclose(probabilities, by_hand, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(atoms["support"], np.linspace(support[1], support[2], support[0]), atol=1e-5)
    assert os.path.getsize(os.path.join(run_dir, "plots", "atoms.png")) > 0
    page = open(os.path.join(run_dir, "report.html"), encoding="utf-8").read()
    assert 'src="plots/atoms.png"' in page and "probability over a fixed set of returns (the atoms)" in page, \
        "report.html shows no atoms figure with its caption"
    _, expected_q = c51_atoms_by_hand(os.path.join(run_dir, "policy", "final"), probe_states, *support)
    last = record.train_rows[-1]
    probe = expected_q.max(axis=1).mean()
    assert abs(float(last["mean_max_q"]) - probe) <= 1e-4 * max(1.0, abs(probe)), \
        f"the Q probe logged {last['mean_max_q']}, policy/final's expected Q by hand gives {probe}"
