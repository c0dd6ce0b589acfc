"""A tiny value agent that lives outside the package, to prove the agent seam (`core.agents.protocol.ValueAgent`):
one module plus a config (`agent.kind: fake_q`, registered with `core.agents.registry.register`) is all a new
agent needs for a whole `train`.

It is not DQN in disguise. No TF-Agents agent class: a small TF-Agents network, TF-Agents' QPolicy wrapped greedy
and epsilon-greedy (a constant epsilon), and its own one-step Q-learning loss with no target network, on the first
transition of each window (the rest of the window is ignored). It has no NumPy twin (`numpy_greedy` is None), so
the run evaluates it with its TF policy, in line; it has no atoms (`return_distribution` is None).
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.networks import sequential
from tf_agents.policies import epsilon_greedy_policy, greedy_policy, q_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib

KIND = "fake_q"
EPSILON = 0.25  # constant: the train log's epsilon column shows whose epsilon() the run reads
CHECKPOINT_NAME = "fake_q_network"  # what its checkpoints hold (a test finds it in the run's checkpoint)


class FakeQAgent:
    """One-step Q-learning on a small network, behind the `ValueAgent` interface."""

    def __init__(self, agent_config: Any, time_step_spec: ts.TimeStep, action_spec: tensor_spec.BoundedTensorSpec):
        num_actions = int(action_spec.maximum - action_spec.minimum + 1)
        self.network = sequential.Sequential([tf.keras.layers.Dense(16, activation="relu"),
                                              tf.keras.layers.Dense(num_actions)])
        self.network.create_variables(time_step_spec.observation)
        self.optimizer = tf.keras.optimizers.legacy.Adam(learning_rate=agent_config.learning_rate)
        self.optimizer._create_all_weights(self.network.trainable_variables)  # pylint: disable=protected-access
        self.gamma = agent_config.gamma
        self.time_step_spec, self.action_spec = time_step_spec, action_spec
        self.train_step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
        q = q_policy.QPolicy(time_step_spec, action_spec, q_network=self.network)
        self.policy = greedy_policy.GreedyPolicy(q)
        self.collect_policy = epsilon_greedy_policy.EpsilonGreedyPolicy(q, epsilon=EPSILON)
        self.collect_data_spec = trajectory_lib.Trajectory(
            step_type=time_step_spec.step_type, observation=time_step_spec.observation, action=action_spec,
            policy_info=self.collect_policy.info_spec, next_step_type=time_step_spec.step_type,
            reward=time_step_spec.reward, discount=time_step_spec.discount)
        self.window_length = agent_config.n_step + 1  # what the run samples; only the first transition is used
        self.q_values = self.network
        self.minimum_action = int(action_spec.minimum)

    def numpy_greedy(self) -> None:
        return None

    def return_distribution(self, states: Any) -> None:
        del states
        return None

    def loss(self, experience: trajectory_lib.Trajectory) -> tf.Tensor:
        """Mean squared error to r + gamma d max_a Q(s', a) (the same network, held still), windows that start at a
        LAST step (across an episode boundary) left out."""
        states, next_states = experience.observation[:, 0], experience.observation[:, 1]
        actions = tf.cast(experience.action[:, 0], tf.int32) - self.minimum_action
        next_q, _ = self.network(next_states)
        target = tf.stop_gradient(experience.reward[:, 0] + self.gamma * experience.discount[:, 0]
                                  * tf.reduce_max(next_q, axis=-1))
        q, _ = self.network(states, training=True)
        chosen = tf.gather(q, actions, axis=1, batch_dims=1)
        valid = tf.cast(tf.logical_not(experience.step_type[:, 0] == ts.StepType.LAST), tf.float32)
        return tf.reduce_sum(valid * tf.square(target - chosen)) / tf.maximum(tf.reduce_sum(valid), 1.0)

    def train(self, experience: trajectory_lib.Trajectory) -> tf_agent.LossInfo:
        variables = self.network.trainable_variables
        with tf.GradientTape() as tape:
            loss = self.loss(experience)
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        self.train_step_counter.assign_add(1)
        return tf_agent.LossInfo(loss, ())

    def epsilon(self) -> float:
        return EPSILON

    def set_learning_rate(self, learning_rate: float) -> None:
        self.optimizer.learning_rate = learning_rate

    def set_target_updates(self, period=None, tau=None) -> None:
        self.target_updates = (period, tau)  # no target network here

    def checkpoint_objects(self) -> dict:
        return {CHECKPOINT_NAME: self.network, "fake_q_optimizer": self.optimizer,
                "fake_q_train_step": self.train_step_counter}


def build_fake_agent(agent_config: Any, network_config: Any, time_step_spec: ts.TimeStep,
                     action_spec: tensor_spec.BoundedTensorSpec) -> Optional[FakeQAgent]:
    """The registry's builder (`registry.register(KIND, build_fake_agent)`); the network's size is its own."""
    del network_config
    return FakeQAgent(agent_config, time_step_spec, action_spec)
