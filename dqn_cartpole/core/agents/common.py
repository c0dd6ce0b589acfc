"""What every value agent's module shares: the epsilon schedule and the train step (the episode-aware n-step
windows, global-norm clipping, no check_numerics).

TF-Agents' private names (`_get_epsilon`, `_q_network`, `_optimizer`, `_gradient_clipping`) are read here and in
the agents' own modules only.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib

from dqn_cartpole.config import AgentConfig
from dqn_cartpole.core.agents.n_step import n_step_transition


def epsilon_schedule(config: AgentConfig, train_step: tf.Variable) -> Callable[[], tf.Tensor]:
    """Epsilon falls linearly from `epsilon_start` to `epsilon_end`, then stays there.

    A callable of the train-step counter, so it resumes at the right place after a restore.
    """

    def epsilon() -> tf.Tensor:
        progress = tf.minimum(tf.cast(train_step, tf.float32) / float(config.epsilon_decay_steps), 1.0)
        return config.epsilon_start + (config.epsilon_end - config.epsilon_start) * progress

    return epsilon


class EpisodeWindowsTrainMixin:
    """Changes to a TF-Agents DQN-family agent that every agent here shares:

    * `n_step_transitions`: the episode-aware n-step rule (`n_step.n_step_transition`), which each
      agent's `_loss` applies to its windows (for every n including 1);
    * `gradient_clipping` clips the global norm of all gradients (TF-Agents clips each
      variable's gradient separately);
    * no `check_numerics` in the train step: a NaN or Inf loss is returned, and the training
      loop stops on it with the last good checkpoint instead of an error from inside the graph.
    """

    def n_step_transitions(self, experience: trajectory_lib.Trajectory) -> trajectory_lib.Transition:
        """A [B, n + 1] batch of windows as the loss sees them: (first step, action) -> (bootstrap step)."""
        if isinstance(experience, trajectory_lib.Trajectory):
            experience = n_step_transition(experience, self._gamma)
        return self._as_transition(experience)  # the library's validation and pruning of a Transition

    def train_loss(self, experience: trajectory_lib.Trajectory, weights: Any = None, training: bool = False) -> Any:
        """The loss a train step minimises (`agent.loss` would use gamma 1: the library's `_loss` default)."""
        return self._loss(experience, td_errors_loss_fn=self._td_errors_loss_fn, gamma=self._gamma,
                          reward_scale_factor=self._reward_scale_factor, weights=weights, training=training)

    def _train(self, experience, weights):
        variables = self._q_network.trainable_weights
        with tf.GradientTape() as tape:
            loss_info = self.train_loss(experience, weights, training=True)
        grads = tape.gradient(loss_info.loss, variables)
        if self._gradient_clipping is not None:
            grads, _ = tf.clip_by_global_norm(grads, self._gradient_clipping)
        self._optimizer.apply_gradients(list(zip(grads, variables)))
        self.train_step_counter.assign_add(1)
        self._update_target()
        return loss_info
