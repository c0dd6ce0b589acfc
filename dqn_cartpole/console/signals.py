"""Ctrl-C and SIGTERM stop a run at the next step boundary instead of killing it mid-write.

The first SIGINT or SIGTERM only sets a flag; the training loop checks it between compiled
chunks (each a fraction of a second), then writes a checkpoint, the plots, the videos and the
policy, and exits with `exit_status.for_signal` (130 for SIGINT, 143 for SIGTERM). A second
signal is not caught: it interrupts at once, and the last complete checkpoint is still there.

A command that supervises child runs (sweep, tune) keeps waiting instead: its children save
their checkpoints, and it must not leave them behind (`second_signal_interrupts=False`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Optional

from dqn_cartpole.console.exit_status import STOP_SIGNALS

STOP_AT_STEP = "stopping at the next step boundary and saving a checkpoint"
STOP_CHILDREN = "stopping every run at its next step and saving checkpoints..."


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopRequest:
    """A context manager that turns the first SIGINT/SIGTERM into `self.signum`, with one line on stderr.

    Handlers can only be installed from the main thread; elsewhere this does nothing (and the
    process keeps Python's defaults).
    """

    def __init__(self, message: str = STOP_AT_STEP, second_signal_interrupts: bool = True) -> None:
        self.signum: Optional[int] = None
        self.message, self.second_signal_interrupts = message, second_signal_interrupts
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, _frame) -> None:
        if self.signum is None:
            self.signum = signum
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
