"""What every value agent's module shares: the epsilon schedule, the train step (the episode-aware n-step
windows, global-norm clipping, no check_numerics), and the adapter that holds `protocol.ValueAgent` around a
TF-Agents agent.

TF-Agents' private names (`_get_epsilon`, `_q_network`, `_optimizer`, `_gradient_clipping`) are read here and in
the agents' own modules only.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib
from tf_agents.utils import common as tf_agents_common

from dqn_cartpole.config import AgentConfig, NetworkConfig
from dqn_cartpole.core.agents.n_step import n_step_transition, window_length
from dqn_cartpole.core.agents.protocol import ReturnDistribution
from dqn_cartpole.core.policies import NumpyGreedy, NumpyQNetwork


def epsilon_schedule(config: AgentConfig, train_step: tf.Variable) -> Callable[[], tf.Tensor]:
    """Epsilon falls linearly from `epsilon_start` to `epsilon_end`, then stays there.

    A callable of the train-step counter, so it resumes at the right place after a restore.
    """

    def epsilon() -> tf.Tensor:
        progress = tf.minimum(tf.cast(train_step, tf.float32) / float(config.epsilon_decay_steps), 1.0)
        return config.epsilon_start + (config.epsilon_end - config.epsilon_start) * progress

    return epsilon


def agent_args(agent_config: AgentConfig, network_config: NetworkConfig) -> dict:
    """The keyword arguments every TF-Agents agent of the DQN family takes from the config, with a new train step
    counter. The collect policy's epsilon is the schedule, or 0 with noisy layers (they explore: `agents.noisy`)."""
    train_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
    return dict(
        # The legacy Adam runs a compiled train step ~35% faster than Keras 2.15's new one on CPU.
        optimizer=tf.keras.optimizers.legacy.Adam(learning_rate=agent_config.learning_rate),
        epsilon_greedy=0.0 if network_config.noisy else epsilon_schedule(agent_config, train_step),
        n_step_update=agent_config.n_step,
        target_update_tau=agent_config.target_update_tau,
        target_update_period=agent_config.target_update_period,
        gamma=agent_config.gamma,
        gradient_clipping=agent_config.gradient_clipping,
        train_step_counter=train_step,
    )


class TargetUpdates(tf.Module):
    """The target network's updates, as TF-Agents' `Periodically(soft_variables_update)` makes them (every `period`-th
    train step, `target = (1 - tau) * target + tau * online`), with `period` and `tau` in variables, so a run can
    change them as it goes (`set_target_updates`: at its solve, `training.final_policy.AfterSolve`). With tau 1 the
    update is the online weights exactly, the library's copy; non-trainable variables are always copied, as there.
    It takes the library's place as the agent's `_update_target` (its counter keeps the checkpoint's name)."""

    def __init__(self, online: Any, target: Any, period: int, tau: float):
        super().__init__(name="periodic_update_targets")
        self._pairs = list(zip(online.variables, target.variables))
        self._counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="counter")
        self.period = tf.Variable(period, dtype=tf.int64, trainable=False, name="period")
        self.tau = tf.Variable(tau, dtype=tf.float32, trainable=False, name="tau")

    def __call__(self) -> tf.Operation:
        remainder = tf.math.mod(self._counter.assign_add(1), self.period)
        return tf.cond(tf.equal(remainder, 0), self._update, tf.no_op)

    def _update(self) -> tf.Operation:
        return tf.group(*[target.assign((1 - self.tau) * target + self.tau * online) if target.trainable
                          else target.assign(online) for online, target in self._pairs])


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

    def _get_target_updater(self, tau=1.0, period=1):
        """The library's factory of the target updater, overridden: `TargetUpdates`, whose period and tau a run can
        change as it goes (`TfAgentAdapter.set_target_updates`)."""
        return TargetUpdates(self._q_network, self._target_q_network, period, tau)

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


class TfAgentAdapter:
    """A `ValueAgent` around a TF-Agents DQN-family agent; an agent module gives its `q_values` (expected Q-values)
    and its NumPy twin (`numpy_q`, None if it has none)."""

    def __init__(self, agent: Any, q_values: Any, numpy_q: Optional[NumpyQNetwork]):
        self.tf_agent = agent
        self.policy, self.collect_policy = agent.policy, agent.collect_policy
        self.collect_data_spec, self.train_step_counter = agent.collect_data_spec, agent.train_step_counter
        self.time_step_spec, self.action_spec = agent.time_step_spec, agent.action_spec
        self.window_length = window_length(agent._n_step_update)  # pylint: disable=protected-access
        self.q_network = agent._q_network  # pylint: disable=protected-access  # the online network, as built
        self.q_values = q_values
        self._numpy_q = numpy_q
        self._build_optimizer()

    def train(self, experience: trajectory_lib.Trajectory, weights: Any = None) -> Any:
        return self.tf_agent.train(experience, weights=weights)  # weights: prioritized replay's importance weights

    def actor_priorities(self, experience: trajectory_lib.Trajectory) -> tf.Tensor:
        """[B] each window's priority before epsilon as an Ape-X actor computes it (`protocol.PrioritizedAgent`):
        `item_priorities` of the loss, no train step, with the online network as its own target (an actor holds
        only the online weights it acts with; its target network is a copy of them, made here)."""
        target = self.tf_agent._target_q_network  # pylint: disable=protected-access
        copied = tf_agents_common.soft_variables_update(self.q_network.variables, target.variables, tau=1.0)
        with tf.control_dependencies([copied]):
            return self.item_priorities(self.tf_agent.train_loss(experience, training=False))

    def numpy_greedy(self) -> Optional[NumpyGreedy]:
        """The greedy action computed in NumPy from the live weights (None: only `policy` computes it)."""
        if self._numpy_q is None or tf.nest.is_nested(self.action_spec) or self.action_spec.shape.rank != 0:
            return None
        return NumpyGreedy(self._numpy_q, int(self.action_spec.minimum))

    def return_distribution(self, states: Any) -> Optional[ReturnDistribution]:
        """None: an agent that learns only the expected return (an agent module with atoms overrides this)."""
        del states
        return None

    def epsilon(self) -> float:
        """The collect policy's epsilon now (it follows the train-step counter)."""
        return float(self.collect_policy._get_epsilon())  # pylint: disable=protected-access  # tf-agents' own

    def set_learning_rate(self, learning_rate: float) -> None:
        """Changes the optimizer's learning rate (a resumed run may set a new one)."""
        self.tf_agent._optimizer.learning_rate = learning_rate  # pylint: disable=protected-access

    def set_target_updates(self, period: Optional[int] = None, tau: Optional[float] = None) -> None:
        """Changes the target network's update period and factor from now on (None: as it is)."""
        updates = self.tf_agent._update_target  # pylint: disable=protected-access
        if period is not None:
            updates.period.assign(period)
        if tau is not None:
            updates.tau.assign(tau)

    def checkpoint_objects(self) -> dict:
        """The TF-Agents agent tracks the Q-network, the target network, the optimizer and the train step."""
        return {"agent": self.tf_agent}

    def _build_optimizer(self) -> None:
        """Creates the optimizer's slots and hyperparameters now, so a checkpoint restore fills them at once.

        Without this the optimizer's variables are restored later, on their creation inside the
        first training step, and would overwrite a learning rate changed on resume.
        """
        optimizer = self.tf_agent._optimizer  # pylint: disable=protected-access
        variables = self.q_network.trainable_variables
        if hasattr(optimizer, "_create_all_weights"):  # Keras 2 legacy optimizers
            optimizer._create_all_weights(variables)  # pylint: disable=protected-access
        else:
            optimizer.build(variables)
