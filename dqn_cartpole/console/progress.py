"""The console's progress line: a tqdm bar on a terminal or in a notebook, one plain line per state elsewhere.

While training it shows the iterations, the latest loss and average return, and the speed. After
training it follows the artifact phase: each stage (playing the video episodes, drawing the
plots, waiting for the videos) and the videos' frames as the renderer reports them, so no second
passes without the user seeing what the run does. On a terminal tqdm redraws one line; elsewhere
(CI, pipes, log files) a line is printed when the state changes, at most every `plain_every_s`
seconds for the training line, so logs stay readable. In a Jupyter notebook (`notebook=True`: the Python API's
runs) the bar is `tqdm.auto`'s: a widget where ipywidgets is installed, else a text bar the notebook redraws.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from typing import Optional, TextIO

from tqdm import tqdm

TRAIN_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} it [{elapsed}, {rate_fmt}{postfix}]"
PLAIN_TRAIN_FORMAT = "{n_fmt}/{total_fmt} it [{elapsed}, {rate_fmt}{postfix}]"
ARTIFACTS_FORMAT = "{desc} [{elapsed}]"


class Progress:
    """Progress of a run of `total` iterations, then of its artifacts. `message` prints above the line."""

    def __init__(self, total: int, stream: Optional[TextIO] = None, enabled: bool = True,
                 plain_every_s: float = 5.0, notebook: bool = False):
        self.total, self.stream, self.enabled = total, stream or sys.stderr, enabled
        self.notebook = notebook
        self.tty = notebook or bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.time()
        self.plain_every_s, self._last_plain = plain_every_s, 0.0
        self._last_values: Optional[tuple] = None  # the plain training line printed last: (iteration, postfix)
        self._pending: Optional[tuple] = None  # the newest training state: (iteration, postfix)
        self._evaluation: Optional[tuple] = None  # the latest evaluation: (average return, iteration evaluated)
        self._bar: Optional[tqdm] = None  # the training bar, then the artifacts' (a terminal only)
        self._stage: Optional[str] = None  # the artifact phase's current stage
        self._frames = (0, 0)  # the videos' frames rendered, and in all
        self._last_frames_line = 0.0
        self._lock = threading.Lock()  # the renderer's progress arrives on another thread

    # -- training
    def update(self, iteration: int, loss: Optional[float], average_return: Optional[float]) -> None:
        """The training line at `iteration`: the latest loss and average return; once an evaluation came in
        (`evaluated`), its return and the iteration whose weights it evaluated."""
        if not self.enabled or self._stage is not None:
            return
        with self._lock:
            self._set(iteration, loss, average_return)
            if not self.tty and (time.time() - self._last_plain >= self.plain_every_s or iteration >= self.total):
                self._write_pending()

    def evaluated(self, iteration: int, loss: Optional[float], average_return: float, evaluated_at: int) -> None:
        """An evaluation came in at `iteration`, of the weights of iteration `evaluated_at` (one beside the training
        is taken in at a later iteration: without that iteration its return would read as the current weights').
        A terminal's bar shows it at once; elsewhere the next training line says it (due whatever the interval),
        or the next message, or the end of the training: one iteration is never printed twice when two
        evaluations come in at it (the one beside the training, then the one of these weights)."""
        if not self.enabled or self._stage is not None:
            return
        with self._lock:
            self._evaluation = (average_return, evaluated_at)
            self._set(iteration, loss, average_return)
            self._last_plain = 0.0

    def _set(self, iteration: int, loss: Optional[float], average_return: Optional[float]) -> None:
        """The newest training state; a terminal's bar is redrawn with it."""
        evaluated_at = None
        if self._evaluation is not None and self._evaluation[0] == average_return:
            evaluated_at = self._evaluation[1]
        self._pending = (iteration, self._postfix(loss, average_return, evaluated_at))
        if self.tty:
            bar = self._bar or self._new_bar(total=self.total, initial=iteration, unit="it", bar_format=TRAIN_FORMAT)
            bar.n = iteration
            bar.set_postfix_str(self._pending[1], refresh=False)
            bar.refresh()

    @staticmethod
    def _postfix(loss: Optional[float], average_return: Optional[float], evaluated_at: Optional[int]) -> str:
        loss_text = f"{loss:.4g}" if loss is not None else "-"
        return_text = f"{average_return:.1f}" if average_return is not None else "-"
        at = f" (it {evaluated_at})" if average_return is not None and evaluated_at is not None else ""
        return f"loss {loss_text}, avg return {return_text}{at}"

    def _write_pending(self) -> None:
        """The plain training line of the newest state, unless that line was already printed."""
        if self._pending is None or self._pending == self._last_values:
            return
        iteration, postfix = self._pending
        self._write(tqdm.format_meter(iteration, self.total, time.time() - self.start, unit="it",
                                      bar_format=PLAIN_TRAIN_FORMAT, postfix=postfix))
        self._last_plain = time.time()
        self._last_values = self._pending

    # -- the artifact phase
    def stage(self, text: str) -> None:
        """A new stage of the artifact phase (the training line, if any, is left as it was)."""
        if not self.enabled:
            return
        with self._lock:
            if self._stage is None:
                self._close_bar()
                if not self.tty:
                    self._write_pending()  # the training's last state, evaluations in, before the artifacts
                if self.tty:
                    self._new_bar(total=None, bar_format=ARTIFACTS_FORMAT)
            self._stage = text
            if self.tty:
                self._redraw_artifacts()
            else:
                self._write(f"{text} [{time.time() - self.start:.1f} s]")

    def artifact_progress(self, done: int, total: int) -> None:
        """The videos' frames: `done` of `total` rendered (called from the thread that follows the renderer)."""
        if not self.enabled:
            return
        with self._lock:
            self._frames = (done, total)
            if self.tty and self._bar is not None:
                self._redraw_artifacts()
            elif not self.tty and (done >= total or time.time() - self._last_frames_line >= self.plain_every_s):
                self._write(f"  videos: {done}/{total} frames rendered [{time.time() - self.start:.1f} s]")
                self._last_frames_line = time.time()

    def _redraw_artifacts(self) -> None:
        done, total = self._frames
        frames = f" | videos {done}/{total} frames" if total else ""
        self._bar.set_description_str(f"{self._stage}{frames}", refresh=True)

    # -- both
    def message(self, text: str) -> None:
        """Prints a line above the progress line."""
        with self._lock:
            if self._bar is not None:
                self._bar.clear()
            elif self._stage is None and not self.tty:
                self._write_pending()  # what led to the message (e.g. the evaluation that solved) comes first
            self._write(text)
            if self._bar is not None:
                self._bar.refresh()

    def close(self) -> None:
        with self._lock:
            if self.enabled and self._stage is None and not self.tty:
                self._write_pending()
            self._close_bar()

    def _new_bar(self, **kwargs) -> tqdm:
        if self.notebook:
            self._bar = notebook_bar_class()(file=self.stream, mininterval=0, leave=True, **kwargs)
            return self._bar
        # A terminal that reports no width (a pty nobody sized) would get an empty line: 100 columns then.
        width = {"dynamic_ncols": True} if terminal_columns(self.stream) else {"ncols": 100, "nrows": 20}
        self._bar = tqdm(file=self.stream, mininterval=0, leave=True, **width, **kwargs)
        return self._bar

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


def terminal_columns(stream: TextIO) -> int:
    """The width of the terminal `stream` writes to; 0 when it reports none."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


class PlainCounter:
    """A counter with tqdm's interface (`n`, `set_postfix_str`, `refresh`, `close`) for output that is no terminal:
    a plain line when the count or the postfix changes, at most every `every_s` seconds, and the last one at
    `close`, instead of tqdm's carriage-return redraws, which pile up on one line of a log."""

    def __init__(self, total: int, desc: str, stream: TextIO, every_s: float = 5.0):
        self.total, self.desc, self.stream, self.every_s = total, desc, stream, every_s
        self.n, self.postfix, self.start = 0, "", time.time()
        self._last_line_at = 0.0
        self._last_shown: Optional[tuple] = None

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text
        if refresh:
            self.refresh()

    def refresh(self, final: bool = False) -> None:
        state = (self.n, self.postfix)
        due = final or self.n >= self.total or time.time() - self._last_line_at >= self.every_s
        if state != self._last_shown and due:
            meter = tqdm.format_meter(self.n, self.total, time.time() - self.start, unit="it",
                                      bar_format=PLAIN_TRAIN_FORMAT, postfix=self.postfix)
            self.stream.write(f"{self.desc}: {meter}\n")
            self.stream.flush()
            self._last_line_at, self._last_shown = time.time(), state

    def close(self) -> None:
        self.refresh(final=True)


def counter(total: int, desc: str, enabled: bool = True, stream: Optional[TextIO] = None, **tqdm_options):
    """A progress counter of `total` iterations: tqdm's bar on a terminal, `PlainCounter`'s lines elsewhere (a log
    file, a pipe), nothing when not `enabled`. Set `n`, then `refresh()`; `close()` at the end."""
    stream = stream or sys.stderr
    if enabled and not bool(getattr(stream, "isatty", lambda: False)()):
        return PlainCounter(total, desc, stream)
    return tqdm(total=total, desc=desc, file=stream, disable=not enabled, **tqdm_options)


def notebook_bar_class() -> type:
    """`tqdm.auto`'s bar: a widget in Jupyter with ipywidgets, else the text bar (without tqdm's warning about
    ipywidgets, which the notebook's reader cannot act on mid-run)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm as auto_tqdm  # pylint: disable=import-outside-toplevel
    return auto_tqdm
