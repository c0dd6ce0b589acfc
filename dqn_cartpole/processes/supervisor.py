"""The one process supervisor: sweep's and tune's runs and the local topology's roles are its children.

* `Child.start` runs a command in its own session (a terminal's Ctrl-C reaches only the parent, which
  decides the order of the stop), its output appended to a log, and tied to the parent's life: the child
  gets SIGTERM when the parent dies, however it dies (Linux's PR_SET_PDEATHSIG; strictly, when the thread
  that started it ends, so start children from a thread that outlives them). `Child.keep_fds` are
  descriptors the child keeps open (the run folder's lock: see `run_folder.lock`); every other one is closed.
* `stop_all` signals each running child once (a second SIGTERM would make a run stop at once, without its
  final checkpoint), waits a grace period for all of them together, then kills what is left.
* `RestartWindow` says when a child that died starts again: after a backoff that doubles up to a cap, and
  never after `Backoff.max_restarts` restarts within `Backoff.window_s` (`distributed.policy` applies it to
  the roles of a topology, whatever places them).
* `Child.output` and `Child.last_error` read what the child wrote since it was last started.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it, between fork and exec
TAIL_BYTES = 64 * 1024


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """In the child, before exec: `signum` when the parent dies, no signal blocked, and SIGINT back to its default.
    A child inherits the starting thread's signal mask, and some threads block signals (a Ray actor's event loop
    blocks SIGINT: its child would never see a Ctrl-C sent on to it). A command a script or `nohup` started in the
    background inherits SIGINT ignored, and a Python child would keep ignoring it: the supervisor's stop (SIGINT,
    as Ctrl-C) would then wait out its grace and kill the child without its checkpoint."""
    _PRCTL(_PR_SET_PDEATHSIG, signum)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def package_root() -> str:
    """The folder that holds this `dqn_cartpole`, so children run the same code as the parent."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env() -> dict:
    """The parent's environment, with this checkout first on the path and quiet SDL and TensorFlow."""
    env = dict(os.environ)
    env.setdefault("SDL_AUDIODRIVER", "dummy")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root(), env.get("PYTHONPATH")) if p)
    return env


@dataclass(frozen=True)
class Backoff:
    """When a child that died starts again: the first `at_once` restarts within the window at once, the next one
    `first_s` after its death, each next one twice as late (up to `max_s`); none after `max_restarts` restarts
    within the last `window_s` seconds."""

    first_s: float = 0.25
    max_s: float = 8.0
    max_restarts: int = 5
    window_s: float = 120.0
    at_once: int = 0

    def delay(self, recent_restarts: int) -> Optional[float]:
        """The wait before the next restart, after `recent_restarts` within the window; None: give up."""
        if recent_restarts >= self.max_restarts:
            return None
        if recent_restarts < self.at_once:
            return 0.0
        return min(self.max_s, self.first_s * 2 ** (recent_restarts - self.at_once))


@dataclass
class RestartWindow:
    """One child's restarts: `due(now)` is the wait before the next one (None: it died too often, give up), and
    `restarted(now)` counts one."""

    backoff: Backoff
    times: list = field(default_factory=list)
    restarts: int = 0

    def recent(self, now: float) -> int:
        self.times = [t for t in self.times if now - t < self.backoff.window_s]
        return len(self.times)

    def due(self, now: float) -> Optional[float]:
        return self.backoff.delay(self.recent(now))

    def restarted(self, now: float) -> None:
        self.times.append(now)
        self.restarts += 1


@dataclass(eq=False)  # compared and hashed by identity: a dict key while it runs
class Child:
    """One child process: its command and its log (None: the parent's console)."""

    name: str
    command: list
    log_path: Optional[str] = None
    header: bool = False  # start each stretch of the log with the command line
    keep_fds: tuple = ()  # descriptors the child inherits (the run's lock), besides its output
    extra_env: dict = field(default_factory=dict)  # variables added to `child_env()`
    parent_death_signal: int = signal.SIGTERM  # what the child gets when this process dies
    process: Optional[subprocess.Popen] = field(default=None, repr=False)
    _log_offset: int = 0

    def start(self) -> "Child":
        """Starts the command in its own session, tied to this process's life; its output appended to the log."""
        if not self.log_path:
            self.process = _spawn(self.command, None, self.keep_fds, self.extra_env, self.parent_death_signal)
            return self
        os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            if self.header:
                log.write(f"$ {' '.join(['python', *self.command[1:]])}\n".encode())
            log.flush()
            self._log_offset = log.tell()
            self.process = _spawn(self.command, log, self.keep_fds, self.extra_env, self.parent_death_signal)
        return self

    @property
    def returncode(self) -> Optional[int]:
        return None if self.process is None else self.process.poll()

    def send(self, signum: int) -> bool:
        """Sends `signum` if the child runs; whether it was sent."""
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            self.process.send_signal(signum)
        except ProcessLookupError:
            return False
        return True

    def stop(self, grace_s: float, signum: int = signal.SIGTERM) -> Optional[int]:
        """`signum` once, then SIGKILL after `grace_s`; returns the exit status."""
        stop_all([self], grace_s, signum)
        return self.returncode

    def output(self) -> str:
        """What the child wrote to its log since it was last started (its last TAIL_BYTES)."""
        try:
            with open(self.log_path, "rb") as log:  # type: ignore[arg-type]
                size = log.seek(0, os.SEEK_END)
                log.seek(max(self._log_offset, size - TAIL_BYTES))
                return log.read().decode("utf-8", errors="replace")
        except (OSError, TypeError):
            return ""

    def last_line(self, prefix: str = "") -> str:
        """The output's last line that starts with `prefix`, else its last line ("" if it wrote none)."""
        lines = [line.strip() for line in self.output().splitlines() if line.strip()]
        return ([line for line in lines if line.startswith(prefix)] or lines or [""])[-1]

    def last_error(self) -> str:
        """The last `error: ...` line of the output (else its last line), for a one-line report."""
        return self.last_line("error:")


def _spawn(command: list, log, keep_fds: tuple = (), extra_env: Optional[dict] = None,
           parent_death_signal: int = signal.SIGTERM) -> subprocess.Popen:
    out = subprocess.STDOUT if log is not None else None
    env = {**child_env(), **(extra_env or {})}
    return subprocess.Popen(command, stdout=log, stderr=out, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True, preexec_fn=lambda: die_with_parent(parent_death_signal),
                            pass_fds=keep_fds)


def stop_all(children: Iterable[Child], grace_s: float, signum: int = signal.SIGTERM) -> None:
    """Sends `signum` once to every running child, waits up to `grace_s` for them together, then kills what is
    left (a child blocked where it never sees the signal still ends)."""
    children = [child for child in children if child.process is not None]
    for child in children:
        child.send(signum)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
