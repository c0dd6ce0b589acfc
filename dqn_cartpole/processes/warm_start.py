"""A warm start-up process: Python and TensorFlow imported once, each role's process a fork of it.

A role's process spends most of its start in Python's and TensorFlow's import (measured under `--topology ray` on
2 loaded cores: 9-20 s of a collector's 11-24 s to its first write). A `WarmStarter` keeps one process that has
imported them (`python -m dqn_cartpole.processes.warm_start`, its parent's child, dying with it) and starts each
command as a fork of it, which runs `python -m dqn_cartpole ARGV` in-process (`runpy`): the same code, arguments,
log and exit status as a fresh `python -m dqn_cartpole ARGV`, without the import. A restarted role (its process
killed) is back in the seconds its own build takes.

* The warm process imports with `heavy_imports` (the collector paused, then the heap frozen: its pages stay shared
  with the forks) and stays single-threaded (OPENBLAS_NUM_THREADS=1: numpy's and scipy's OpenBLAS start no pool;
  TensorFlow starts its threads at its first op, in the fork), so a fork inherits no lock held by another thread.
* Protocol on its stdin and stdout, one JSON object a line: {"argv": [...], "log": PATH} -> {"pid": N}; when a
  fork ends, {"pid": N, "status": S} (S as `subprocess.Popen.returncode`: negative for a signal).
* A fork starts a new session, dies with the warm process (SIGKILL as its parent-death signal), has no signal
  blocked or ignored, and appends its output to its log. The role's exit runs its `atexit` handlers and joins its
  threads as an interpreter's exit would.
* `WarmProcess` is a `subprocess.Popen` look-alike for `supervisor.Child` (`pid`, `poll`, `wait`, `send_signal`,
  `kill`), so a role keeps its signals, its stop and its log; `WarmChild` is a `Child` started this way.
"""

from __future__ import annotations

import json
import os
import select
import signal
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
    """The warm process of one parent (started at the first `start`, again if it died) and its forks' statuses."""

    def __init__(self, parent_death_signal: int = signal.SIGKILL, modules: Optional[tuple] = None,
                 program: str = "dqn_cartpole"):
        """`modules`: what the warm process imports (None: WARM_MODULES); `program`: the module each fork runs as
        `python -m PROGRAM ARGV`."""
        self.parent_death_signal, self.program = parent_death_signal, program
        self.modules = WARM_MODULES if modules is None else modules
        self.process: Optional[subprocess.Popen] = None
        self.statuses: dict = {}  # pid -> its exit status (None while it runs)
        self.pending: Optional[int] = None  # the pid of the fork just started
        self.lock = threading.RLock()  # one request at a time
        self.started = threading.Condition()

    def start(self, argv: list, log_path: str) -> WarmProcess:
        """Forks `python -m dqn_cartpole ARGV` (its output appended to `log_path`) from the warm process."""
        with self.lock:
            self.ensure()
            with self.started:
                self.process.stdin.write(json.dumps({"argv": argv, "log": log_path}) + "\n")
                self.process.stdin.flush()
                self.started.wait_for(lambda: self.pending is not None or self.process.poll() is not None)
                pid, self.pending = self.pending, None
            if pid is None:
                raise OSError(f"the warm start-up process ended (status {self.process.poll()})")
            return WarmProcess(pid, self)

    def ensure(self) -> None:
        """Starts the warm process unless it runs (from the thread that must outlive it: see `supervisor`)."""
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                self.launch()

    def launch(self) -> None:
        # The last argument reserves room in the argv area for each fork's own command line (`show_command`).
        command = [sys.executable, "-m", __name__, self.program, ",".join(self.modules), " " * COMMAND_ROOM]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**child_env(), **WARM_ENV}, start_new_session=True,
                                        preexec_fn=lambda: die_with_parent(self.parent_death_signal))
        self.pending = None
        threading.Thread(target=self.read, args=(self.process,), daemon=True).start()

    def read(self, process: subprocess.Popen) -> None:
        """The warm process's answers, until it ends; then every fork still running is gone with it."""
        for line in process.stdout:
            try:
                answer = json.loads(line)
            except ValueError:
                continue  # not an answer (a library's note on its stdout)
            with self.started:
                if "status" in answer:
                    self.statuses[answer["pid"]] = answer["status"]
                else:
                    self.statuses[answer["pid"]] = None
                    self.pending = answer["pid"]
                self.started.notify_all()
        process.wait()
        with self.started:
            for pid, status in self.statuses.items():
                if status is None:
                    self.statuses[pid] = KILLED
            self.started.notify_all()

    def status(self, pid: int) -> Optional[int]:
        with self.started:
            return self.statuses.get(pid)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


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


# ---------------------------------------------------------------------------- the warm process itself

# What it imports: the libraries every role imports (the project's own modules, 0.5 s, are each role's).
WARM_MODULES = ("tensorflow", "tf_agents.agents", "tf_agents.drivers", "tf_agents.environments", "tf_agents.policies",
                "reverb", "gymnasium")


def serve(program: str, modules: list) -> None:
    """The warm process: imports `modules`, then forks one process per request (each runs `python -m PROGRAM
    ARGV`) until its stdin closes."""
    import importlib  # pylint: disable=import-outside-toplevel

    from dqn_cartpole.console.imports import heavy_imports  # pylint: disable=import-outside-toplevel

    if modules:
        with heavy_imports():
            for module in modules:
                importlib.import_module(module)
    requests, buffered, running = sys.stdin.buffer.raw, b"", set()
    while True:
        readable, _, _ = select.select([requests], [], [], 0.05)
        if readable:
            data = os.read(requests.fileno(), 65536)
            if not data:
                return  # the parent closed it: the forks die with this process
            buffered += data
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                request = json.loads(line)
                pid = fork_role(program, request["argv"], request["log"])
                running.add(pid)
                answer({"pid": pid})
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                answer({"pid": pid, "status": os.waitstatus_to_exitcode(status)})


def answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def fork_role(program: str, argv: list, log_path: str) -> int:
    """Forks; the fork runs `python -m PROGRAM ARGV` to its exit (a SystemExit that ends this interpreter as
    it would a fresh one: atexit handlers, threads joined). In the warm process: the fork's pid."""
    import runpy  # pylint: disable=import-outside-toplevel

    warm_pid = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        become_role(warm_pid, log_path)
    except BaseException:  # pylint: disable=broad-except  # nowhere to report it: the status says it
        os._exit(1)  # pylint: disable=protected-access
    show_command([sys.executable, "-m", program, *argv])
    sys.argv = [program, *argv]
    runpy.run_module(program, run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def show_command(words: list) -> None:
    """Makes /proc/self/cmdline (what `ps`, psutil and `lock.role_of` read) say `words`: written over the argv area
    the kernel reads it from (the warm process's, with COMMAND_ROOM to spare), as setproctitle does. Python keeps its
    own copy of its arguments, so nothing else reads that memory."""
    import ctypes  # pylint: disable=import-outside-toplevel

    with open("/proc/self/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end (fields 48 and 49)
    data = b"\0".join(word.encode() for word in words)[:end - start - 1]
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def become_role(warm_pid: int, log_path: str) -> None:
    """In the fork: a new session, dying with the warm process, signals as in a fresh Python, output to the log."""
    os.setsid()
    die_with_parent(signal.SIGKILL)
    if os.getppid() != warm_pid:  # the warm process died before the parent-death signal was set
        os._exit(1)  # pylint: disable=protected-access
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, source in ((0, null), (1, log), (2, log)):
        os.dup2(source, target)
    os.close(log)
    os.close(null)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False, buffering=1)  # pylint: disable=consider-using-with
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # pylint: disable=consider-using-with


if __name__ == "__main__":  # python -m dqn_cartpole.processes.warm_start PROGRAM MODULE,MODULE,... ROOM
    serve(sys.argv[1], [module for module in sys.argv[2].split(",") if module])
