"""The returns of the collect policy's episodes, as a driver observer: what the epsilon-greedy agent gets while it
trains, next to the greedy evaluation's.

Each env copy's running return is kept in a variable; when an episode ends, its return is added
to a total and counted. `take()` reads the mean of the episodes that ended since the previous
call (one log interval) and starts the next interval. A few graph ops per step and no loop, so it
adds little to the compiled collect loop; the Python driver calls the same compiled update.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf


class EpisodeReturns:
    """Observer of a driver's trajectories ([num_envs] batches); see the module docstring. With `per_env` the total and
    count are kept per env copy (a population's copy k is seed k's env), read with `take_env(k)`."""

    def __init__(self, num_envs: int, per_env: bool = False):
        totals = [num_envs] if per_env else []
        self.running = tf.Variable(tf.zeros([num_envs], tf.float64), trainable=False)
        self.total = tf.Variable(tf.zeros(totals, tf.float64), trainable=False)
        self.count = tf.Variable(tf.zeros(totals, tf.int64), trainable=False)
        self._observe = tf.function(self._update, autograph=False)

    def _update(self, is_first: tf.Tensor, is_last: tf.Tensor, reward: tf.Tensor) -> None:
        running = tf.where(is_first, tf.zeros_like(self.running), self.running) + tf.cast(reward, tf.float64)
        self.running.assign(running)
        ended, episodes = tf.where(is_last, running, tf.zeros_like(running)), tf.cast(is_last, tf.int64)
        if self.total.shape.rank == 0:  # (read when traced) one total for all the copies
            ended, episodes = tf.reduce_sum(ended), tf.reduce_sum(episodes)
        self.total.assign_add(ended)
        self.count.assign_add(episodes)

    def __call__(self, trajectory: Any) -> Any:
        self._observe(trajectory.is_first(), trajectory.is_last(), trajectory.reward)
        return trajectory

    def take(self) -> tuple[Optional[float], int]:
        """(mean return, episodes) of the episodes that ended since the last call; (None, 0) if none did."""
        count = int(tf.reduce_sum(self.count).numpy())
        mean = float(tf.reduce_sum(self.total).numpy()) / count if count else None
        self.total.assign(tf.zeros_like(self.total))
        self.count.assign(tf.zeros_like(self.count))
        return mean, count

    def take_each(self) -> list[tuple[Optional[float], int]]:
        """`take`, for every env copy at once (`per_env`): each copy's (mean return, episodes)."""
        totals, counts = self.total.numpy(), self.count.numpy()
        self.total.assign(tf.zeros_like(self.total))
        self.count.assign(tf.zeros_like(self.count))
        return [(float(total) / int(count) if count else None, int(count)) for total, count in zip(totals, counts)]

    def take_env(self, index: int) -> tuple[Optional[float], int]:
        """`take`, for env copy `index` alone (`per_env`)."""
        count = int(self.count[index].numpy())
        mean = float(self.total[index].numpy()) / count if count else None
        self.total.scatter_nd_update([[index]], [0.0])
        self.count.scatter_nd_update([[index]], [0])
        return mean, count
