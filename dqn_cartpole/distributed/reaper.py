"""A dead launcher takes its roles with it: SIGTERM at once, SIGKILL after a grace period.

Each role gets SIGTERM when the launcher dies (PR_SET_PDEATHSIG, `processes.supervisor`), but a role stuck
where it never sees the signal would live on. So `train --topology local` also starts this small process
(no TensorFlow, not tied to the launcher's life: a `processes.child.WorkerChild`). The launcher sends it where to look,
and then:

* the launcher ends normally: it sends `done` and ends the reaper's input, and the reaper leaves;
* the input ends without `done` (the launcher was killed): every process that still holds the run's lock
  (RUN/run.lock, which the launcher's roles inherit) and was started by that launcher (its environment
  holds the launcher's `marker`: a `train --resume` started after the launcher's death never does) has
  `grace_s` to end; then it and its own children are killed, and the reaper leaves. The run's lock is then
  free.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass

import psutil

from dqn_cartpole.processes.child import WorkerChild, serve
from dqn_cartpole.run_folder.layout import LOCK_FILE
from dqn_cartpole.run_folder.lock import holders

DONE = "done"
LAUNCHER_ENV = "DQN_CARTPOLE_LAUNCHER"  # the pid of the launcher that started a role
GRACE_S = 10.0  # the rule every role keeps: it ends within 10 s of SIGTERM
POLL_S = 0.2


@dataclass(frozen=True)
class Watch:
    """The reaper's first message: the run whose roles it kills if the launcher dies, and the launcher."""

    run_dir: str
    grace_s: float
    launcher_pid: int


def start(run_dir: str, grace_s: float = GRACE_S) -> WorkerChild:
    """Starts the reaper of `run_dir`'s roles; `finish` it when the launcher ends normally."""
    reaper = WorkerChild(__name__, what="the reaper", label=run_dir)  # `ps` shows the run it guards
    reaper.send(Watch(run_dir, grace_s, os.getpid()))
    return reaper


def marker() -> dict:
    """The environment variable a launcher's roles get, which tells the reaper they are its to kill."""
    return {LAUNCHER_ENV: str(os.getpid())}


def started_by(pid: int, launcher_pid: int) -> bool:
    """Whether process `pid` was started by the launcher `launcher_pid` (its environment says so)."""
    try:
        return psutil.Process(pid).environ().get(LAUNCHER_ENV) == str(launcher_pid)
    except psutil.Error:  # ended, or another user's
        return False


def finish(reaper: WorkerChild) -> None:
    """The launcher's roles are stopped: the reaper leaves without touching anything."""
    reaper.send(DONE, end=True)
    reaper.close(timeout_s=5)


def left_behind(run_dir: str, launcher_pid: int) -> list[psutil.Process]:
    """The roles of the launcher `launcher_pid` that still hold the run's lock, after its death."""
    found = []
    for pid, _ in holders(run_dir, (LOCK_FILE,)):
        if started_by(pid, launcher_pid):
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(pid))
    return found


def reap(run_dir: str, launcher_pid: int, grace_s: float) -> None:
    """Waits up to `grace_s` for the roles left behind to end (they got SIGTERM from the kernel), then kills the
    rest with their children."""
    roles = left_behind(run_dir, launcher_pid)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(role) for role in roles):
        time.sleep(POLL_S)
    for role in roles:
        try:
            family = [*role.children(recursive=True), role]
        except psutil.Error:
            continue
        for process in family:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def serve_child() -> int:
    """The reaper's process: a `Watch`, then `done` or the end of its input without it (the launcher died)."""
    told: list = []

    def ignore_ctrl_c() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the launcher's to handle

    def reap_unless_done() -> None:
        if told and told[-1] != DONE:
            watch = told[0]
            reap(watch.run_dir, watch.launcher_pid, watch.grace_s)

    return serve(lambda message, reply: told.append(message), ignore_ctrl_c, at_end=reap_unless_done)
