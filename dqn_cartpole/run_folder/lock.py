"""One run per folder, for the run's whole life: `flock` locks on RUN/run.lock and RUN/roles.lock.

* The process that owns the run (`train`, `train --topology local`'s launcher, a hand-started `learn`) holds
  run.lock exclusively (`lock_run`). The launcher passes that descriptor to every role it starts
  (`RunLock.fds`): a flock belongs to the open file description, so the lock lives while the launcher or
  any of its roles lives, also after a SIGKILL of the launcher.
* Every role of a distributed run (`collect`, `evaluate-live`, `replay-server`, supervised or started by
  hand) holds roles.lock shared (`join_run`). A `train` (new, `--overwrite` or `--resume`) takes it
  exclusively first, so it refuses to run beside a live role; then it keeps it shared, so its own roles can
  join. A hand-started `learn` joins too: it runs beside its hand-started roles, never beside another owner.

The kernel drops a lock when the last process holding it ends, however it ends (even on SIGKILL), so a
crashed run never leaves a stale lock behind: its files stay, unlocked, and the next run takes them. A run that
ends in its own time removes both files as its owner lets go of them (`RunLock.close`), once no other process
holds either; whoever locks a file checks it still is the one at its path (`_open_locked`), so a file removed
under a waiting process is never taken for the lock. A refusal names the processes that hold either file open
(pid and role, read from /proc), and is raised before anything in the folder is touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from typing import IO

import psutil

from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder.layout import LOCK_FILE, ROLES_LOCK_FILE

ROLE_COMMANDS = ("train", "learn", "collect", "evaluate-live", "replay-server", "sweep", "tune")


@dataclass
class RunLock:
    """The open lock files of one process; keep it as long as the run lives (closing drops this process's
    hold; children given `fds()` keep theirs)."""

    run_dir: str
    handles: tuple
    owner: bool = False  # `lock_run`'s: the run's owner removes the files when it lets go, if no one else holds them
    shared: bool = False  # `fds()` were handed to children, which may outlive this process

    def fds(self) -> tuple:
        """The descriptors a child keeps open (`subprocess.Popen(pass_fds=...)`) to hold the run's lock."""
        self.shared = True
        return tuple(handle.fileno() for handle in self.handles)

    def close(self) -> None:
        """Drops this process's hold; the owner first removes run.lock and roles.lock when nothing else holds
        them (`_remove_if_free`): a finished or stopped run's folder keeps no lock file."""
        if self.owner and not any(handle.closed for handle in self.handles):
            self._remove_if_free()
        for handle in self.handles:
            handle.close()

    def _remove_if_free(self) -> None:
        """Removes both files, still locked, when no role holds roles.lock and no child shares run.lock; else
        leaves them (the live processes keep the run's lock, as they would have)."""
        run, roles = self.handles
        try:
            fcntl.flock(roles.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # run.lock is ours already: exclusive
        except BlockingIOError:  # a role lives: the files stay
            return
        if self.shared and holders(self.run_dir, (LOCK_FILE,)):  # a child that kept our run.lock lives
            return
        for handle in (roles, run):  # roles.lock first: a `train` takes run.lock, then roles.lock
            if _is_at_path(handle):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(handle.name)


def lock_run(run_dir: str, beside_roles: bool = False) -> RunLock:
    """Locks `run_dir` for the process that owns the run: no other owner may live, nor (unless `beside_roles`:
    a hand-started `learn`) any role of the run.

    Raises a one-line UserError naming the live processes when the folder is in use.
    """
    run = _open_locked(run_dir, LOCK_FILE, fcntl.LOCK_EX)
    try:
        roles = _open_locked(run_dir, ROLES_LOCK_FILE, fcntl.LOCK_SH if beside_roles else fcntl.LOCK_EX)
    except UserError:
        run.close()
        raise
    fcntl.flock(roles.fileno(), fcntl.LOCK_SH)  # no role lives (or may); from now on this run's roles may join
    run.seek(0)
    run.truncate()
    run.write(f"{os.getpid()}\n")
    run.flush()
    return RunLock(run_dir, (run, roles), owner=True)


def join_run(run_dir: str) -> RunLock:
    """A role's hold on `run_dir`: shared with the run's other roles, refused while a `train` checks the folder
    or runs in one process. Creates nothing but the lock file in an existing folder."""
    return RunLock(run_dir, (_open_locked(run_dir, ROLES_LOCK_FILE, fcntl.LOCK_SH),))


OPEN_TRIES = 10  # a lock file removed between our open and our lock each time, by runs ending that fast: give up


def _open_locked(run_dir: str, name: str, how: int) -> IO:
    """`name` in `run_dir`, opened (created if missing) and locked `how` without waiting; a file that a run ending
    meanwhile removed (`RunLock.close`) is no lock: the one now at the path is opened instead."""
    path = os.path.join(run_dir, name)
    for _ in range(OPEN_TRIES):
        try:
            handle = open(path, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
        except OSError as exc:
            raise UserError(f"{run_dir}: cannot open {name}: {exc.strerror}") from None
        try:
            fcntl.flock(handle.fileno(), how | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise UserError(f"{run_dir}: in use by another dqn_cartpole process ({describe_holders(run_dir)}); wait "
                            f"for it to end or stop it first") from None
        if _is_at_path(handle):
            return handle
        handle.close()
    raise UserError(f"{run_dir}: {name} was removed {OPEN_TRIES} times while this process locked it; is another "
                    f"process starting and ending runs in it?")


def _is_at_path(handle: IO) -> bool:
    """Whether the open file `handle` is still the one at its path (not removed, nor replaced)."""
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(handle.name))
    except OSError:  # removed, or its folder is
        return False


def describe_holders(run_dir: str) -> str:
    """`pid 123 (collect --collector-id 0), pid 456 (learn)`: the other processes that hold the run's lock
    files open; the pid written in run.lock if none can be seen (another user's processes)."""
    found = holders(run_dir)
    if found:
        return ", ".join(f"pid {pid} ({role})" for pid, role in found)
    try:
        with open(os.path.join(run_dir, LOCK_FILE), encoding="utf-8") as handle:
            written = handle.read().strip()
    except OSError:
        written = ""
    return f"pid {written or 'unknown'}"


def holders(run_dir: str, names: tuple = (LOCK_FILE, ROLES_LOCK_FILE)) -> list[tuple[int, str]]:
    """(pid, role) of every other live process that has one of the run's lock files `names` open, by pid."""
    targets = {os.path.realpath(os.path.join(run_dir, name)) for name in names
               if os.path.exists(os.path.join(run_dir, name))}
    found = []
    for pid in psutil.pids():
        if pid != os.getpid() and targets and _has_open(pid, targets):
            found.append((pid, role_of(pid)))
    return found


def _has_open(pid: int, targets: set) -> bool:
    try:
        return any(opened.path in targets for opened in psutil.Process(pid).open_files())
    except psutil.Error:  # ended, or another user's
        return False


def role_of(pid: int) -> str:
    """`collect --collector-id 0`, `learn`, `train`...: the dqn_cartpole command a process runs."""
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return "ended"
    command = next((word for word in argv if word in ROLE_COMMANDS), None)
    if command is None:
        return os.path.basename(argv[0]) if argv and argv[0] else "unknown"
    if command == "collect" and "--collector-id" in argv[:-1]:
        return f"collect --collector-id {argv[argv.index('--collector-id') + 1]}"
    return command
