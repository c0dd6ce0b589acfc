"""The train step on prioritized replay (`replay.prioritized`), as the compiled loop runs it.

Per gradient step, in one graph: draw a `PrioritizedBatch` (p^alpha / sum p^alpha), weight each item's loss by
    w_i = (N P(i))^-beta / max_j w_j        (beta annealed from importance_exponent to 1)
take the agent's gradient step, then write the batch's new priorities back in one batched op:
    p_i = |n-step TD error_i| + epsilon     (dqn, double_dqn)
    p_i = cross-entropy_i + epsilon         (c51)
The write-back is an op of the same graph call, after the step (program order), so the next draw from a uniform
buffer sees it; a Reverb dataset has already drawn its prefetched batches (those see it one or two steps late).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from dqn_cartpole.config import Config, ReplayConfig
from dqn_cartpole.core.agents import PrioritizedAgent
from dqn_cartpole.errors import UserError
from dqn_cartpole.replay.base import Replay
from dqn_cartpole.replay.prioritized import PrioritizedBatch, beta_schedule, importance_weights
from dqn_cartpole.training.loop import repeat_steps


def check_agent(agent: Any, kind: str) -> None:
    """One line if the agent cannot train on prioritized replay (a registered kind without `item_priorities`)."""
    if not isinstance(agent, PrioritizedAgent):
        raise UserError(f"replay.prioritized: agent.kind {kind} has no per-item priorities (item_priorities); use "
                        f"dqn, double_dqn or c51, or set replay.prioritized: false")


def prioritized_update(agent: Any, replay: Replay, config: ReplayConfig,
                       jit_compile: bool = False) -> Callable[[PrioritizedBatch], tf.Tensor]:
    """batch -> [the loss of one importance-weighted gradient step, whose new priorities are written back; the batch's
    smallest importance weight (the largest is 1); the mean and the largest of the priorities written]."""
    def weighted_step(items: Any, weights: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        loss_info = agent.train(items, weights)
        return loss_info.loss, agent.item_priorities(loss_info)

    train = tf.function(weighted_step, jit_compile=jit_compile, autograph=False)

    def update(batch: PrioritizedBatch) -> tf.Tensor:
        beta = beta_schedule(config, agent.train_step_counter)  # the step about to be taken
        weights = importance_weights(batch.probabilities, batch.table_size, beta)
        loss, priorities = train(batch.items, weights)
        priorities = priorities + config.priority_epsilon
        written = replay.update_priorities(batch.keys, priorities)
        with tf.control_dependencies([written]):
            return tf.stack([loss, tf.reduce_min(weights), tf.reduce_mean(priorities), tf.reduce_max(priorities)])

    return update


def make_prioritized_train_step(agent: Any, replay: Replay, config: ReplayConfig, batch_size: int, train_steps: int,
                                jit_compile: bool) -> Callable[[], tf.Tensor]:
    """`loop.make_train_step` on prioritized replay: `train_steps` such steps in one graph, returning the last loss."""
    sample = replay.prioritized_sampler(batch_size, agent.window_length)
    update = prioritized_update(agent, replay, config, jit_compile)
    return repeat_steps(lambda: update(sample()), train_steps, tf.zeros([4]))


def train_step_for(config: Config, agent: Any, replay: Replay) -> Callable[[], tf.Tensor]:
    """A run's prioritized train step (one process or a learner): the agent checked (`check_agent`), then
    `make_prioritized_train_step` with the run's batch, steps per iteration and compilation."""
    check_agent(agent, config.agent.kind)
    training = config.training
    return make_prioritized_train_step(agent, replay, config.replay, training.batch_size,
                                       training.train_steps_per_iteration, training.jit_compile)


class IntervalPriorities:
    """The train row's view of the priorities over the iterations since the last multiple of `log_interval` (each
    iteration's last batch): the smallest importance weight, and the mean and the largest priority written.

    Chunks never cross a multiple of the log interval, so a chunk starting on one opens a new interval.
    """

    COLUMNS = ("importance_weight_min", "priority_mean", "priority_max")

    def __init__(self, log_interval: int):
        self.log_interval = log_interval
        self.rows: list = []

    def row(self, first_iteration: int, extras: Any) -> dict:
        """Takes a chunk's [size, 3] extras (`prioritized_update`'s after the loss); returns the interval's columns."""
        if first_iteration % self.log_interval == 0:
            self.rows = []
        if extras is not None and len(extras):
            self.rows.extend(np.asarray(extras).tolist())
        if not self.rows:
            return dict.fromkeys(self.COLUMNS)
        values = np.asarray(self.rows)
        return dict(zip(self.COLUMNS, (float(values[:, 0].min()), float(values[:, 1].mean()),
                                       float(values[:, 2].max()))))
