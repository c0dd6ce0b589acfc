"""The population's Q-network: K independent copies of the tutorial's MLP in one Keras `Sequential`, one batched matmul per
layer (`EnsembleDense`), with the seeds in the batch dimension.

TF-Agents' `DqnAgent` wants a network whose output is `(num_actions,)` per row, so the seed axis cannot be an output
axis. Instead a batch of N rows is seed-major: rows [k * N/K, (k + 1) * N/K) belong to seed k. Each layer reshapes
[N, in] to [K, N/K, in], multiplies by its [K, in, out] kernel and reshapes back. Everything that works row by row
in the library (the epsilon-greedy policy, `index_with_actions`, the Double-DQN argmax, the target copy) then works
per seed unchanged. Seed k's weights are slice k of every variable (`seed_values`), which is what its own
single-seed network holds (`assign_seed`).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional, Sequence

import tensorflow as tf
from tf_agents.networks import sequential

from dqn_cartpole.core import networks


_ONLY_SEEDS: contextvars.ContextVar = contextvars.ContextVar("only_seeds", default=None)


@contextlib.contextmanager
def only_seeds(indices: tf.Tensor) -> Iterator[None]:
    """Inside, the ensemble layers compute only the seeds `indices` ([K'] int, ascending), whose rows (seed-major,
    in that order) are the whole batch: a seed that no longer trains costs nothing in a train step. Read when the
    layers' ops are built (traced), as `networks.mean_weights` is."""
    token = _ONLY_SEEDS.set((indices, {}))  # (the seeds, each variable's gathered slices: one gather per step)
    try:
        yield
    finally:
        _ONLY_SEEDS.reset(token)


def current_seeds() -> Optional[tf.Tensor]:
    """The seeds `only_seeds` restricts the layers to (None: all of them)."""
    only = _ONLY_SEEDS.get()
    return None if only is None else only[0]


def _only(variable: tf.Variable) -> tf.Tensor:
    """`variable`'s slices of the `only_seeds` seeds, gathered once per train step (a network runs two or three
    times in one: the online network on the first and the bootstrap steps, the target network)."""
    indices, gathered = _ONLY_SEEDS.get()
    key = id(variable)
    if key not in gathered:
        gathered[key] = tf.gather(variable, indices)
    return gathered[key]


class PerSeedInitializer(tf.keras.initializers.Initializer):
    """Initialises a [K, ...] weight as K draws of a single seed's initializer of shape [...]: Keras' fan-in of a
    [K, in, out] kernel would be K * in (`VarianceScaling`), a K times too small a scale."""

    def __init__(self, single: tf.keras.initializers.Initializer, seeds: int):
        self.single, self.seeds = single, seeds

    def __call__(self, shape, dtype=None, **kwargs):
        # A fresh instance per seed: an unseeded Keras initializer called again returns the same values.
        fresh = [type(self.single).from_config(self.single.get_config()) for _ in range(self.seeds)]
        return tf.stack([initializer(shape[1:], dtype=dtype) for initializer in fresh])

    def get_config(self) -> dict:
        return {"single": tf.keras.initializers.serialize(self.single), "seeds": self.seeds}


class EnsembleDense(tf.keras.layers.Layer):
    """K Dense layers side by side: seed-major rows [N, in] -> [N, out], seed k's rows through kernel[k], bias[k]."""

    def __init__(self, seeds: int, dense: tf.keras.layers.Dense, **kwargs):
        """`dense`: the single seed's layer (unbuilt), whose units, activation and initializers each seed gets."""
        super().__init__(**kwargs)
        self.seeds, self.units, self.activation = seeds, dense.units, dense.activation
        self.kernel_initializer = PerSeedInitializer(dense.kernel_initializer, seeds)
        self.bias_initializer = PerSeedInitializer(dense.bias_initializer, seeds)

    def build(self, input_shape) -> None:
        inputs = int(input_shape[-1])
        self.kernel = self.add_weight("kernel", [self.seeds, inputs, self.units], initializer=self.kernel_initializer)
        self.bias = self.add_weight("bias", [self.seeds, self.units], initializer=self.bias_initializer)
        super().build(input_shape)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        only = current_seeds()
        if only is not None:
            kernel, bias, seeds = _only(self.kernel), _only(self.bias), tf.size(only)
        else:
            kernel, bias, seeds = self.kernel, self.bias, self.seeds
            if inputs.shape[0] == 1 and self.seeds > 1:
                # TF-Agents builds a network's variables with a probe batch of one row (`Network.create_variables`):
                # every seed sees that row, and the probe gets seed 0's output (only its shape is used).
                return self.call(tf.tile(inputs, [self.seeds, 1]))[:1]
        per_seed = tf.reshape(inputs, [seeds, -1, inputs.shape[-1]])  # [K, N/K, in]
        outputs = tf.matmul(per_seed, kernel) + bias[:, tf.newaxis, :]  # (an einsum: ~10% slower)
        return self.activation(tf.reshape(outputs, [-1, self.units]))

    def get_config(self) -> dict:
        return dict(super().get_config(), seeds=self.seeds, units=self.units)


def build_population_q_network(fc_layer_params: Sequence[int], num_actions: int, seeds: int) -> sequential.Sequential:
    """`seeds` copies of `networks.build_q_network`'s plain MLP (its layers and initializers), as one network."""
    single = networks.build_q_network(fc_layer_params, num_actions)
    return sequential.Sequential([EnsembleDense(seeds, layer) for layer in single.layers])


def seed_values(population_variables: Sequence[tf.Variable], seed_index: int) -> list:
    """Seed `seed_index`'s slice of each of the population network's variables, as arrays in the same order as a
    single-seed network's variables."""
    return [variable[seed_index].numpy() for variable in population_variables]


def assign_seed(single_variables: Sequence[tf.Variable], population_variables: Sequence[tf.Variable],
                seed_index: int) -> None:
    """Gives a single-seed network (its `variables`) seed `seed_index`'s weights."""
    for single, population in zip(single_variables, population_variables):
        single.assign(population[seed_index])
