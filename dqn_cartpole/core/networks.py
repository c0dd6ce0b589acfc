"""The Q-network: a Sequential MLP as in the TF-Agents DQN tutorial; with `network.dueling`, its last layer is a
dueling head (Wang et al., 2016), for C51 the distributional one of Rainbow (Hessel et al., 2018); with
`network.noisy`, every layer is a factorised Gaussian `NoisyDense` (Fortunato et al., 2018).

A noisy layer draws fresh noise each time it runs: per collect step (one forward pass per action) and per train
step. Inside `mean_weights()` (the greedy policy, the evaluation, the exported policy: `core.agents.noisy`) it runs
on its mean weights, so those are deterministic. The switch is read when the layer's ops are built (traced), so
each graph holds one kind of layer, whatever calls it later."""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator, Optional, Sequence

import tensorflow as tf
from tf_agents.networks import sequential

_MEAN_WEIGHTS = contextvars.ContextVar("mean_weights", default=False)


@contextlib.contextmanager
def mean_weights() -> Iterator[None]:
    """Noisy layers built or run inside act on their mean weights (no noise)."""
    token = _MEAN_WEIGHTS.set(True)
    try:
        yield
    finally:
        _MEAN_WEIGHTS.reset(token)


class NoisyDense(tf.keras.layers.Layer):
    """A factorised Gaussian noisy linear layer: y = x (mu_W + sigma_W * f(e_in) f(e_out)^T) + mu_b + sigma_b * f(e_out),
    with e_in, e_out ~ N(0, 1) drawn at every call and f(e) = sign(e) sqrt(|e|); mu ~ U(-1/sqrt(p), 1/sqrt(p)) and
    sigma = sigma0 / sqrt(p) at the start, p the inputs. Inside `mean_weights()`: y = x mu_W + mu_b."""

    def __init__(self, units: int, activation: Optional[str] = None, sigma0: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.units, self.activation, self.sigma0 = units, tf.keras.activations.get(activation), sigma0

    def build(self, input_shape) -> None:
        inputs = int(input_shape[-1])
        bound, sigma = 1.0 / math.sqrt(inputs), self.sigma0 / math.sqrt(inputs)
        def uniform() -> tf.keras.initializers.Initializer:  # one instance per weight: an unseeded one repeats itself
            return tf.keras.initializers.RandomUniform(-bound, bound)

        constant = tf.keras.initializers.Constant(sigma)
        self.kernel_mu = self.add_weight("kernel_mu", [inputs, self.units], initializer=uniform())
        self.kernel_sigma = self.add_weight("kernel_sigma", [inputs, self.units], initializer=constant)
        self.bias_mu = self.add_weight("bias_mu", [self.units], initializer=uniform())
        self.bias_sigma = self.add_weight("bias_sigma", [self.units], initializer=constant)
        super().build(input_shape)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        if _MEAN_WEIGHTS.get():
            return self.activation(tf.matmul(inputs, self.kernel_mu) + self.bias_mu)

        def scaled_noise(size: int) -> tf.Tensor:
            noise = tf.random.normal([size])
            return tf.sign(noise) * tf.sqrt(tf.abs(noise))

        noise_in, noise_out = scaled_noise(self.kernel_mu.shape[0]), scaled_noise(self.units)
        kernel = self.kernel_mu + self.kernel_sigma * (noise_in[:, None] * noise_out[None, :])
        return self.activation(tf.matmul(inputs, kernel) + self.bias_mu + self.bias_sigma * noise_out)

    def get_config(self) -> dict:
        return dict(super().get_config(), units=self.units, activation=tf.keras.activations.serialize(self.activation),
                    sigma0=self.sigma0)


def _hidden_layer(units: int) -> tf.keras.layers.Layer:
    return tf.keras.layers.Dense(
        units,
        activation=tf.keras.activations.relu,
        kernel_initializer=tf.keras.initializers.VarianceScaling(
            scale=2.0, mode="fan_in", distribution="truncated_normal"
        ),
    )


def _output_layer(units: int, bias: float = -0.2, noisy: Optional[float] = None) -> tf.keras.layers.Layer:
    """A linear layer with small weights and a constant bias, so the initial outputs are near-equal (the tutorial's
    Q-value layer; TF-Agents' C51 logit layer is the same); `noisy` (sigma0): a `NoisyDense` with its own init."""
    if noisy is not None:
        return NoisyDense(units, sigma0=noisy)
    return tf.keras.layers.Dense(
        units,
        activation=None,
        kernel_initializer=tf.keras.initializers.RandomUniform(minval=-0.03, maxval=0.03),
        bias_initializer=tf.keras.initializers.Constant(bias),
    )


def _hidden_layers(fc_layer_params: Sequence[int], noisy: Optional[float]) -> list:
    if noisy is None:
        return [_hidden_layer(n) for n in fc_layer_params]
    return [NoisyDense(n, activation="relu", sigma0=noisy) for n in fc_layer_params]


def build_q_network(fc_layer_params: Sequence[int], num_actions: int, dueling: bool = False,
                    noisy: Optional[float] = None) -> sequential.Sequential:
    """Hidden ReLU layers, then one linear unit per action (or, `dueling`, a `DuelingHead`); `noisy` (sigma0):
    every layer a `NoisyDense`.

    The output layer starts with small weights and a constant bias so the initial Q-values are
    near-equal and slightly negative, as in the tutorial.
    """
    head = DuelingHead(num_actions, noisy=noisy) if dueling else _output_layer(num_actions, noisy=noisy)
    return sequential.Sequential(_hidden_layers(fc_layer_params, noisy) + [head])


class DuelingHead(tf.keras.layers.Layer):
    """Q = V + A - mean_a A from the last hidden layer's features: a value stream V (one unit) and an advantage stream
    A (one unit per action), both linear. With `num_atoms` (C51) each stream gives logits per atom and
        logits[a, i] = V_i + A_{a,i} - mean_a' A_{a',i},
    Rainbow's distributional dueling head (the softmax over atoms comes after, in the agent)."""

    def __init__(self, num_actions: int, num_atoms: Optional[int] = None, noisy: Optional[float] = None, **kwargs):
        super().__init__(**kwargs)
        self.num_actions, self.num_atoms, self.noisy = num_actions, num_atoms, noisy
        per_action = num_atoms or 1
        self.value = _output_layer(per_action, noisy=noisy)  # the initial Q-values: -0.2, as the plain head's
        self.advantage = _output_layer(num_actions * per_action, bias=0.0, noisy=noisy)

    def call(self, features: tf.Tensor) -> tf.Tensor:
        value, advantage = self.value(features), self.advantage(features)
        if self.num_atoms is not None:
            value = tf.reshape(value, [-1, 1, self.num_atoms])
            advantage = tf.reshape(advantage, [-1, self.num_actions, self.num_atoms])
        return value + advantage - tf.reduce_mean(advantage, axis=1, keepdims=True)

    def get_config(self) -> dict:
        return dict(super().get_config(), num_actions=self.num_actions, num_atoms=self.num_atoms, noisy=self.noisy)


class CategoricalSequentialQNetwork(sequential.Sequential):
    """C51's network with a distributional dueling head (`dueling`) or noisy layers (`noisy`: sigma0): observations ->
    hidden ReLU layers -> [B, actions, atoms] logits (what TF-Agents' CategoricalQNetwork outputs, so
    CategoricalDqnAgent takes it as it is)."""

    def __init__(self, fc_layer_params: Sequence[int], num_actions: int, num_atoms: int, dueling: bool = False,
                 noisy: Optional[float] = None, input_spec: Optional[tf.TensorSpec] = None,
                 name: Optional[str] = None):
        if dueling:
            head = [DuelingHead(num_actions, num_atoms, noisy=noisy)]
        else:
            head = [_output_layer(num_actions * num_atoms, noisy=noisy), tf.keras.layers.Reshape([num_actions, num_atoms])]
        super().__init__(_hidden_layers(fc_layer_params, noisy) + head, input_spec=input_spec, name=name)
        self._num_atoms = num_atoms

    @property
    def num_atoms(self) -> int:
        return self._num_atoms

    def copy(self, **kwargs) -> "CategoricalSequentialQNetwork":
        """A new network of the same shape (fresh layers, no shared weights): the target network."""
        return type(self)(**dict(self._saved_kwargs, **kwargs))
