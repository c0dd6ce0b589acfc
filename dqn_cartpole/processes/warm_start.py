"""A warm start-up process: Python and TensorFlow imported once, each role's process a fork of it.

A role's process spends most of its start in Python's and TensorFlow's import (measured under `--topology ray` on
2 loaded cores: 9-20 s of a collector's 11-24 s to its first write). A `WarmStarter` keeps one process that has
imported them (`python -m dqn_cartpole.processes.warm_process`, its parent's child, dying with it) and starts each
command as a fork of it, which runs `python -m dqn_cartpole ARGV` in-process (`runpy`): the same code, arguments,
log and exit status as a fresh `python -m dqn_cartpole ARGV`, without the import. A restarted role (its process
killed) is back in the seconds its own build takes.

* The warm process imports with `heavy_imports` (the collector paused, then the heap frozen: its pages stay shared
  with the forks) and stays single-threaded (OPENBLAS_NUM_THREADS=1: numpy's and scipy's OpenBLAS start no pool;
  TensorFlow starts its threads at its first op, in the fork), so a fork inherits no lock held by another thread.
* Protocol (`warm_process`) on its stdin and stdout, one JSON object a line: {"argv": [...], "log": PATH} ->
  {"pid": N}; when a fork ends, {"pid": N, "status": S} (S as `subprocess.Popen.returncode`: negative for a
  signal). Or on a Unix socket, where it outlives its client (a Ray actor restarted in a new process finds its
  role's warm process still warm): the client's forks die when it goes, and the warm process waits `linger_s`
  for the next client.
* A fork starts a new session, dies with the warm process (SIGKILL as its parent-death signal), has no signal
  blocked or ignored, and appends its output to its log. The role's exit runs its `atexit` handlers and joins its
  threads as an interpreter's exit would.
* `WarmProcess` is a `subprocess.Popen` look-alike for `supervisor.Child` (`pid`, `poll`, `wait`, `send_signal`,
  `kill`), so a role keeps its signals, its stop and its log; `WarmChild` is a `Child` started this way.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

from dqn_cartpole.processes.supervisor import Child, child_env, die_with_parent

COMMAND_ROOM = 4096  # bytes of a fork's command line (`ps`, /proc/PID/cmdline)
WARM_ENV = {"OPENBLAS_NUM_THREADS": "1"}  # one thread at the fork (see the module docstring)
KILLED = -signal.SIGKILL  # the status of a fork whose warm process is gone
LINGER_S = 60.0  # a warm process on a socket, without a client: how long it waits for the next one
CONNECT_WAIT_S = 30.0  # a warm process just started on a socket: how long it may take to listen
# What it imports: the libraries every role imports (the project's own modules, 0.5 s, are each role's).
WARM_MODULES = ("tensorflow", "tf_agents.agents", "tf_agents.drivers", "tf_agents.environments", "tf_agents.policies",
                "reverb", "gymnasium")


class WarmProcess:
    """A fork of the warm process, seen as a `subprocess.Popen` (what `supervisor.Child` calls)."""

    def __init__(self, pid: int, starter: "WarmStarter"):
        self.pid, self.starter = pid, starter

    @property
    def returncode(self) -> Optional[int]:
        return self.starter.status(self.pid)

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        try:
            self.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass


class WarmStarter:
    """The warm process of one parent (started at the first `start`, again if it died) and its forks' statuses.

    With `socket_path`, the warm process outlives this one (see `warm_process`): `ensure` connects to the one
    listening there (a process of the same role before this one started it: it is still warm) or starts one."""

    def __init__(self, parent_death_signal: int = signal.SIGKILL, modules: Optional[tuple] = None,
                 program: str = "dqn_cartpole", socket_path: Optional[str] = None, linger_s: float = LINGER_S,
                 lifeline: Optional[int] = None):
        """`modules`: what the warm process imports (None: WARM_MODULES); `program`: the module each fork runs as
        `python -m PROGRAM ARGV`; `linger_s`: how long a warm process on `socket_path` waits for a new client;
        `lifeline`: a pid whose end ends it."""
        self.parent_death_signal, self.program = parent_death_signal, program
        self.modules = WARM_MODULES if modules is None else modules
        self.socket_path, self.linger_s, self.lifeline = socket_path, linger_s, lifeline
        self.process: Optional[subprocess.Popen] = None  # the warm process, if this one started it
        self.channel: Optional[tuple] = None  # (the requests' writer, the socket or None) while connected
        self.warm_pid: Optional[int] = None  # the warm process's pid, once it answered on a socket
        self.statuses: dict = {}  # pid -> its exit status (None while it runs)
        self.pending: Optional[int] = None  # the pid of the fork just started
        self.lock = threading.RLock()  # one request at a time
        self.started = threading.Condition()

    def start(self, argv: list, log_path: str) -> WarmProcess:
        """Forks `python -m dqn_cartpole ARGV` (its output appended to `log_path`) from the warm process."""
        with self.lock:
            self.ensure()
            with self.started:
                channel = self.channel
                channel[0].write(json.dumps({"argv": argv, "log": log_path}) + "\n")
                channel[0].flush()
                self.started.wait_for(lambda: self.pending is not None or self.channel is not channel)
                pid, self.pending = self.pending, None
            if pid is None:
                raise OSError("the warm start-up process ended")
            return WarmProcess(pid, self)

    def ensure(self) -> None:
        """Starts the warm process, or connects to it, unless connected (from the thread that must outlive it: see
        `supervisor`)."""
        with self.lock:
            if self.channel is not None and self.socket_path is None and self.process.poll() is not None:
                self.channel = None  # it died: its reader may not have seen the end yet
            if self.channel is None:
                if self.socket_path is None:
                    self.launch()
                else:
                    self.connect_or_launch()

    def launch(self, *extra: str) -> None:
        # The room argument reserves space in the argv area for each fork's own command line (`show_command`).
        command = [sys.executable, "-m", "dqn_cartpole.processes.warm_process", self.program, ",".join(self.modules),
                   " " * COMMAND_ROOM, *extra]
        on_socket = bool(extra)
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            command, stdin=subprocess.DEVNULL if on_socket else subprocess.PIPE,
            stdout=subprocess.DEVNULL if on_socket else subprocess.PIPE, text=True,
            env={**child_env(), **WARM_ENV}, start_new_session=True,
            preexec_fn=None if on_socket else lambda: die_with_parent(self.parent_death_signal))
        if not on_socket:
            self.attach(self.process.stdin, self.process.stdout, None)

    def connect_or_launch(self) -> None:
        """Connects to the warm process on `socket_path`, or starts one there (a socket no process listens on is a
        dead one's: removed first). Its lock file makes the clients that come together start one, not one each."""
        with open(self.socket_path + ".lock", "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.connect():
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            lifeline = ("--lifeline", str(self.lifeline)) if self.lifeline else ()
            self.launch("--socket", self.socket_path, "--linger", str(self.linger_s), *lifeline)
            deadline = time.monotonic() + CONNECT_WAIT_S
            while not self.connect():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise OSError(f"the warm start-up process on {self.socket_path} did not answer "
                                  f"(status {self.process.poll()})")
                time.sleep(0.02)

    def connect(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.socket_path)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return False
        self.attach(sock.makefile("w", encoding="utf-8"), sock.makefile("r", encoding="utf-8"), sock)
        return True

    def attach(self, writer, reader, sock: Optional[socket.socket]) -> None:
        with self.started:
            self.channel, self.pending = (writer, sock), None
        threading.Thread(target=self.read, args=(reader, self.channel), daemon=True).start()

    def read(self, reader, channel: tuple) -> None:
        """The warm process's answers, until it ends (or the socket does); then every fork it started that still
        ran is gone."""
        mine: set = set()
        with contextlib.suppress(OSError):  # a socket reset: the warm process died
            for line in reader:
                self.take(line, mine)
        if channel[1] is None:
            self.process.wait()
        with self.started:
            for pid in mine:
                if self.statuses[pid] is None:
                    self.statuses[pid] = KILLED
            if self.channel is channel:
                self.channel = None
            self.started.notify_all()

    def take(self, line: str, mine: set) -> None:
        try:
            answer = json.loads(line)
        except ValueError:
            return  # not an answer (a library's note on its stdout)
        with self.started:
            if "warm" in answer:
                self.warm_pid = answer["warm"]
            elif "status" in answer:
                self.statuses[answer["pid"]] = answer["status"]
            else:
                self.statuses[answer["pid"]] = None
                self.pending = answer["pid"]
                mine.add(answer["pid"])
            self.started.notify_all()

    def status(self, pid: int) -> Optional[int]:
        with self.started:
            return self.statuses.get(pid)

    def close(self) -> None:
        """Ends the warm process (on a socket: asks it to end) and its forks."""
        channel, self.channel = self.channel, None
        if channel is not None and channel[1] is not None:
            with contextlib.suppress(OSError):
                channel[0].write(json.dumps({"close": True}) + "\n")
                channel[0].flush()
            with contextlib.suppress(OSError):
                channel[1].shutdown(socket.SHUT_RDWR)
            channel[1].close()
        if self.process is not None and self.process.poll() is None:
            if channel is None or channel[1] is None:
                self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(CONNECT_WAIT_S)


def remove_stale(pattern: str) -> list:
    """Removes the sockets matching `pattern` (a glob) that no process listens on, and their lock files that no one
    holds: a warm process that was SIGKILLed could not remove its own. The paths removed."""
    removed = []
    for path in glob.glob(pattern):
        if path.endswith(".lock") or listening(path):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    for lock_path in glob.glob(pattern + ".lock"):
        if os.path.exists(lock_path[:-len(".lock")]):
            continue
        with open(lock_path, "a", encoding="utf-8") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a client is starting its warm process
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
                removed.append(lock_path)
    return removed


def listening(path: str) -> bool:
    """Whether a process listens on the Unix socket `path` (a full backlog counts as listening)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.5)
    try:
        sock.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        sock.close()
    return True


@dataclass(eq=False)
class WarmChild(Child):
    """A `supervisor.Child` whose process is a fork of `starter`'s warm process (in its own session, dying with
    it; `keep_fds`, `extra_env` and `header` are not supported)."""

    starter: Optional[WarmStarter] = None

    def start(self) -> "WarmChild":
        os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
        self.process = self.starter.start(self.command, self.log_path)  # type: ignore[union-attr,assignment]
        return self
