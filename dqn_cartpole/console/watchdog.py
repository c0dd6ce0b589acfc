"""A stop signal seen at once, even while the main thread is blocked in C++, and a process that ends in time.

Python runs a signal handler only when the main thread next runs Python code: never while it waits
in a Reverb read inside a compiled TensorFlow call. `SignalWatchdog` asks the interpreter to write
every caught signal's number into a pipe (`signal.set_wakeup_fd`, done by its C-level handler,
whatever the main thread is doing) and reads that pipe on its own thread. On the first SIGINT or
SIGTERM it calls `on_signal(signum)` there (e.g. a learner cancels a blocked read), and if
the process is still alive `give_up_after_s` later, it writes one line on stderr and ends it with
`os._exit(128 + signum)`: the graceful path (a checkpoint) has had its time, and nothing it waits on
may keep the process alive. Handlers must be installed (`signal.signal`) for the signals to be caught.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

from dqn_cartpole.console.exit_status import STOP_SIGNALS, for_signal

log = logging.getLogger(__name__)


class SignalWatchdog:
    """Watches the stop signals from a thread of its own (see the module docstring). Main thread only."""

    def __init__(self, give_up_after_s: float, on_signal: Callable[[int], None]):
        self.give_up_after_s, self.on_signal = give_up_after_s, on_signal
        self.signum: Optional[int] = None
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._run, name="signal-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data:  # closed
                return
            for signum in data:
                if signum in STOP_SIGNALS and self.signum is None:
                    self._first(signum)

    def _first(self, signum: int) -> None:
        self.signum = signum
        threading.Thread(target=self._give_up_later, args=(signum,), name="signal-deadline", daemon=True).start()
        try:
            self.on_signal(signum)
        except Exception:  # pylint: disable=broad-except  # the deadline still holds
            log.debug("on_signal callback failed", exc_info=True)

    def _give_up_later(self, signum: int) -> None:
        """Ends the process `give_up_after_s` after the signal (a daemon thread: a process that ended first is
        not held back)."""
        time.sleep(self.give_up_after_s)
        name = signal.Signals(signum).name
        try:
            sys.stderr.write(f"error: still running {self.give_up_after_s:g} s after {name}; gave up waiting "
                             f"(exit status {for_signal(signum)})\n")
            sys.stderr.flush()
        finally:
            os._exit(for_signal(signum))  # pylint: disable=protected-access

    def close(self) -> None:
        """Stops watching (the deadline of a signal already seen still holds)."""
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._write_fd)  # the reader sees the end of the pipe
        self._thread.join(timeout=1.0)
        os.close(self._read_fd)
