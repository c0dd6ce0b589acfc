"""The progress of a sweep or a study on the console: a tqdm bar on a terminal, plain lines elsewhere.

On a terminal the bar is redrawn in place and event lines (a run started, finished, lost or failed) print above
it. Anywhere else (a pipe, a log file, CI) nothing is redrawn: each event is a line, and the state (the bar's
count and its note) is a line when it changed, at most every `plain_every_s` seconds and once at the end, as
`train`'s progress does.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

PLAIN_EVERY_S = 10.0


class SweepProgress:
    """`update(n, note)` with n out of `total` `unit`s; `event(text)`; `close()`."""

    def __init__(self, desc: str, total: int, unit: str, enabled: bool = True, stream: Optional[TextIO] = None,
                 plain_every_s: float = PLAIN_EVERY_S) -> None:
        self.desc, self.total, self.unit, self.enabled = desc, total, unit, enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.plain_every_s = plain_every_s
        self.start = time.monotonic()
        self._bar = None
        self._state: tuple = ()
        self._written: tuple = ()
        self._written_at = float("-inf")
        if enabled and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True, smoothing=0.1)

    def update(self, n: int, note: str) -> None:
        self._state = (n, note)
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.n = n
            self._bar.set_postfix_str(note, refresh=False)
            self._bar.refresh()
        elif self._state != self._written and time.monotonic() - self._written_at >= self.plain_every_s:
            self._line()

    def event(self, text: str, always: bool = False) -> None:
        """A line above the bar (`always`: also when progress is off, e.g. a failure)."""
        if not (self.enabled or always):
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self._state and self._state != self._written:
            self._line()

    def _line(self) -> None:
        n, note = self._state
        elapsed = time.monotonic() - self.start
        self.stream.write(f"{self.desc}: {n}/{self.total} {self.unit} [{elapsed:.0f} s] {note}\n")
        self.stream.flush()
        self._written, self._written_at = self._state, time.monotonic()
