"""Running the CLI as a user would: one launcher for every test that starts `python -m dqn_cartpole`."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

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
