"""Running the CLI as a user would: a subprocess from the repo's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs")


def run_cli(*args: str, cwd: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m dqn_cartpole ARGS`; returns the finished process with text output."""
    env = dict(os.environ, PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy")
    return subprocess.run([sys.executable, "-m", "dqn_cartpole", *args], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_python(code: str, cwd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs a snippet in a fresh interpreter that cannot import this project."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
