"""A warm start-up process: Python and TensorFlow imported once, each role's process a fork of it.

A role's process spends most of its start in Python's and TensorFlow's import (measured under `--topology ray` on
2 loaded cores: 9-20 s of a collector's 11-24 s to its first write). A `WarmStarter` keeps one process that has
imported them (`python -m dqn_cartpole.processes.warm_process`) and starts each command as a fork of it, which runs
`python -m dqn_cartpole ARGV` in-process (`runpy`): the same code, arguments, log and exit status as a fresh
`python -m dqn_cartpole ARGV`, without the import. A restarted role (its process killed) is back in the seconds its
own build takes.

* The warm process imports with `heavy_imports` (the collector paused, then the heap frozen: its pages stay shared
  with the forks) and stays single-threaded (OPENBLAS_NUM_THREADS=1: numpy's and scipy's OpenBLAS start no pool;
  TensorFlow starts its threads at its first op, in the fork), so a fork inherits no lock held by another thread.
* The protocol, what a fault of the warm process costs (at most the request in flight) and how a fork lives and
  ends: `warm_process`'s docstring. `WarmProcess` is a `subprocess.Popen` look-alike for `supervisor.Child`, so
  a role keeps its signals, its stop and its log; `WarmChild` is a `Child` started this way.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

from dqn_cartpole.processes.supervisor import Child, child_env, die_with_parent
from dqn_cartpole.processes.warm_process import close_fds

COMMAND_ROOM = 4096  # bytes of a fork's command line (`ps`, /proc/PID/cmdline)
WARM_ENV = {"OPENBLAS_NUM_THREADS": "1"}  # one thread at the fork (see the module docstring)
KILLED = -signal.SIGKILL  # the status of a fork whose warm process is gone
LINGER_S = 60.0  # a warm process on a socket, without a client: how long it waits for the next one
CONNECT_WAIT_S = 30.0  # a warm process just started on a socket: how long it may take to listen
# What it imports: the libraries every role imports (the project's own modules, 0.5 s, are each role's).
WARM_MODULES = ("tensorflow", "tf_agents.agents", "tf_agents.drivers", "tf_agents.environments", "tf_agents.policies",
                "reverb", "gymnasium")


class WarmProcess:
    """A fork of the warm process, seen as a `subprocess.Popen` (what `supervisor.Child` calls). Its end comes
    through its status pipe (see `warm_process`), so it is known whether the warm process still runs or not;
    closing `life_w` (`release`) ends it."""

    def __init__(self, pid: int, status_r: int, life_w: int):
        self.pid, self.status_r, self.life_w = pid, status_r, life_w
        self.said = b""  # what the status pipe brought so far
        self._returncode: Optional[int] = None
        self._reading = threading.Lock()  # an actor's threads may ask at once: one reads (and closes) the pipe
        os.set_blocking(status_r, False)

    @property
    def returncode(self) -> Optional[int]:
        with self._reading:
            if self._returncode is None and self.status_r >= 0:
                self._read_status()
            return self._returncode

    def _read_status(self) -> None:
        while True:
            try:
                data = os.read(self.status_r, 4096)
            except BlockingIOError:
                return  # it runs
            except InterruptedError:
                continue
            if not data:
                break
            self.said += data
        os.close(self.status_r)
        self.status_r = -1
        lines = [line.split() for line in self.said.decode(errors="replace").splitlines()]
        codes = [int(words[1]) for words in lines if len(words) == 2 and words[0] == "exit"]
        self._returncode = codes[-1] if codes else KILLED  # ended with no word: killed before it could say
        self.release()

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            with contextlib.suppress(InterruptedError, ValueError, OSError):
                select.select([self.status_r], [], [], min(0.5, remaining) if remaining is not None else 0.5)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.send_signal(signal.SIGKILL)

    def release(self) -> None:
        """Lets the fork go: it ends at once if it still runs (its lifeline pipe ends)."""
        if self.life_w >= 0:
            with contextlib.suppress(OSError):
                os.close(self.life_w)
            self.life_w = -1


class WarmStarter:
    """The client of a warm process: it starts one (its own child, dying with it) or, with `socket_path`, connects
    to the one that listens there (a process of the same node and run started it: it is still warm) or starts one
    there, which outlives it (see `warm_process`). If the warm process is gone, the next `start` starts another."""

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
        self.channel: Optional[socket.socket] = None  # while connected
        self.warm_pid: Optional[int] = None  # the warm process's pid, once it answered
        self.answer: Optional[dict] = None  # the answer to the request in flight
        self.forks: list = []  # the WarmProcesses started by this client
        self.lock = threading.RLock()  # one request at a time
        self.answered = threading.Condition()

    def start(self, argv: list, log_path: str) -> WarmProcess:
        """Forks `python -m dqn_cartpole ARGV` (its output appended to `log_path`) from the warm process; once
        more, from a new warm process, if the one asked ended before it answered."""
        with self.lock:
            try:
                return self.request(argv, log_path)
            except ConnectionError:
                return self.request(argv, log_path)

    def request(self, argv: list, log_path: str) -> WarmProcess:
        self.ensure()
        status_r, status_w = os.pipe()
        life_r, life_w = os.pipe()
        channel = self.channel
        try:
            with self.answered:
                self.answer = None
                try:
                    socket.send_fds(channel, [(json.dumps({"argv": argv, "log": log_path}) + "\n").encode()],
                                    [status_w, life_r])
                except OSError:  # the warm process has gone
                    self.disconnect(channel)
                self.answered.wait_for(lambda: self.answer is not None or self.channel is not channel)
                answer = self.answer
        finally:
            close_fds([status_w, life_r])  # the fork's (and the warm process's) now
        if answer is None or "pid" not in answer:
            close_fds([status_r, life_w])  # a fork that started all the same ends with its lifeline
            if answer is None:
                self.disconnect(channel)
                raise ConnectionError("the warm start-up process ended before it answered")
            raise OSError(f"the warm start-up process could not start {' '.join(argv[:1])}: {answer['error']}")
        fork = WarmProcess(answer["pid"], status_r, life_w)
        self.forks = [earlier for earlier in self.forks if earlier.life_w >= 0] + [fork]  # those still held
        return fork

    def ensure(self) -> None:
        """Starts the warm process, or connects to it, unless connected (from the thread that must outlive it: see
        `supervisor`)."""
        with self.lock:
            if self.channel is not None and self.process is not None and self.socket_path is None \
                    and self.process.poll() is not None:
                self.disconnect(self.channel)  # it died: its reader may not have seen the end yet
            if self.channel is None:
                if self.socket_path is None:
                    self.launch_private()
                else:
                    self.connect_or_launch()

    def command(self, *extra: str) -> list:
        # The room argument reserves space in the argv area for each fork's own command line (`show_command`).
        return [sys.executable, "-m", "dqn_cartpole.processes.warm_process", self.program, ",".join(self.modules),
                " " * COMMAND_ROOM, *extra]

    def launch_private(self) -> None:
        """A warm process of this client's alone, on a socket pair; it dies with this process."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = subprocess.Popen(  # pylint: disable=consider-using-with
                self.command("--fd", str(theirs.fileno())), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                env={**child_env(), **WARM_ENV}, start_new_session=True, pass_fds=(theirs.fileno(),),
                preexec_fn=lambda: die_with_parent(self.parent_death_signal))
        finally:
            theirs.close()
        self.attach(mine)

    def launch_shared(self) -> None:
        lifeline = ("--lifeline", str(self.lifeline)) if self.lifeline else ()
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            self.command("--socket", self.socket_path, "--linger", str(self.linger_s), *lifeline),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env={**child_env(), **WARM_ENV},
            start_new_session=True)

    def connect_or_launch(self) -> None:
        """Connects to the warm process on `socket_path`, or starts one there (a socket no process listens on is a
        dead one's: removed first). Its lock file makes the clients that come together start one, not one each."""
        with open(self.socket_path + ".lock", "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.connect():
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            self.launch_shared()
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
        self.attach(sock)
        return True

    def attach(self, sock: socket.socket) -> None:
        with self.answered:
            self.channel, self.answer = sock, None
        threading.Thread(target=self.read, args=(sock,), name="warm-answers", daemon=True).start()

    def read(self, sock: socket.socket) -> None:
        """The warm process's answers, until it ends (or the socket does)."""
        with contextlib.suppress(OSError, ValueError):  # a socket reset: the warm process died
            for line in sock.makefile("r", encoding="utf-8"):
                self.take(line)
        self.disconnect(sock)

    def take(self, line: str) -> None:
        try:
            answer = json.loads(line)
        except ValueError:
            return  # not an answer
        with self.answered:
            if "warm" in answer:
                self.warm_pid = answer["warm"]
            else:
                self.answer = answer
            self.answered.notify_all()

    def disconnect(self, sock: socket.socket) -> None:
        with self.answered:
            if self.channel is sock:
                self.channel = None
                with contextlib.suppress(OSError):
                    sock.close()
            self.answered.notify_all()

    def close(self) -> None:
        """Ends the forks this client started and still run, and the warm process (on a socket: asks it to end;
        it does once its last client asked)."""
        for fork in self.forks:
            fork.release()
        with self.answered:
            channel, self.channel = self.channel, None
        if channel is not None:
            with contextlib.suppress(OSError):
                channel.sendall((json.dumps({"close": True}) + "\n").encode())
            with contextlib.suppress(OSError):
                channel.shutdown(socket.SHUT_RDWR)
            channel.close()
        if self.process is not None and self.process.poll() is None:
            if self.socket_path is None:
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
