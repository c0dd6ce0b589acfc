"""The Q-network: a Sequential MLP as in the TF-Agents DQN tutorial; with `network.dueling`, its last layer is a
dueling head (Wang et al., 2016), for C51 the distributional one of Rainbow (Hessel et al., 2018)."""

from __future__ import annotations

from typing import Optional, Sequence

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


def _output_layer(units: int, bias: float = -0.2) -> tf.keras.layers.Dense:
    """A linear layer with small weights and a constant bias, so the initial outputs are near-equal (the tutorial's
    Q-value layer; TF-Agents' C51 logit layer is the same)."""
    return tf.keras.layers.Dense(
        units,
        activation=None,
        kernel_initializer=tf.keras.initializers.RandomUniform(minval=-0.03, maxval=0.03),
        bias_initializer=tf.keras.initializers.Constant(bias),
    )


def build_q_network(fc_layer_params: Sequence[int], num_actions: int, dueling: bool = False) -> sequential.Sequential:
    """Hidden ReLU layers, then one linear unit per action (or, `dueling`, a `DuelingHead`).

    The output layer starts with small weights and a constant bias so the initial Q-values are
    near-equal and slightly negative, as in the tutorial.
    """
    head = DuelingHead(num_actions) if dueling else _output_layer(num_actions)
    return sequential.Sequential([_hidden_layer(n) for n in fc_layer_params] + [head])


class DuelingHead(tf.keras.layers.Layer):
    """Q = V + A - mean_a A from the last hidden layer's features: a value stream V (one unit) and an advantage stream
    A (one unit per action), both linear. With `num_atoms` (C51) each stream gives logits per atom and
        logits[a, i] = V_i + A_{a,i} - mean_a' A_{a',i},
    Rainbow's distributional dueling head (the softmax over atoms comes after, in the agent)."""

    def __init__(self, num_actions: int, num_atoms: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        self.num_actions, self.num_atoms = num_actions, num_atoms
        per_action = num_atoms or 1
        self.value = _output_layer(per_action)  # the initial Q-values: -0.2, as the plain head's
        self.advantage = _output_layer(num_actions * per_action, bias=0.0)

    def call(self, features: tf.Tensor) -> tf.Tensor:
        value, advantage = self.value(features), self.advantage(features)
        if self.num_atoms is not None:
            value = tf.reshape(value, [-1, 1, self.num_atoms])
            advantage = tf.reshape(advantage, [-1, self.num_actions, self.num_atoms])
        return value + advantage - tf.reduce_mean(advantage, axis=1, keepdims=True)

    def get_config(self) -> dict:
        return dict(super().get_config(), num_actions=self.num_actions, num_atoms=self.num_atoms)


class DuelingCategoricalQNetwork(sequential.Sequential):
    """C51's network with a distributional dueling head: observations -> hidden ReLU layers -> [B, actions, atoms]
    logits (what TF-Agents' CategoricalQNetwork outputs, so CategoricalDqnAgent takes it as it is)."""

    def __init__(self, fc_layer_params: Sequence[int], num_actions: int, num_atoms: int,
                 input_spec: Optional[tf.TensorSpec] = None, name: Optional[str] = None):
        super().__init__([_hidden_layer(n) for n in fc_layer_params] + [DuelingHead(num_actions, num_atoms)],
                         input_spec=input_spec, name=name)
        self._num_atoms = num_atoms

    @property
    def num_atoms(self) -> int:
        return self._num_atoms

    def copy(self, **kwargs) -> "DuelingCategoricalQNetwork":
        """A new network of the same shape (fresh layers, no shared weights): the target network."""
        return type(self)(**dict(self._saved_kwargs, **kwargs))
