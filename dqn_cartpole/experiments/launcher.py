"""Training runs as child processes: `python -m dqn_cartpole train ... --quiet`, one per run.

Each child gets its own session, so a Ctrl-C at the terminal reaches only the parent, which then
forwards exactly one SIGINT/SIGTERM to every child (a second signal would make the child stop at
once, without its final checkpoint). `ChildSet.stop` forwards, waits, and kills stragglers only
after a timeout, so no child outlives the command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def train_argv(config_path: str, overrides: Sequence[str], run_dir: str) -> list[str]:
    """Arguments of a fresh run (after `python -m dqn_cartpole`)."""
    argv = ["train", "--config", config_path, "--output-dir", run_dir, "--quiet"]
    for item in overrides:
        argv += ["--set", item]
    return argv


def resume_argv(run_dir: str) -> list[str]:
    """Arguments that continue a stopped run from its newest checkpoint."""
    return ["train", "--resume", run_dir, "--quiet"]


@dataclass(eq=False)  # compared and hashed by identity: a dict key while it runs
class Child:
    """One running training process; its console output goes to `log_path`."""

    run_dir: str
    log_path: str
    process: subprocess.Popen
    started: float = field(default_factory=time.time)

    @property
    def returncode(self) -> Optional[int]:
        return self.process.poll()

    def last_error(self) -> str:
        """The last `error: ...` line of the child's log (or its last line), for a one-line report."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                lines = [line.strip() for line in handle if line.strip()]
        except OSError:
            return ""
        errors = [line for line in lines if line.startswith("error:")]
        return (errors or lines or [""])[-1]


def start(argv: Sequence[str], run_dir: str, log_path: str) -> Child:
    """Starts `python -m dqn_cartpole ARGV` in its own session, output appended to `log_path`."""
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    env = dict(os.environ)
    env.setdefault("SDL_AUDIODRIVER", "dummy")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
    with open(log_path, "ab") as log:
        log.write(f"$ python -m dqn_cartpole {' '.join(argv)}\n".encode())
        log.flush()
        process = subprocess.Popen([sys.executable, "-m", "dqn_cartpole", *argv], stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True)
    return Child(run_dir, log_path, process)


def _package_root() -> str:
    """The folder that holds this `dqn_cartpole`, so children run the same code as the parent."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ChildSet:
    """The children of one command; thread-safe, so tune's worker threads can share one."""

    def __init__(self) -> None:
        self._children: list[Child] = []
        self._lock = threading.Lock()

    def add(self, child: Child) -> None:
        with self._lock:
            self._children.append(child)

    def remove(self, child: Child) -> None:
        with self._lock:
            if child in self._children:
                self._children.remove(child)

    def running(self) -> list[Child]:
        with self._lock:
            return [c for c in self._children if c.returncode is None]

    def signal_all(self, signum: int) -> None:
        for child in self.running():
            try:
                child.process.send_signal(signum)
            except ProcessLookupError:
                pass

    def stop(self, signum: int, timeout_s: float = 120.0) -> None:
        """Forwards `signum` once to every child, waits up to `timeout_s`, then kills what is left."""
        self.signal_all(signum)
        deadline = time.time() + timeout_s
        for child in self.running():
            try:
                child.process.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()


class StopFlag:
    """Turns SIGINT/SIGTERM in the parent into a flag the main loop polls (main thread only)."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: dict = {}

    def __enter__(self) -> "StopFlag":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, _frame) -> None:
        if self.signum is None:
            self.signum = signum
            sys.stderr.write(f"\n{signal.Signals(signum).name} received: stopping every run at its next step "
                             f"and saving checkpoints...\n")
            sys.stderr.flush()

    @property
    def requested(self) -> bool:
        return self.signum is not None
