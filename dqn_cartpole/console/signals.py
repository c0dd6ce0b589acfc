"""Ctrl-C and SIGTERM stop a run at the next step boundary instead of killing it mid-write.

The first SIGINT or SIGTERM only sets a flag; the training loop checks it between compiled
chunks (each a fraction of a second), then writes a checkpoint, the plots, the videos and the
policy, and exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM). A second
signal is not caught: it interrupts at once, and the last complete checkpoint is still there.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum: int) -> int:
    """The shell's convention: 128 + the signal number."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopRequest:
    """A context manager that turns the first SIGINT/SIGTERM into `self.signum`.

    Handlers can only be installed from the main thread; elsewhere this does nothing (and the
    process keeps Python's defaults).
    """

    def __init__(self) -> None:
        self.signum: Optional[int] = None
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
        if self.signum is not None:  # second signal: stop waiting
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
        sys.stderr.write(f"\n{signal_name(signum)} received: stopping at the next step boundary and saving a "
                         f"checkpoint (send {again} again to stop at once).\n")
        sys.stderr.flush()
