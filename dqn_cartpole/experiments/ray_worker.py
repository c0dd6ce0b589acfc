"""One run on a Ray worker: what the driver sends (`RunJob`), what comes back (`RunOutcome`), and the task between.

The task (`run_on_worker`) makes a temporary folder on its node, writes the config there, unpacks the run folder
it is to resume (if any), executes the run, and returns the run folder as bytes with its log and exit status. It
never touches the driver's files: nothing is shared but Ray's object store. While the run trains it asks the
driver's `Board` every second whether to stop (the user's Ctrl-C, or the pruner) and, for a study, passes on the
run's new evaluations.

How one run executes is `execute_run`, and only there: in the Ray worker's long-lived train process
(`train_worker`), which imports TensorFlow once and trains the runs Ray gives this worker one after another, each
as a fresh process would; a run that would not train alike there is a fresh `python -m dqn_cartpole train` child.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

from dqn_cartpole.experiments import ray_transfer, train_worker
from dqn_cartpole.processes.commands import child_command, resume_argv, train_argv
from dqn_cartpole.run_folder.layout import RunLayout

POLL_S = 1.0  # how often a run asks the driver whether to stop (and passes on its evaluations)
STOP_WAIT_S = 120.0  # a stopped run writes its checkpoint, plots and videos (as a local sweep waits)
BOARD_TIMEOUT_S = 10.0
LOG_TAIL_BYTES = 256 * 1024  # of the run's console output, sent back for the driver's logs/<run>.log
TEMP_PREFIX = "dqn_cartpole-ray"


@dataclass(frozen=True)
class RunJob:
    """What the driver asks a worker to run; small (the config's text, not its path: the node may lack the file)."""

    key: str  # unique in the command: a sweep member's name, a trial's number (and seed)
    folder_name: str  # the run folder's name, e.g. "learning_rate=1e-3__s0" or "s3"
    config_name: str  # the config file's name, e.g. "default.yaml"
    config_text: str
    overrides: tuple
    resume: bool = False  # continue the run folder sent with the job (`train --resume`)
    report_evaluations: bool = False  # pass the run's evaluations to the driver (a study's pruner)
    code: tuple = ()  # (package version, git commit or None) of the driver: a node must run the same code
    reuse: bool = True  # may train in the worker's reused train process (False: a fresh process, as tune's seconds)


@dataclass
class RunOutcome:
    """What came back from one run: its exit status, its folder as bytes, where it ran and what that cost."""

    key: str
    status: Optional[int]
    last_error: str
    log_text: str
    folder: bytes  # the run folder, packed (b"" when the run never made one)
    written_at: str  # the folder's path on the worker (summary.json's paths start with it)
    node: dict = field(default_factory=dict)  # node_id, ip, host
    seconds: dict = field(default_factory=dict)  # run, pack (on the worker)


# ---------------------------------------------------------------------------- the task


def run_on_worker(job: RunJob, attempt: int, resume_folder: Optional[bytes], board) -> RunOutcome:
    """The Ray task: one run in a temporary folder of this node, returned as bytes."""
    node = node_info()
    check_same_code(job, node)
    clear_stale_folders()
    work = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=temp_root())
    try:
        board.started.remote(job.key, attempt, node)
        run_dir = os.path.join(work, job.folder_name)
        if job.resume:
            ray_transfer.unpack(resume_folder or b"", run_dir)
            argv = resume_argv(run_dir, "--quiet")
        else:
            config = os.path.join(work, "config", job.config_name)
            os.makedirs(os.path.dirname(config))
            with open(config, "w", encoding="utf-8") as handle:
                handle.write(job.config_text)
            argv = train_argv(config, list(job.overrides), run_dir)
        log_path = os.path.join(work, "run.log")
        started = time.monotonic()
        status, last_error = execute_run(argv, run_dir, log_path, Watch(board, job, attempt, run_dir), job.reuse)
        run_s, packed = time.monotonic() - started, time.monotonic()
        folder = ray_transfer.pack(run_dir) if os.path.isdir(run_dir) else b""
        return RunOutcome(job.key, status, last_error, _tail(log_path), folder, run_dir, node,
                          {"run": run_s, "pack": time.monotonic() - packed})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def execute_run(argv: list[str], run_dir: str, log_path: str, watch: "Watch",
                reuse: bool = True) -> tuple[Optional[int], str]:
    """How one run executes on a worker: `python -m dqn_cartpole ARGV` (its output in `log_path`) in this Ray
    worker's reused train process (`train_worker`: TensorFlow imported once for many runs; Ray keeps its worker
    process, and with it the train process, from task to task), or a fresh child when the run would not train alike
    there; stopped once with the signal the driver asks for. Returns (exit status, last error line)."""
    with _sigint_deliverable():
        child = _SLOTS.start(run_dir, child_command(argv), log_path, reuse=reuse)
    stop_sent: Optional[float] = None
    try:
        while child.returncode is None:
            train_worker.wait_run(child, watch.poll_s)
            signum = watch.poll()
            if signum and stop_sent is None and child.send(signum):  # once: a second signal skips the checkpoint
                stop_sent = time.monotonic()
            if stop_sent is not None and time.monotonic() - stop_sent > STOP_WAIT_S:
                child.process.kill()
    finally:
        if child.returncode is None:  # this task is being torn down: no run outlives it
            child.stop(grace_s=10.0)
    watch.close()  # the run's last evaluations
    return child.returncode, child.last_error()


# This Ray worker process's train process, kept from one task to the next (Ray runs a worker's tasks one at a time).
_SLOTS = train_worker.WorkerSlots(1, os.path.join(tempfile.gettempdir(), TEMP_PREFIX + "-workers"))


@contextlib.contextmanager
def _sigint_deliverable() -> Iterator[None]:
    """Ray's worker processes block SIGINT, and a child inherits the mask: unblocked while the child starts, so the
    driver's Ctrl-C reaches the run as a local sweep's does (it saves a checkpoint and exits 130)."""
    previous = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Watch:
    """The run's line to the driver: new evaluations out, the stop signal (if any) back, every `poll_s`.

    Never a blocking `ray.get`: a task blocked in `ray.get` or `ray.wait` lends its CPU back to Ray, which may start
    another run on the node meanwhile. Each poll is an actor call whose answer is collected (a future) at the next.
    """

    def __init__(self, board, job: RunJob, attempt: int, run_dir: str, poll_s: float = POLL_S) -> None:
        self.board, self.job, self.attempt, self.poll_s = board, job, attempt, poll_s
        self.eval_csv = RunLayout(run_dir).eval_metrics
        self.sent_rows = 0
        self.signum: Optional[int] = None
        self._pending = None  # (future of the board's answer, rows it carried)

    def poll(self, wait_s: float = 0.0) -> Optional[int]:
        """Collects the last poll's answer (waiting up to `wait_s` for it) and sends the next; returns the signal the
        driver asked for, if any."""
        if self._pending is not None:
            future, rows = self._pending
            try:
                answer = future.result(timeout=wait_s)
            except concurrent.futures.TimeoutError:
                return self.signum  # the board is busy: ask again when it answered
            except Exception:  # pylint: disable=broad-except  # the driver is gone: Ray ends this task with it
                answer, rows = None, 0
            self._pending = None
            self.sent_rows += rows
            self.signum = self.signum or answer
        rows = self._new_evaluations() if self.job.report_evaluations else []
        self._pending = (self.board.poll.remote(self.job.key, self.attempt, rows).future(), len(rows))
        return self.signum

    def close(self) -> None:
        """Sends the run's last evaluations and waits (a little) until the board has them."""
        self.poll(wait_s=BOARD_TIMEOUT_S)
        self.poll(wait_s=BOARD_TIMEOUT_S)

    def _new_evaluations(self) -> list[tuple[int, float]]:
        """(env steps, average return) of the evaluations written since the last poll."""
        from dqn_cartpole.run_folder.csv_files import read_csv

        pairs = []
        for row in read_csv(self.eval_csv)[self.sent_rows:]:
            if row.get("average_return") in (None, "") or row.get("env_steps") in (None, ""):
                break  # a row being written: read it next time
            pairs.append((int(row["env_steps"]), float(row["average_return"])))
        return pairs


# ---------------------------------------------------------------------------- the node


def node_info() -> dict:
    import ray  # pylint: disable=import-outside-toplevel

    return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname()}


def code_version() -> tuple:
    """(package version, git commit or None) of the dqn_cartpole this process imports."""
    from dqn_cartpole.run_folder.provenance import checkout_root, git_state
    from dqn_cartpole.version import __version__

    return __version__, git_state(checkout_root())[0]


class DifferentCode(Exception):
    """The worker's node runs other dqn_cartpole code than the driver (the run would not be the one asked for)."""


def check_same_code(job: RunJob, node: dict) -> None:
    if not job.code:
        return
    mine = code_version()
    if mine[0] != job.code[0] or (mine[1] and job.code[1] and mine[1] != job.code[1]):
        raise DifferentCode(f"node {node['ip']} ({node['host']}) runs dqn_cartpole {_describe(mine)}, the driver "
                            f"{_describe(job.code)}: install the same version on every node")


def _describe(code: tuple) -> str:
    return f"{code[0]} (commit {code[1][:10]})" if code[1] else code[0]


def temp_root() -> str:
    root = os.path.join(tempfile.gettempdir(), TEMP_PREFIX)
    os.makedirs(root, exist_ok=True)
    return root


def clear_stale_folders() -> None:
    """Removes the folders of tasks whose worker process is gone (a task force-cancelled or killed with its worker
    cannot clean up after itself). A folder is named after its worker's pid."""
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
