"""Reused train processes: a long-lived process that imports TensorFlow once and trains one run after another.

Why, and what keeps each run the run a fresh process trains: docs/experiments.md, 'Reused train processes'. The
worker's own side is `api.worker_process` (a `processes.child.WorkerChild` here): between two runs it has the default
signal handlers, so a signal ends it, and it ends when its stdin closes. The parent's side is `WorkerSlots`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Optional

from dqn_cartpole.console.exit_status import EXIT_FAILED, STOP_SIGNALS, for_signal
from dqn_cartpole.processes.child import ChildFailed, WorkerChild
from dqn_cartpole.processes.commands import parse_train_argv
from dqn_cartpole.processes.supervisor import Child

MAX_RUNS = 8  # a worker is replaced after this many runs
FRESH_RUNS_ENV = "DQN_CARTPOLE_FRESH_RUNS"  # "1": every run a fresh process, as before workers (benchmarks)
WORKER_ENV = {"OMP_NUM_THREADS": "1"}  # as Ray sets in a one-CPU worker: the run's ops are on one thread already
WORKER_MODULE = "dqn_cartpole.api.worker_process"  # the worker's side: `serve_child`, through the Python API


# ---------------------------------------------------------------------------- which runs


def reusable(argv: list) -> bool:
    """Whether the run `argv` (a `train` argv, see `processes.commands`) trains in a worker exactly as in a fresh
    process: a fresh process sets TensorFlow's ops to one thread for the compiled driver with direct sampling only,
    and a worker runs every run on one thread."""
    from dqn_cartpole.config import load_config, sampling_mode
    from dqn_cartpole.errors import UserError

    args = parse_train_argv(argv)
    try:
        config = load_config(os.path.join(args.resume, "config.yaml") if args.resume else args.config, args.set or [])
    except (UserError, OSError):
        return False  # a fresh process says what is wrong, in the run's log, as before
    return config.collection.driver == "compiled" and sampling_mode(config.replay) == "direct"


# ---------------------------------------------------------------------------- the parent's side


class Worker(WorkerChild):
    """One worker process, seen from its parent: tied to its life, its own output in `log_path`."""

    def __init__(self, log_path: str, max_runs: int = MAX_RUNS, extra_env: Optional[dict] = None) -> None:
        super().__init__(WORKER_MODULE, what="the train process", tied=True, log_path=log_path, extra_env=extra_env)
        self.log_path, self.max_runs = log_path, max_runs
        self.runs = 0
        self.busy = False
        self.retiring = False  # it ends after the run it answered

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def idle(self) -> bool:
        """It can take a run now."""
        return not self.busy and not self.retiring and self.alive

    def submit(self, argv: list, log_path: str) -> None:
        self.send((list(argv), log_path))
        self.busy = True

    def reply(self) -> Optional[int]:
        """The exit status of the run in progress, once the worker answered (never waits); `ChildFailed` if it
        ended without answering. After `max_runs` runs its input ends: it ends."""
        answer = self.receive(block=False)
        if answer is None:
            return None
        status, goes_on = answer
        self.runs += 1
        self.busy, self.retiring = False, not goes_on or self.runs >= self.max_runs
        if self.retiring:
            self.end_input()
        return status


@dataclass(eq=False)
class ReusedRun(Child):
    """A run on a `Worker`, as its parent sees a `Child`: `returncode` is the run's exit status (the worker's reply,
    or the worker's own exit status if it died without one), `send` signals the worker, `process` is the worker's."""

    worker: Optional[Worker] = field(default=None, repr=False)
    _status: Optional[int] = None

    def start(self) -> "ReusedRun":
        os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
        with open(self.log_path, "ab") as log:
            if self.header:
                log.write(f"$ {' '.join(['python', *self.command[1:]])}   # run {self.worker.runs + 1} in worker "
                          f"{self.worker.process.pid}\n".encode())
            self._log_offset = log.tell()
        self.process = self.worker.process
        self.worker.submit(self.command[3:], self.log_path)  # the argv after `python -m dqn_cartpole`
        return self

    @property
    def returncode(self) -> Optional[int]:
        if self._status is None:
            try:
                self._status = self.worker.reply()
            except ChildFailed:
                self._status = _died_status(self.worker.process.returncode)
                if self.worker.process.returncode > 0 or -self.worker.process.returncode not in STOP_SIGNALS:
                    self._note_death()
        return self._status

    def _note_death(self) -> None:
        """A worker that died without answering (killed, out of memory, a crash in TensorFlow) says so in the run's
        log, where `last_error` finds it, naming the worker's own log."""
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"error: the train process {self.process.pid} ended (status {self.process.returncode}) before "
                      f"the run did; its own output: {self.worker.log_path}\n")

    def send(self, signum: int) -> bool:
        return self.returncode is None and super().send(signum)

    def stop(self, grace_s: float, signum: int = signal.SIGTERM) -> Optional[int]:
        """As `Child.stop` while the run runs (its worker then ends with it); an ended run's worker is left idle."""
        if self.returncode is None:
            super().stop(grace_s, signum)
            self._status = self.returncode if self.returncode is not None else _died_status(self.process.poll() or 0)
        return self.returncode


def wait_run(child: Child, timeout: float) -> None:
    """Returns when the run on `child` ended, or after `timeout` seconds: a fresh `Child`'s process is waited for, a
    `ReusedRun`'s worker looked at every 0.1 s for its reply (the worker goes on after the run)."""
    deadline = time.monotonic() + timeout
    while child.returncode is None and time.monotonic() < deadline:
        left = max(0.0, deadline - time.monotonic())
        try:
            child.process.wait(timeout=min(0.1, left) if isinstance(child, ReusedRun) else left)
        except subprocess.TimeoutExpired:
            pass


def _died_status(code: int) -> int:
    """A worker that died without answering: killed by a stop signal reads as that stop (128 + the signal), as a
    fresh process stopped between two steps; otherwise its own status (a crash: never 0, it did not answer)."""
    if code < 0 and -code in STOP_SIGNALS:
        return for_signal(-code)
    return code or EXIT_FAILED


class WorkerSlots:
    """Up to `size` workers kept between runs; `start` puts a run on an idle one (or a new one), or in a fresh
    process when it is not `reusable`. `close` ends the idle ones."""

    def __init__(self, size: int, log_dir: str, max_runs: int = MAX_RUNS, extra_env: Optional[dict] = None) -> None:
        self.size, self.log_dir, self.max_runs = size, log_dir, max_runs
        self.extra_env = {**WORKER_ENV, **(extra_env or {})}
        self.workers: list[Worker] = []
        self.started = 0

    def start(self, name: str, command: list, log_path: str, reuse: bool = True) -> Child:
        """Starts the run `command` (`processes.commands.child_command`) with its output in `log_path`: on a worker,
        or in a fresh process when `reuse` is False, the run is not `reusable` or DQN_CARTPOLE_FRESH_RUNS=1."""
        if not reuse or os.environ.get(FRESH_RUNS_ENV) == "1" or not reusable(command[3:]):
            return Child(name, command, log_path, header=True).start()
        return self._on_worker(name, command, log_path)

    def _on_worker(self, name: str, command: list, log_path: str) -> "ReusedRun":
        keep = [w for w in self.workers if w.idle or (w.busy and w.alive)]
        for worker in self.workers:
            if worker not in keep:  # ended, or ending after its last run
                worker.close(5.0)
        self.workers = keep
        worker = next((w for w in self.workers if w.idle), None)  # one that died idle is not: a new one takes it
        if worker is not None:
            return ReusedRun(name, command, log_path, header=True, worker=worker).start()
        if len(self.workers) >= self.size:
            raise RuntimeError(f"every one of the {self.size} workers is busy")
        self.started += 1
        worker = Worker(os.path.join(self.log_dir, f"worker-{os.getpid()}-{self.started}.log"), self.max_runs,
                        self.extra_env)
        self.workers.append(worker)
        return ReusedRun(name, command, log_path, header=True, worker=worker).start()

    def close(self) -> None:
        for worker in self.workers:
            worker.close(5.0)
        self.workers = []

