"""The population's replay: K seeds' uniform buffers in one `TFUniformReplayBuffer`, column k seed k's (its env is
copy k of the population's envs), `replay.capacity` steps each, sampled per seed.

The library's buffer keeps its columns in one flat table (`[K * capacity, ...]` rows), and `sample_per_seed` draws
each seed's windows from its own column, gathered with per-seed row offsets: `TFUniformReplayBuffer.get_next` would
draw columns at random, mixing the seeds' experience. The batch comes out seed-major ([K * B, steps, ...]: rows
[k * B, (k + 1) * B) are seed k's), as the population's network reads it (`core.ensemble`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import tensorflow as tf
from tf_agents.replay_buffers import tf_uniform_replay_buffer

from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.replay.uniform import TFUniformReplay

BACKENDS = ("tf_uniform",)  # the replay backends a population runs on


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


class SeedReplay:
    """One seed's view of the population's replay, with the counts a run's train row reads (`triggers.LogTrain`)."""

    def __init__(self, replay: PopulationReplay):
        self.replay = replay

    def samples(self) -> Optional[int]:
        return None  # a train step samples one batch per seed, as a single run's

    def size(self) -> int:
        return self.replay.seed_size()

    def inserts(self) -> int:
        return self.replay.seed_inserts()
