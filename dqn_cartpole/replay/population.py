"""The population's replay: K seeds' uniform buffers, `replay.capacity` steps each, sampled per seed. On `tf_uniform`
(`PopulationReplay`) they are one `TFUniformReplayBuffer`, column k seed k's (its env is copy k of the population's
envs); on `py_uniform` (`PopulationPyReplay`) K of the project's numpy `PyUniformReplayBuffer`s.

The library's buffer keeps its columns in one flat table (`[K * capacity, ...]` rows), and `sample_per_seed` draws
each seed's windows from its own column, gathered with per-seed row offsets: `TFUniformReplayBuffer.get_next` would
draw columns at random, mixing the seeds' experience. The batch comes out seed-major ([K * B, steps, ...]: rows
[k * B, (k + 1) * B) are seed k's), as the population's network reads it (`core.ensemble`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf
from tf_agents.replay_buffers import tf_uniform_replay_buffer

from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.config.population import BACKENDS  # the replay backends a population runs on
from dqn_cartpole.replay.base import Replay, to_numpy
from dqn_cartpole.replay.uniform import PyUniformReplay, TFUniformReplay, VectorizedPyUniformReplayBuffer



def sample_per_seed(buffer: tf_uniform_replay_buffer.TFUniformReplayBuffer, sample_batch_size: int,
                    num_steps: int, seeds: Optional[tf.Tensor] = None) -> Any:
    """`sample_batch_size` windows of `num_steps` steps from each column (or from columns `seeds`, [K'] ascending),
    seed-major: each window starts at a uniformly drawn valid id of its own seed's column (every column holds the
    same ids: the seeds step together)."""
    # pylint: disable=protected-access
    max_length = buffer._max_length
    if seeds is None:
        seeds = tf.range(buffer._batch_size)
    min_id, max_id = tf_uniform_replay_buffer._valid_range_ids(buffer._last_id.read_value(), max_length, num_steps)
    ids = tf.random.uniform([tf.size(seeds) * sample_batch_size], minval=min_id, maxval=max_id, dtype=tf.int64)
    columns = tf.repeat(tf.cast(seeds, tf.int64), sample_batch_size)
    rows = tf.math.mod(ids[:, tf.newaxis] + tf.range(num_steps, dtype=tf.int64), max_length)
    return buffer._data_table.read(rows + columns[:, tf.newaxis] * max_length)


class PopulationReplay(TFUniformReplay):
    """K seeds' replays of `replay.capacity` steps each (see the module docstring)."""

    def __init__(self, data_spec: Any, seeds: int, config: ReplayConfig):
        super().__init__(data_spec, seeds, dataclasses.replace(config, capacity=config.capacity * seeds))
        self.seeds = seeds

    def sampler(self, sample_batch_size: int, num_steps: int, with_tags: bool = False) -> Any:
        """Per seed `sample_batch_size` windows, seed-major (`sample_per_seed`)."""
        return lambda: sample_per_seed(self.buffer, sample_batch_size, num_steps)

    def seeds_sampler(self, sample_batch_size: int, num_steps: int) -> Any:
        """f(seeds) -> `sample_batch_size` windows of each of `seeds` ([K'] ascending), seed-major."""
        return lambda seeds: sample_per_seed(self.buffer, sample_batch_size, num_steps, seeds)

    def seed_size(self) -> int:
        """Steps each seed's replay holds."""
        return self.size() // self.seeds

    def seed_inserts(self) -> int:
        """Steps each seed has added."""
        return self.inserts() // self.seeds


class SeedBuffers(tf.Module):
    """The K numpy buffers, as one trackable (a checkpoint holds each one's storage and counters)."""

    def __init__(self, buffers: list):
        super().__init__(name="seed_buffers")
        self.buffers = buffers


class PopulationPyReplay(Replay):
    """K seeds' `PyUniformReplayBuffer`s (numpy, in this process), written and sampled from the compiled loop through
    `tf.numpy_function`s: row k of a batch goes to seed k's buffer, and each seed's windows come from its own."""

    backend = "py_uniform"

    def __init__(self, data_spec: Any, seeds: int, config: ReplayConfig):
        self.array_spec = PyUniformReplay.array_spec_of(data_spec)
        buffers = [VectorizedPyUniformReplayBuffer(data_spec=self.array_spec, capacity=config.capacity)
                   for _ in range(seeds)]
        super().__init__(SeedBuffers(buffers), data_spec, seeds, config)
        self.seeds, self.buffers = seeds, buffers
        self.specs = tf.nest.flatten(data_spec)

    def add_batch(self, items: Any) -> Any:
        if tf.executing_eagerly():
            return self._add_flat(*[np.asarray(x) for x in tf.nest.flatten(to_numpy(items))])
        return tf.numpy_function(self._add_flat, tf.nest.flatten(items), [], stateful=True, name="population_add")

    def _add_flat(self, *flat: np.ndarray) -> None:
        for k, buffer in enumerate(self.buffers):
            buffer.add_batch(tf.nest.pack_sequence_as(self.array_spec, [x[k:k + 1] for x in flat]))

    def seeds_sampler(self, sample_batch_size: int, num_steps: int) -> Any:
        """f(seeds) -> `sample_batch_size` windows of each of `seeds` ([K'] ascending), seed-major."""
        def sample(seeds: np.ndarray) -> list:
            per_seed = [tf.nest.flatten(self.buffers[k]._get_next(sample_batch_size, num_steps))  # pylint: disable=protected-access
                        for k in seeds]
            return [np.concatenate(parts) for parts in zip(*per_seed)]

        def sampled(seeds: tf.Tensor) -> Any:
            flat = tf.numpy_function(sample, [seeds], [spec.dtype for spec in self.specs], stateful=True,
                                     name="population_sample")
            for tensor, spec in zip(flat, self.specs):
                tensor.set_shape([None, num_steps, *spec.shape])
            return tf.nest.pack_sequence_as(self.data_spec, flat)

        return sampled

    def sampler(self, sample_batch_size: int, num_steps: int, with_tags: bool = False) -> Any:
        sample = self.seeds_sampler(sample_batch_size, num_steps)
        return lambda: sample(tf.range(self.seeds))

    def size(self) -> int:
        return sum(int(buffer.size) for buffer in self.buffers)

    def inserts(self) -> int:
        return sum(int(buffer._np_state.item_count) for buffer in self.buffers)  # pylint: disable=protected-access

    def seed_size(self) -> int:
        return int(self.buffers[0].size)

    def seed_inserts(self) -> int:
        return int(self.buffers[0]._np_state.item_count)  # pylint: disable=protected-access


def make_population_replay(data_spec: Any, seeds: int, config: ReplayConfig) -> Replay:
    """The population's replay on the configured backend (`BACKENDS`)."""
    if config.backend not in BACKENDS:
        raise ValueError(f"a population's replay is one of {BACKENDS}, not {config.backend}")
    replay_class = PopulationReplay if config.backend == "tf_uniform" else PopulationPyReplay
    return replay_class(data_spec, seeds, config)


class SeedReplay:
    """One seed's view of the population's replay, with the counts a run's train row reads (`triggers.LogTrain`)."""

    def __init__(self, replay: PopulationReplay, counts: Any):
        """`counts`: what reads the counts once for all seeds (`PopulationPipeline.count`)."""
        self.replay, self.counts = replay, counts

    def samples(self) -> Optional[int]:
        return None  # a train step samples one batch per seed, as a single run's

    def size(self) -> int:
        return self.counts.count("size", self.replay.seed_size)

    def inserts(self) -> int:
        return self.counts.count("inserts", self.replay.seed_inserts)
