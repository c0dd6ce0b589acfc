"""The DQN agent (or Double DQN) with its optimizer, loss, epsilon schedule and n-step targets.

TF-Agents' DqnAgent builds an n-step target from a window of `n_step + 1` steps by multiplying
the discounts along the window. That ends the return at a termination (discount 0), but not at
a time-limit truncation (a LAST step with discount 1): the window then runs on into the next
episode. This module's agent applies one rule instead, on every replay backend:

* a window's return stops at its first LAST step; rewards after it count as zero;
* it bootstraps from that LAST step's observation with gamma^k times the product of the
  discounts up to it (0 after a termination, so no bootstrap there);
* a window that starts at a LAST step is masked, as DqnAgent already does.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf
from tf_agents.agents import data_converter
from tf_agents.agents.dqn import dqn_agent
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step, time_step as ts, trajectory as trajectory_lib
from tf_agents.utils import common

from dqn_cartpole.config import AgentConfig, NetworkConfig
from dqn_cartpole.core.networks import build_q_network

TD_LOSSES = {"squared": common.element_wise_squared_loss, "huber": common.element_wise_huber_loss}


def epsilon_schedule(config: AgentConfig, train_step: tf.Variable) -> Callable[[], tf.Tensor]:
    """Epsilon falls linearly from `epsilon_start` to `epsilon_end`, then stays there.

    A callable of the train-step counter, so it resumes at the right place after a restore.
    """

    def epsilon() -> tf.Tensor:
        progress = tf.minimum(tf.cast(train_step, tf.float32) / float(config.epsilon_decay_steps), 1.0)
        return config.epsilon_start + (config.epsilon_end - config.epsilon_start) * progress

    return epsilon


def n_step_transition(trajectory: trajectory_lib.Trajectory, gamma: float) -> trajectory_lib.Transition:
    """A [B, n + 1] window of steps -> the n-step Transition whose return stops at the first LAST step.

    With k the position of the first LAST step in 1..n (n if there is none), the transition is
    (step 0, action 0) -> (step k) with
        next_time_step.reward   = sum_{i<k} gamma^i * d_0 * ... * d_{i-1} * r_i
        next_time_step.discount = gamma^(k-1) * d_0 * ... * d_{k-1}
    (DqnAgent multiplies the discount by gamma once more, as in `to_n_step_transition`).
    """
    n = int(trajectory.step_type.shape[1]) - 1
    rewards, discounts = trajectory.reward[:, :n], trajectory.discount[:, :n]
    # alive[:, i]: no LAST step at positions 1..i, so reward i still belongs to the window's episode.
    ended = tf.cast(tf.equal(trajectory.step_type[:, 1:n], ts.StepType.LAST), rewards.dtype)
    alive = tf.concat([tf.ones_like(rewards[:, :1]), tf.math.cumprod(1.0 - ended, axis=1)], axis=1)
    powers = tf.constant([gamma ** i for i in range(n)], dtype=rewards.dtype)
    before = tf.math.cumprod(discounts, axis=1, exclusive=True)  # d_0 * ... * d_{i-1}
    reward = tf.reduce_sum(alive * powers * before * rewards, axis=1)
    k = tf.cast(tf.reduce_sum(alive, axis=1), tf.int32)  # 1..n
    through = tf.math.cumprod(discounts, axis=1)  # d_0 * ... * d_i
    discount = tf.gather(powers, k - 1) * tf.gather(through, k - 1, axis=1, batch_dims=1)
    first = tf.nest.map_structure(lambda t: t[:, 0], trajectory)
    final = tf.nest.map_structure(lambda t: tf.gather(t, k, axis=1, batch_dims=1), trajectory)
    time_steps = ts.TimeStep(first.step_type, reward=tf.fill(tf.shape(first.reward), float("nan")),
                             discount=tf.fill(tf.shape(first.discount), float("nan")),
                             observation=first.observation)
    next_time_steps = ts.TimeStep(final.step_type, reward=reward, discount=discount, observation=final.observation)
    actions = policy_step.PolicyStep(action=first.action, state=(), info=first.policy_info)
    return trajectory_lib.Transition(time_steps, actions, next_time_steps)


class EpisodeNStepTransition(data_converter.AsNStepTransition):
    """TF-Agents' n-step converter, with the window's return stopped at its first LAST step."""

    def __call__(self, value: Any) -> trajectory_lib.Transition:
        if isinstance(value, trajectory_lib.Trajectory):
            value = n_step_transition(value, self._gamma)
        return super().__call__(value)  # a Transition is only validated and pruned


class _EpisodeTargetsMixin:
    """DqnAgent changes shared by the DQN and the Double DQN agent.

    * n-step windows stop at episode ends (`EpisodeNStepTransition`), for every n including 1;
    * `gradient_clipping` clips the global norm of all gradients (TF-Agents clips each
      variable's gradient separately);
    * no `check_numerics` in the train step: a NaN or Inf loss is returned, and the training
      loop stops on it with the last good checkpoint instead of an error from inside the graph.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._as_transition = EpisodeNStepTransition(self.data_context, gamma=self._gamma, n=self._n_step_update)

    def n_step_transitions(self, experience: trajectory_lib.Trajectory) -> trajectory_lib.Transition:
        """A [B, n + 1] batch of windows as the loss sees them: (first step, action) -> (bootstrap step)."""
        return self._as_transition(experience)

    def td_targets(self, experience: trajectory_lib.Trajectory) -> tuple[tf.Tensor, tf.Tensor]:
        """(valid mask, TD targets) of a [B, n + 1] batch, exactly as the loss computes them."""
        time_steps, actions, next_time_steps = self.n_step_transitions(experience)
        next_q = self._compute_next_q_values(next_time_steps, actions.info)
        targets = dqn_agent.compute_td_targets(next_q, rewards=self._reward_scale_factor * next_time_steps.reward,
                                               discounts=self._gamma * next_time_steps.discount)
        return tf.cast(~time_steps.is_last(), tf.float32), targets

    def train_loss(self, experience: trajectory_lib.Trajectory, weights: Any = None, training: bool = False) -> Any:
        """The loss a train step minimises (`agent.loss` would use gamma 1: DqnAgent's `_loss` default)."""
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


class DqnAgent(_EpisodeTargetsMixin, dqn_agent.DqnAgent):
    """DqnAgent with episode-aware n-step targets and global-norm clipping."""


class DdqnAgent(_EpisodeTargetsMixin, dqn_agent.DdqnAgent):
    """DdqnAgent with episode-aware n-step targets and global-norm clipping."""


class DqnFamilyAgent:
    """The `ValueAgent` of DQN and Double DQN: an adapter around TF-Agents' (Ddqn)DqnAgent above.

    TF-Agents' private names (`_get_epsilon`, `_q_network`, `_optimizer`) are read here only.
    """

    def __init__(self, agent: DqnAgent):
        self.tf_agent = agent
        self.policy, self.collect_policy = agent.policy, agent.collect_policy
        self.collect_data_spec, self.train_step_counter = agent.collect_data_spec, agent.train_step_counter
        self.time_step_spec, self.action_spec = agent.time_step_spec, agent.action_spec
        self.q_network = agent._q_network  # pylint: disable=protected-access
        self._build_optimizer()

    def train(self, experience: trajectory_lib.Trajectory) -> Any:
        return self.tf_agent.train(experience)

    def epsilon(self) -> float:
        """The collect policy's epsilon now (it follows the train-step counter)."""
        return float(self.collect_policy._get_epsilon())  # pylint: disable=protected-access  # tf-agents' own

    def set_learning_rate(self, learning_rate: float) -> None:
        """Changes the optimizer's learning rate (a resumed run may set a new one)."""
        self.tf_agent._optimizer.learning_rate = learning_rate  # pylint: disable=protected-access

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


def build_agent(
    agent_config: AgentConfig,
    network_config: NetworkConfig,
    time_step_spec: ts.TimeStep,
    action_spec: tensor_spec.BoundedTensorSpec,
) -> DqnFamilyAgent:
    """Builds and initialises a DqnAgent (or DdqnAgent) from the config, behind the `ValueAgent` interface."""
    num_actions = int(action_spec.maximum - action_spec.minimum + 1)
    train_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
    agent_class = DdqnAgent if agent_config.double_dqn else DqnAgent
    agent = agent_class(
        time_step_spec,
        action_spec,
        q_network=build_q_network(network_config.fc_layer_params, num_actions),
        # The legacy Adam runs a compiled train step ~35% faster than Keras 2.15's new one on CPU.
        optimizer=tf.keras.optimizers.legacy.Adam(learning_rate=agent_config.learning_rate),
        epsilon_greedy=epsilon_schedule(agent_config, train_step),
        n_step_update=agent_config.n_step,
        target_update_tau=agent_config.target_update_tau,
        target_update_period=agent_config.target_update_period,
        td_errors_loss_fn=TD_LOSSES[agent_config.td_loss],
        gamma=agent_config.gamma,
        gradient_clipping=agent_config.gradient_clipping,
        train_step_counter=train_step,
    )
    agent.initialize()
    return DqnFamilyAgent(agent)
