"""One process at a time per run folder: an exclusive `flock` on RUN/run.lock, held until exit.

The kernel drops the lock when the process ends however it ends (even on SIGKILL), so a
crashed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from typing import IO

from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder.layout import LOCK_FILE


def lock_run(run_dir: str) -> IO:
    """Locks `run_dir` for this process; keep the returned file open as long as the run lives.

    Raises UserError naming the other process when the folder is already in use.
    """
    path = os.path.join(run_dir, LOCK_FILE)
    handle = open(path, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise UserError(f"{run_dir}: in use by another dqn_cartpole process (pid {holder}); wait for it to end "
                        f"or stop it first") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
