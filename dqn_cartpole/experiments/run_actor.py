"""Runs on a Ray node: the actor that trains them, and what comes back of each (`RunOutcome`).

A `RunActor` holds one CPU of a node for the whole command and trains the runs the driver gives it, one at a time,
in its reused train process (`train_worker`: TensorFlow imported once for many runs), or in a fresh
`python -m dqn_cartpole train` child when the run would not train alike there. For each run it makes a temporary
folder on its node, writes the config there, unpacks the run folder it is to resume (if any), trains, and returns
the run folder as bytes with its log and exit status: nothing is shared with the driver but Ray's object store.
While a run trains the driver may call `stop(signum)` (the user's Ctrl-C, or the pruner's SIGTERM: the run saves a
checkpoint, as a local one does) and `evaluations()` (a study's pruner), on the actor's second thread.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from dqn_cartpole.experiments import ray_transfer, train_worker
from dqn_cartpole.processes.commands import child_command
from dqn_cartpole.processes.ray_node import this_node
from dqn_cartpole.processes.supervisor import Child
from dqn_cartpole.run_folder.csv_files import read_csv
from dqn_cartpole.run_folder.layout import RunLayout

STOP_WAIT_S = 120.0  # a stopped run writes its checkpoint, plots and videos (as a local sweep waits)
WAIT_S = 1.0  # how often the running run's loop looks for a stop that is overdue
LOG_TAIL_BYTES = 256 * 1024  # of the run's console output, sent back for the driver's logs/<run>.log
TEMP_PREFIX = "dqn_cartpole-ray"


@dataclass
class RunOutcome:
    """What came back from one run: its exit status, its folder as bytes, where it ran and what that cost."""

    key: str
    status: Optional[int]
    last_error: str
    log_text: str
    folder: bytes  # the run folder, packed (b"" when the run never made one)
    written_at: str  # the folder's path on the worker (summary.json's paths start with it)
    node: dict = field(default_factory=dict)  # node_id, node_ip, host
    seconds: dict = field(default_factory=dict)  # run, pack (on the worker)
    evaluations: list = field(default_factory=list)  # the run's last evaluations, not yet passed on


class RunActor:
    """A Ray actor (two threads: `run` on one; `stop` and `evaluations` on the other) that trains runs in turn."""

    def __init__(self) -> None:
        self.node = this_node()
        self.slots = train_worker.WorkerSlots(1, os.path.join(temp_root(), f"{os.getpid()}-workers"))
        self._lock = threading.Lock()
        self._child: Optional[Child] = None
        self._key: Optional[str] = None  # the run that trains now
        self._stops: dict = {}  # run key -> the signal it is to stop with
        self._stop_sent: Optional[float] = None
        self._eval_csv: Optional[str] = None
        self._sent_rows = 0

    def where(self) -> dict:
        """The node this actor runs on (node_id, node_ip, host)."""
        return self.node

    def run(self, request, config_text: str, code: tuple, resume_folder: Optional[bytes]) -> RunOutcome:
        """The run `request` asks for (an `executor.RunRequest`: its folder's and its config's names, its overrides)
        in a temporary folder of this node, with the config `config_text` of the driver's code `code`; returned as
        bytes."""
        check_same_code(code, self.node)
        clear_stale_folders()
        work = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=temp_root())
        try:
            run_dir = os.path.join(work, os.path.basename(request.run_dir))
            config = os.path.join(work, "config", os.path.basename(request.config_path))
            if request.resume:
                ray_transfer.unpack(resume_folder or b"", run_dir)
            else:
                os.makedirs(os.path.dirname(config))
                with open(config, "w", encoding="utf-8") as handle:
                    handle.write(config_text)
            log_path = os.path.join(work, "run.log")
            started = time.monotonic()
            status, last_error = self._execute(request, request.argv(run_dir, config), run_dir, log_path)
            run_s, packed = time.monotonic() - started, time.monotonic()
            last_evaluations = self.evaluations() if request.report_evaluations else []
            folder = ray_transfer.pack(run_dir) if os.path.isdir(run_dir) else b""
            return RunOutcome(request.key, status, last_error, _tail(log_path), folder, run_dir, self.node,
                              {"run": run_s, "pack": time.monotonic() - packed}, last_evaluations)
        finally:
            with self._lock:
                self._eval_csv = None
            shutil.rmtree(work, ignore_errors=True)

    def _execute(self, request, argv: list[str], run_dir: str, log_path: str) -> tuple[Optional[int], str]:
        """`python -m dqn_cartpole ARGV` (its output in `log_path`) in the reused train process, or a fresh child;
        stopped once with the signal `stop` asked for (also before it started), killed STOP_WAIT_S later."""
        with self._lock:
            child = self._child = self.slots.start(run_dir, child_command(argv), log_path, reuse=request.reuse)
            self._key, self._stop_sent = request.key, None
            self._eval_csv, self._sent_rows = RunLayout(run_dir).eval_metrics, 0
        try:
            while child.returncode is None:
                with self._lock:
                    self._send_stop()
                    overdue = self._stop_sent is not None and time.monotonic() - self._stop_sent > STOP_WAIT_S
                if overdue:
                    child.process.kill()
                train_worker.wait_run(child, WAIT_S)
        finally:
            if child.returncode is None:  # this actor is being torn down: no run outlives it
                child.stop(grace_s=10.0)
            with self._lock:
                self._child = self._key = None
        return child.returncode, child.last_error()

    def stop(self, key: str, signum: int) -> None:
        """The run `key` stops with `signum`, now if it runs, else as soon as it starts; once (a second signal would
        skip its checkpoint)."""
        with self._lock:
            self._stops.setdefault(key, signum)
            self._send_stop()

    def _send_stop(self) -> None:
        signum = self._stops.get(self._key) if self._key is not None else None
        if signum and self._stop_sent is None and self._child is not None and self._child.send(signum):
            self._stop_sent = time.monotonic()

    def evaluations(self) -> list[tuple[int, float]]:
        """(env steps, average return) of the running run's evaluations written since the last call."""
        with self._lock:
            path, start = self._eval_csv, self._sent_rows
        if path is None:
            return []
        pairs, reported = new_evaluations(path, start)
        with self._lock:
            if self._eval_csv == path:
                self._sent_rows = reported
        return pairs

    def close(self) -> None:
        """Ends the idle train process (and drops its log)."""
        self.slots.close()
        shutil.rmtree(self.slots.log_dir, ignore_errors=True)


def new_evaluations(eval_csv: str, reported: int) -> tuple[list, int]:
    """(env steps, average return) of a run's evaluations (its eval_metrics.csv) after the first `reported` rows,
    and how many rows are reported with them (a row being written is read next time)."""
    pairs = []
    for row in read_csv(eval_csv)[reported:]:
        if row.get("average_return") in (None, "") or row.get("env_steps") in (None, ""):
            break
        pairs.append((int(row["env_steps"]), float(row["average_return"])))
    return pairs, reported + len(pairs)


# ---------------------------------------------------------------------------- the node


def code_version() -> tuple:
    """(package version, git commit or None) of the dqn_cartpole this process imports."""
    from dqn_cartpole.run_folder.provenance import checkout_root, git_state
    from dqn_cartpole.version import __version__

    return __version__, git_state(checkout_root())[0]


class DifferentCode(Exception):
    """The worker's node runs other dqn_cartpole code than the driver (the run would not be the one asked for)."""


def check_same_code(code: tuple, node: dict) -> None:
    """Raises DifferentCode unless this node runs the driver's `code` (package version, git commit or None)."""
    mine = code_version()
    if mine[0] != code[0] or (mine[1] and code[1] and mine[1] != code[1]):
        raise DifferentCode(f"node {node['node_ip']} ({node['host']}) runs dqn_cartpole {_describe(mine)}, the driver "
                            f"{_describe(code)}: install the same version on every node")


def _describe(code: tuple) -> str:
    return f"{code[0]} (commit {code[1][:10]})" if code[1] else code[0]


def temp_root() -> str:
    root = os.path.join(tempfile.gettempdir(), TEMP_PREFIX)
    os.makedirs(root, exist_ok=True)
    return root


def clear_stale_folders() -> None:
    """Removes the folders of actors whose process is gone (an actor killed with its node or force-stopped cannot
    clean up after itself). A folder is named after its actor's pid."""
    import psutil

    root = temp_root()
    for name in os.listdir(root):
        pid = name.split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
