"""Where a run's wall seconds go: the time of each phase, from process start to the summary.

One phase runs at a time. A phase entered inside another pauses the outer one, so the phases'
seconds add up to the time this process has run when the summary is written (summary.json's
`phases`). Work done by another process at the same time (the video encoder) is kept apart, in
`parallel`, since it does not add to the user's wait.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Optional

# The phases of a run, in the order they first happen.
STARTUP = "start-up and imports"  # Python, the command line, the config check, TensorFlow and TF-Agents, the
# run folder and the plotter and renderer children
BUILD = "build"  # envs, agent, replay, drivers, logs (and a resumed run's checkpoint)
INITIAL_COLLECT = "initial collect"  # the random policy fills the replay (its first call traces the driver)
FIRST_EVALUATION = "first evaluation"  # iteration 0, which also traces the evaluation loop
FIRST_CHUNK = "tracing and XLA"  # the first compiled call: tracing, XLA compilation and its iterations
LOOP = "loop"  # the other compiled calls, and the Python between them
TRAIN_ROWS = "train rows"  # the train metrics rows (the Q-value probe)
EVALUATIONS = "evaluations"
SOLVE_CHECK = "solve check"
EXPORT = "policy export"
CHECKPOINTS = "checkpoints"
CLOSING = "closing"  # flushing the logs, releasing envs and servers
VIDEOS = "videos"  # this process's share: playing the episodes, then waiting for the renderer (a child process)
PLOTS = "plots"  # drawn by a child process while the videos render: this process waits for it
ORDER = (STARTUP, BUILD, INITIAL_COLLECT, FIRST_EVALUATION, FIRST_CHUNK, LOOP, TRAIN_ROWS, EVALUATIONS, SOLVE_CHECK,
         EXPORT, CHECKPOINTS, CLOSING, VIDEOS, PLOTS)
VIDEO_ENCODER = "video encoder (another process)"


class Phases:
    """Exclusive seconds per named phase of this process (a resumed run counts its own process only)."""

    def __init__(self, started_s_ago: float = 0.0):
        """`started_s_ago`: the seconds since the process started, charged to STARTUP."""
        self.seconds: dict[str, float] = {STARTUP: started_s_ago} if started_s_ago else {}
        self.parallel: dict[str, float] = {}
        self._stack: list[str] = []
        self._mark = time.perf_counter()

    def _charge(self) -> None:
        now = time.perf_counter()
        if self._stack:
            name = self._stack[-1]
            self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Charges the time inside the block to `name` (pausing the phase it interrupts)."""
        self._charge()
        self._stack.append(name)
        try:
            yield
        finally:
            self._charge()
            self._stack.pop()

    def timed(self, name: str, work: Callable[[], None]) -> Callable[[], None]:
        """`work`, charged to `name` whenever it runs."""
        def run() -> None:
            with self(name):
                work()

        return run

    def add_parallel(self, name: str, seconds: float) -> None:
        self.parallel[name] = self.parallel.get(name, 0.0) + seconds

    def as_dict(self) -> dict:
        """{"phases": {name: s}, in ORDER, then any others; "parallel": {name: s}}, to the millisecond."""
        self._charge()
        names = [n for n in ORDER if n in self.seconds] + [n for n in self.seconds if n not in ORDER]
        return {"phases": {n: round(self.seconds[n], 3) for n in names},
                "parallel": {n: round(s, 3) for n, s in self.parallel.items()}}


def measure(phases: Optional[Phases], name: str) -> contextlib.AbstractContextManager:
    """`phases(name)`, or nothing when there is no `Phases` (a role that does not report them)."""
    return contextlib.nullcontext() if phases is None else phases(name)

