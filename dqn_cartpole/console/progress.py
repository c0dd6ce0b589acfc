"""A one-line console progress bar with the latest loss and average return.

On a terminal it redraws one line; otherwise (CI, pipes) it prints a plain line at most every
few seconds, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    """Progress of a run of `total` iterations."""

    def __init__(self, total: int, stream: Optional[TextIO] = None, enabled: bool = True,
                 plain_every_s: float = 5.0):
        self.total, self.stream, self.enabled = total, stream or sys.stderr, enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.time()
        self.plain_every_s, self._last_plain = plain_every_s, 0.0
        self._drawn = False
        self._last_values: tuple = ()

    def update(self, iteration: int, loss: Optional[float], average_return: Optional[float],
               force: bool = False) -> None:
        if not self.enabled:
            return
        line = self._line(iteration, loss, average_return)
        if self.tty:
            self.stream.write("\r" + line + "\033[K")
            self._drawn = True
        elif (force or time.time() - self._last_plain >= self.plain_every_s or iteration >= self.total) \
                and (iteration, loss, average_return) != self._last_values:
            self.stream.write(line + "\n")
            self._last_plain = time.time()
            self._last_values = (iteration, loss, average_return)
        self.stream.flush()

    def _line(self, iteration: int, loss: Optional[float], average_return: Optional[float]) -> str:
        fraction = min(iteration / self.total, 1.0) if self.total else 1.0
        width = 24
        bar = "#" * int(fraction * width) + "-" * (width - int(fraction * width))
        elapsed = time.time() - self.start
        rate = iteration / elapsed if elapsed > 0 else 0.0
        loss_text = f"{loss:.4g}" if loss is not None else "-"
        return_text = f"{average_return:.1f}" if average_return is not None else "-"
        return (f"[{bar}] {iteration}/{self.total} it | loss {loss_text} | avg return {return_text} | "
                f"{rate:.0f} it/s | {elapsed:.1f} s")

    def message(self, text: str) -> None:
        """Prints a line above the bar."""
        if self._drawn:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
