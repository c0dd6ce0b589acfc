"""A dead launcher takes its roles with it: SIGTERM at once, SIGKILL after a grace period.

Each role gets SIGTERM when the launcher dies (PR_SET_PDEATHSIG, `processes.supervisor`), but a role stuck
where it never sees the signal would live on. So `train --topology local` also starts this small process
(no TensorFlow, not tied to the launcher's life). It reads its stdin, a pipe from the launcher:

* the launcher ends normally: it writes `done` first, and the reaper leaves;
* the pipe ends without `done` (the launcher was killed): every process that still holds the run's lock
  (RUN/run.lock, which the launcher's roles inherit) and was started by that launcher (its environment
  holds the launcher's `marker`: a `train --resume` started after the launcher's death never does) has
  `grace_s` to end; then it and its own children are killed, and the reaper leaves. The run's lock is then
  free.

Run as `python -m dqn_cartpole.distributed.reaper RUN_DIR GRACE_S LAUNCHER_PID`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from dqn_cartpole.processes.supervisor import child_env
from dqn_cartpole.run_folder.layout import LOCK_FILE
from dqn_cartpole.run_folder.lock import holders

DONE = "done"
LAUNCHER_ENV = "DQN_CARTPOLE_LAUNCHER"  # the pid of the launcher that started a role
GRACE_S = 10.0  # the rule every role keeps: it ends within 10 s of SIGTERM
POLL_S = 0.2


def start(run_dir: str, grace_s: float = GRACE_S) -> subprocess.Popen:
    """Starts the reaper of `run_dir`'s roles; `finish` it when the launcher ends normally."""
    return subprocess.Popen([sys.executable, "-m", "dqn_cartpole.distributed.reaper", run_dir, f"{grace_s:g}",
                             str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=child_env(), start_new_session=True)


def marker() -> dict:
    """The environment variable a launcher's roles get, which tells the reaper they are its to kill."""
    return {LAUNCHER_ENV: str(os.getpid())}


def started_by(pid: int, launcher_pid: int) -> bool:
    """Whether process `pid` was started by the launcher `launcher_pid` (its environment says so)."""
    try:
        return psutil.Process(pid).environ().get(LAUNCHER_ENV) == str(launcher_pid)
    except psutil.Error:  # ended, or another user's
        return False


def finish(reaper: subprocess.Popen) -> None:
    """The launcher's roles are stopped: the reaper leaves without touching anything."""
    try:
        reaper.communicate(f"{DONE}\n".encode(), timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        reaper.kill()
        reaper.wait()


def left_behind(run_dir: str, launcher_pid: int) -> list[psutil.Process]:
    """The roles of the launcher `launcher_pid` that still hold the run's lock, after its death."""
    found = []
    for pid, _ in holders(run_dir, (LOCK_FILE,)):
        if not started_by(pid, launcher_pid):
            continue
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
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
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main(argv: list) -> int:
    run_dir, grace_s, launcher_pid = argv[0], float(argv[1]), int(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the launcher's to handle
    if sys.stdin.readline().strip() == DONE:
        return 0
    reap(run_dir, launcher_pid, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
