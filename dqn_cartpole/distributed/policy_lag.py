"""Policy lag: how many train steps behind the learner the weights that collected its batches were.

Each collector tags the items it writes with the train step of the weights it collects with
(their priority in the queue or the uniform table: `StreamWriters.tag_items`; the selectors ignore
it). The learner's sampler hands each item's tag back with the batch (`Replay.sampler(...,
with_tags=True)`: the learner-side buffer stores it next to the window, a server's table returns it
as `SampleInfo.priority`), and its compiled step returns, per iteration, the mean and max of (its
train step at the update - the collecting step) over the batch (`make_lagged_train_step`).
`IntervalLag` folds those into one value per log row.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from dqn_cartpole.training.loop import gradient_step, repeat_steps


def make_lagged_train_step(agent: Any, sample: Callable[[], Any], train_steps: int, jit_compile: bool) -> Callable:
    """`train_steps` gradient steps on samples that carry their tags, in one graph function.

    `sample()` returns (experience, each item's tag: the train step of the weights that collected it,
    [batch] or [batch, time]); the function returns [loss, mean, max] of the last batch's (train step at
    the update - tag), which a chunk hands on as its `extras`.
    """
    step = gradient_step(agent, jit_compile)

    def once() -> tf.Tensor:
        experience, collected_at = sample()
        lag = tf.cast(agent.train_step_counter, tf.float64) - tf.cast(collected_at, tf.float64)
        with tf.control_dependencies([lag]):  # the counter is read before the update increments it
            loss = step(experience)
        return tf.stack([loss, tf.cast(tf.reduce_mean(lag), tf.float32), tf.cast(tf.reduce_max(lag), tf.float32)])

    return repeat_steps(once, train_steps, tf.zeros([3]))


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

    def row(self, first_iteration: int, lags: Optional[np.ndarray]) -> dict:
        """`add`, as the train row's columns (the run state's `row_extras`)."""
        mean, maximum = self.add(first_iteration, lags)
        return {"policy_lag": mean, "policy_lag_max": maximum}
