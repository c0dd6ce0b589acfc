"""The uniform buffers: TF-Agents' `TFUniformReplayBuffer` (in the graph) and `PyUniformReplayBuffer` (numpy)."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import tensorflow as tf
from tf_agents.replay_buffers import py_uniform_replay_buffer, tf_uniform_replay_buffer
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib

from dqn_cartpole.config import ReplayConfig, sampling_mode
from dqn_cartpole.errors import UserError
from dqn_cartpole.replay.base import Replay, to_numpy, unstack_time


class TFUniformReplay(Replay):
    """`TFUniformReplayBuffer`: variables in the TF graph, one column per env."""

    backend = "tf_uniform"
    writes_in_graph = True

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig):
        buffer_class = self.buffer_class(config)
        buffer = buffer_class(data_spec, batch_size=num_envs, max_length=math.ceil(config.capacity / num_envs))
        super().__init__(buffer, data_spec, num_envs, config)
        self._cleared_inserts = 0

    @staticmethod
    def buffer_class(config: ReplayConfig) -> type:
        """Sampled in program order, the buffer has one user at a time: its writes need no lock."""
        return ProgramOrderUniformReplayBuffer if sampling_mode(config) == "direct" \
            else tf_uniform_replay_buffer.TFUniformReplayBuffer

    def sampler(self, sample_batch_size: int, num_steps: int, with_tags: bool = False) -> Any:
        if with_tags or sampling_mode(self.config) != "direct":
            return super().sampler(sample_batch_size, num_steps, with_tags)
        return lambda: sample_windows(self.buffer, sample_batch_size, num_steps)

    def single_pass(self) -> Any:
        # Not as_dataset(single_deterministic_pass=True): in tf-agents 0.19 that dataset reads
        # row `id % capacity` instead of `id % max_length`, so once the buffer has wrapped, env
        # b's later steps come from env b + 1 (tests/test_replay.py shows it). gather_all's
        # row arithmetic is right, and its private implementation skips the deprecation warning.
        return to_numpy(self.buffer._gather_all())  # pylint: disable=protected-access

    def clear(self) -> None:
        self._cleared_inserts = self.inserts()
        super().clear()

    def size(self) -> int:
        return int(self.buffer.num_frames().numpy())

    def inserts(self) -> int:
        # last_id counts add_batch calls since the last clear (eviction does not lower it).
        last_id = int(self.buffer._get_last_id().numpy())  # pylint: disable=protected-access
        return self._cleared_inserts + (last_id + 1) * self.num_envs


class ProgramOrderUniformReplayBuffer(tf_uniform_replay_buffer.TFUniformReplayBuffer):
    """`TFUniformReplayBuffer` whose `add_batch` moves `last_id` without the library's `tf.CriticalSection`.

    The library takes that lock around every change of `last_id` so that tf.data readers on other
    threads see whole updates. Executing a critical section costs 70-100 us of executor time: a
    quarter of a collect step in the compiled loop. With direct sampling there are no such readers:
    the adds and the samples run in one graph call after another, and TensorFlow runs a graph's
    stateful ops on the same variable in program order. Storage, ids and reads are the library's
    (`num_frames`, `gather_all` and a dataset still take the lock, which nothing holds for long).
    """

    def _increment_last_id(self, increment: int = 1) -> tf.Tensor:
        return self._last_id.assign_add(increment).value()


def sample_windows(buffer: tf_uniform_replay_buffer.TFUniformReplayBuffer, sample_batch_size: int,
                   num_steps: Optional[int]) -> Any:
    """`buffer.get_next(sample_batch_size, num_steps)`'s items, built from only the ops a training batch needs
    (`num_steps=None`: single items [batch, ...], as the library's).

    Same distribution as the library's: each window starts at a uniformly drawn valid id of a
    uniformly drawn env column (ids drawn first, then columns). The library's get_next also takes
    last_id through a critical section, asserts, computes probabilities in a tf.cond, tiles the
    ranges and reads the ids table: 87 graph ops per batch, which cost 100-150 us of executor time
    per iteration in the compiled loop; these are 20. Program order still puts the read after the
    iteration's add (both touch `last_id` and the storage variables). An empty buffer fails in
    `tf.random.uniform` (minval >= maxval), as the initial fill makes sure it never is.
    """
    # pylint: disable=protected-access
    max_length = buffer._max_length
    min_id, max_id = tf_uniform_replay_buffer._valid_range_ids(buffer._last_id.read_value(), max_length, num_steps)
    ids = tf.random.uniform([sample_batch_size], minval=min_id, maxval=max_id, dtype=tf.int64)
    columns = tf.random.uniform([sample_batch_size], minval=0, maxval=buffer._batch_size, dtype=tf.int64)
    if num_steps is None:
        return buffer._data_table.read(tf.math.mod(ids, max_length) + columns * max_length)
    rows = tf.math.mod(ids[:, tf.newaxis] + tf.range(num_steps, dtype=tf.int64), max_length)
    return buffer._data_table.read(rows + columns[:, tf.newaxis] * max_length)


class VectorizedPyUniformReplayBuffer(py_uniform_replay_buffer.PyUniformReplayBuffer):
    """PyUniformReplayBuffer that samples a whole batch with one fancy-indexed read per field.

    Storage, `add_batch` and FIFO eviction are the library's. The library samples item by item
    in Python (one `storage.get` per item and step, then a stack), which made py_uniform
    training ~7x slower than tf_uniform; here one batch costs one index computation.
    """

    def _window_rows(self, sample_batch_size: Optional[int], num_steps: Optional[int]) -> np.ndarray:
        """Storage rows of uniformly drawn windows, shaped [batch?, steps?]; call with the lock held."""
        size, capacity = int(self._np_state.size), self._capacity
        steps = 1 if num_steps is None else num_steps
        if size < steps:
            raise ValueError(f"PyUniformReplayBuffer holds {size} items, fewer than the {steps} steps asked for")
        outer = () if sample_batch_size is None else (sample_batch_size,)
        # As in the library: windows start anywhere from the oldest item, np.random (seeded by
        # seed_everything) draws the starts, and a full buffer's oldest item sits at cur_id.
        starts = np.random.randint(size - steps + 1, size=outer)
        if size == capacity:
            starts = starts + int(self._np_state.cur_id)
        if num_steps is None:
            return starts % capacity
        return (starts[..., np.newaxis] + np.arange(steps)) % capacity

    def _get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        with self._lock:
            items = self._decode(self._storage.get(self._window_rows(sample_batch_size, num_steps)))
        if num_steps is not None and not time_stacked:
            time_axis = 0 if sample_batch_size is None else 1
            return tuple(tf.nest.map_structure(lambda a, t=t: np.take(a, t, axis=time_axis), items)
                         for t in range(num_steps))
        return items

    def _as_dataset(self, sample_batch_size=None, num_steps=None, sequence_preprocess_fn=None,
                    num_parallel_calls=None):
        # One numpy call per batch (the library's generator calls _get_next once per item), and
        # (items, info) pairs as ReplayBuffer.as_dataset documents (the library yields bare items).
        if sequence_preprocess_fn is not None:
            raise NotImplementedError("sequence_preprocess_fn is not supported.")
        return tf.data.Dataset.counter().map(lambda _: (self.sample_op(sample_batch_size, num_steps), ()),
                                             num_parallel_calls=num_parallel_calls)

    def sample_op(self, sample_batch_size: Optional[int], num_steps: Optional[int]) -> Any:
        """`_get_next` as a TF op (a stateful numpy_function), so it can run inside a graph."""
        outer = tuple(d for d in (sample_batch_size, num_steps) if d is not None)
        specs = tf.nest.flatten(tensor_spec.add_outer_dims_nest(tensor_spec.from_spec(self._data_spec), outer))

        def sample() -> list:
            return [np.asarray(a) for a in tf.nest.flatten(self._get_next(sample_batch_size, num_steps))]

        flat = tf.numpy_function(sample, [], [s.dtype for s in specs], stateful=True, name="py_uniform_sample")
        for tensor, spec in zip(flat, specs):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(self._data_spec, flat)

    def stored_items(self) -> Any:
        """Everything stored, oldest first, shaped [1, size, ...].

        The library's `gather_all` returns every slot of the storage, filled or not, in slot
        order; this is what it should return.
        """
        with self._lock:
            _, oldest = self._oldest()
            items = self._decode(self._storage.get((oldest + np.arange(int(self._np_state.size))) % self._capacity))
        return tf.nest.map_structure(lambda a: a[np.newaxis], items)

    def _oldest(self) -> tuple[int, int]:
        """(insertion id, slot) of the oldest stored step; call with the lock held."""
        size = int(self._np_state.size)
        oldest_slot = int(self._np_state.cur_id) if size == self._capacity else 0
        return int(self._np_state.item_count) - size, oldest_slot

    def _gather_all(self):
        return self.stored_items()


class PyUniformReplay(Replay):
    """`PyUniformReplayBuffer`: numpy storage in Python; one env, since it stores one stream."""

    backend = "py_uniform"

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig):
        if num_envs != 1:
            raise UserError(
                f"replay.backend: py_uniform stores a single stream of steps; set env.num_envs: 1 (got {num_envs})"
            )
        self.array_spec = self.array_spec_of(data_spec)
        super().__init__(self._make_buffer(config), data_spec, num_envs, config)

    @staticmethod
    def array_spec_of(data_spec: Any) -> Any:
        """The numpy buffer's spec of items of `data_spec`."""
        return tensor_spec.to_nest_array_spec(data_spec)

    def _make_buffer(self, config: ReplayConfig) -> VectorizedPyUniformReplayBuffer:
        return VectorizedPyUniformReplayBuffer(data_spec=self.array_spec, capacity=config.capacity)

    def add_batch(self, items: trajectory_lib.Trajectory) -> Any:
        if tf.executing_eagerly():
            return self.buffer.add_batch(to_numpy(items))
        return tf.numpy_function(self._add_flat, tf.nest.flatten(items), [], stateful=True, name="py_uniform_add")

    def _add_flat(self, *flat: np.ndarray) -> None:
        self.buffer.add_batch(tf.nest.pack_sequence_as(self.array_spec, list(flat)))

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        if tf.executing_eagerly():
            return to_numpy(self.buffer.get_next(sample_batch_size, num_steps, time_stacked)), ()
        # Inside a compiled step: sample in numpy, in program order (seeded by NumPy's seed).
        items = self.buffer.sample_op(sample_batch_size, num_steps)
        if num_steps is not None and not time_stacked:
            items = unstack_time(items, num_steps, time_axis=0 if sample_batch_size is None else 1)
        return items, ()

    def single_pass(self) -> Any:
        return self.buffer.stored_items()

    def size(self) -> int:
        return int(self.buffer.size)

    def inserts(self) -> int:
        return int(self.buffer._np_state.item_count)  # pylint: disable=protected-access  # clear() keeps it
