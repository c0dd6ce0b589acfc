"""Policy lag: how many train steps behind the learner the weights that collected its batches were.

Each collector tags the items it writes with the train step of the weights it collects with
(their uniform-table priority: `ReverbReplay.tag_items`; the uniform selector ignores it). The
learner's compiled step reads each sampled item's `SampleInfo.priority` back and returns, per
iteration, the mean and max of (its train step at the update - the collecting step) over the
batch (`loop.make_train_step`'s `tagged`). `IntervalLag` folds those into one value per log row.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np


def tagged_sampler(sample: Callable[[], Any]) -> Callable[[], tuple]:
    """(experience, SampleInfo) batches -> (experience, the collecting train step of each item)."""

    def experience_and_step() -> tuple:
        experience, info = sample()
        return experience, info.priority

    return experience_and_step


class IntervalLag:
    """The mean and max policy lag over the iterations since the last multiple of `log_interval`.

    Chunks never cross a multiple of the log interval, so a chunk starting on one opens a new
    interval; a row logged at its end covers exactly that interval's batches (the last gradient
    step of each iteration).
    """

    def __init__(self, log_interval: int):
        self.log_interval = log_interval
        self.means: list = []
        self.maxima: list = []

    def add(self, first_iteration: int, lags: Optional[np.ndarray]) -> tuple[Optional[float], Optional[float]]:
        """Takes a chunk's [size, 2] lags; returns the interval's (mean, max) so far."""
        if first_iteration % self.log_interval == 0:
            self.means, self.maxima = [], []
        if lags is not None and len(lags):
            self.means.extend(lags[:, 0].tolist())
            self.maxima.extend(lags[:, 1].tolist())
        if not self.means:
            return None, None
        return float(np.mean(self.means)), float(np.max(self.maxima))
