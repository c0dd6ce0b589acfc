"""The Q-network: a Sequential MLP as in the TF-Agents DQN tutorial."""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tf_agents.networks import sequential


def _hidden_layer(units: int) -> tf.keras.layers.Layer:
    return tf.keras.layers.Dense(
        units,
        activation=tf.keras.activations.relu,
        kernel_initializer=tf.keras.initializers.VarianceScaling(
            scale=2.0, mode="fan_in", distribution="truncated_normal"
        ),
    )


def build_q_network(fc_layer_params: Sequence[int], num_actions: int) -> sequential.Sequential:
    """Hidden ReLU layers, then one linear unit per action.

    The output layer starts with small weights and a constant bias so the initial Q-values are
    near-equal and slightly negative, as in the tutorial.
    """
    q_values = tf.keras.layers.Dense(
        num_actions,
        activation=None,
        kernel_initializer=tf.keras.initializers.RandomUniform(minval=-0.03, maxval=0.03),
        bias_initializer=tf.keras.initializers.Constant(-0.2),
    )
    return sequential.Sequential([_hidden_layer(n) for n in fc_layer_params] + [q_values])
