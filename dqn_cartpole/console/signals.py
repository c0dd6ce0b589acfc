"""Ctrl-C and SIGTERM stop a run at the next step boundary instead of killing it mid-write.

The first SIGINT or SIGTERM only sets a flag; the training loop checks it between compiled
chunks (each a fraction of a second), then writes a checkpoint, the plots, the videos and the
policy, and exits with `exit_status.for_signal` (130 for SIGINT, 143 for SIGTERM). A second
signal is not caught: it interrupts at once, and the last complete checkpoint is still there.

A command that supervises child runs (sweep, tune) keeps waiting instead: its children save
their checkpoints, and it must not leave them behind (`second_signal_interrupts=False`).

The distributed roles must end within 10 s of SIGTERM whatever the replay server does, also when their
main thread is blocked in a Reverb call (where no Python handler runs): they pass `give_up_after_s`
(ROLE_GIVE_UP_S), and a watchdog thread sees the signal at once, calls `when_signalled` callbacks, and
ends the process that long after the signal (`console.watchdog`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

from dqn_cartpole.console.exit_status import STOP_SIGNALS
from dqn_cartpole.console.watchdog import SignalWatchdog

STOP_AT_STEP = "stopping at the next step boundary and saving a checkpoint"
STOP_CHILDREN = "stopping every run at its next step and saving checkpoints..."
# A role still running this long after SIGINT/SIGTERM is ended (the rule: within 10 s, whatever the server does).
ROLE_GIVE_UP_S = 8.0
_stop_seen_at: Optional[float] = None  # time.monotonic() of a role's first stop signal in this process


def stop_seen_at() -> Optional[float]:
    """When a role's (a StopRequest with `give_up_after_s`) first stop signal came; None before. Calls to the
    replay server then wait only a little longer (`replay.deadlines`)."""
    return _stop_seen_at


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopRequest:
    """A context manager that turns the first SIGINT/SIGTERM into `self.signum`, with one line on stderr.

    Handlers can only be installed from the main thread; elsewhere this does nothing (and the
    process keeps Python's defaults). With `give_up_after_s`, a watchdog (see the module docstring).
    """

    def __init__(self, message: str = STOP_AT_STEP, second_signal_interrupts: bool = True,
                 give_up_after_s: Optional[float] = None) -> None:
        self.signum: Optional[int] = None
        self.message, self.second_signal_interrupts = message, second_signal_interrupts
        self.give_up_after_s = give_up_after_s
        self._previous: dict[int, object] = {}
        self._callbacks: list[Callable[[int], None]] = []
        self._watchdog: Optional[SignalWatchdog] = None
        self._handled = 0  # signals the Python handler has run for

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def when_signalled(self, callback: Callable[[int], None]) -> None:
        """Calls `callback(signum)` on the first stop signal, from the watchdog's thread, at once even while the
        main thread is blocked (with `give_up_after_s` only)."""
        self._callbacks.append(callback)

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            if self.give_up_after_s is not None:
                self._watchdog = SignalWatchdog(self.give_up_after_s, self._seen)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        self._restore()

    def _seen(self, signum: int) -> None:
        """The watchdog saw the signal (maybe before the main thread can run the handler): the request stands now."""
        global _stop_seen_at  # pylint: disable=global-statement
        _stop_seen_at = _stop_seen_at or time.monotonic()
        if self.signum is None:
            self.signum = signum
        for callback in self._callbacks:
            callback(signum)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, _frame) -> None:
        self._handled += 1
        if self._handled == 1:
            self.signum = self.signum or signum
            sys.stderr.write(f"\n{signal_name(signum)} received: {self.message}{self._again(signum)}\n")
            sys.stderr.flush()
        elif self.second_signal_interrupts:  # second signal: stop waiting
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _again(self, signum: int) -> str:
        if not self.second_signal_interrupts:
            return ""
        again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
        return f" (send {again} again to stop at once)."
