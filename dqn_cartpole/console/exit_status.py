"""Every exit status of `python -m dqn_cartpole`, and the one rule for a stop by a signal.

0: finished (or solved); 1: failed (a diverged run, a full disk, a role that died); 2: bad input
(one line on stderr); 3: a role crashed: an uncaught error, a learner whose data stopped coming
(`distributed.rate_limiter_timeout_ms`) or whose replay server stopped answering; the learner
checkpointed what it could, and the launcher reads 3 (or any status it does not know) as a crash,
naming the last checkpoint and the resume command; 128 + the signal number after SIGINT / SIGTERM
(130 / 143), the shell's convention.
"""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CRASHED = 3
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def for_signal(signum: int) -> int:
    """The exit status of a process stopped by `signum`: 128 + the signal number."""
    return 128 + int(signum)


def is_stop(status: int) -> bool:
    """Whether `status` says a run was stopped by SIGINT or SIGTERM (and can be continued)."""
    return status in {for_signal(signum) for signum in STOP_SIGNALS}
