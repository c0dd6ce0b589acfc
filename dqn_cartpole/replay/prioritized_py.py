"""The Py backend's prioritized replay: `py_uniform`'s NumPy storage with a sum-tree of the windows' priorities.

Each stored step starts one window of `window_length` steps, as in the uniform buffer; the tree's leaf of a slot
holds the priority^alpha of the window that starts there, and 0 while that window is not whole yet (the newest
`window_length - 1` steps). Items are named by their insertion id (ids count every step ever added), so a priority
written for an item that was evicted meanwhile (a dataset samples ahead) is dropped instead of landing on its
slot's newer occupant. The tree and the largest priority seen live in the buffer's NumpyState, so a checkpoint of
the buffer keeps them. No maintained sum-tree library fits the pins and this layout, so this one stays small.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec

from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.replay.prioritized import INITIAL_MAX_PRIORITY, PrioritizedBatch, SumTree
from dqn_cartpole.replay.uniform import PyUniformReplay, VectorizedPyUniformReplayBuffer


class PrioritizedPyReplayBuffer(VectorizedPyUniformReplayBuffer):
    """The vectorized NumPy buffer plus a `SumTree` over window starts (see the module docstring)."""

    def __init__(self, data_spec: Any, capacity: int, window_length: int, alpha: float):
        super().__init__(data_spec=data_spec, capacity=capacity)
        self.window_length, self.alpha = window_length, alpha
        self.tree = SumTree(self._np_state, capacity)
        self._np_state.max_priority = np.float64(INITIAL_MAX_PRIORITY)

    @property
    def max_priority(self) -> float:
        return float(self._np_state.max_priority)

    def _add_batch(self, items):
        super()._add_batch(items)
        with self._lock:
            newest = (int(self._np_state.cur_id) - 1) % self._capacity
            slots, values = [newest], [0.0]  # the newest step starts no whole window yet...
            if int(self._np_state.size) >= self.window_length:  # ...but completes the one n steps back: the largest
                slots.append((newest - (self.window_length - 1)) % self._capacity)
                values.append(self.max_priority ** self.alpha)
            self.tree.set(np.array(slots), np.array(values))  # (window_length 1: the same slot, the last one wins)

    def _clear(self):
        super()._clear()
        with self._lock:
            self._np_state.sum_tree = np.zeros_like(self._np_state.sum_tree)

    def sample_prioritized(self, batch_size: int) -> tuple[Any, np.ndarray, np.ndarray, np.int64]:
        """(windows [batch, window_length, ...], their ids, P(i) of each, N = windows that could be drawn)."""
        with self._lock:
            windows = int(self._np_state.size) - self.window_length + 1
            if windows <= 0:
                raise ValueError(f"the prioritized buffer holds {int(self._np_state.size)} steps, fewer than a "
                                 f"{self.window_length}-step window")
            slots = self.tree.draw(np.random.random_sample(batch_size), np.random.random_sample)
            probabilities = self.tree.get(slots) / self.tree.total()
            oldest_id, oldest_slot = self._oldest()
            ids = oldest_id + (slots - oldest_slot) % self._capacity
            rows = (slots[:, np.newaxis] + np.arange(self.window_length)) % self._capacity
            items = self._decode(self._storage.get(rows))
        return items, ids.astype(np.int64), probabilities, np.int64(windows)

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray) -> None:
        """Writes priorities^alpha for the items still stored; raises the largest priority seen."""
        ids, priorities = np.asarray(ids, np.int64), np.asarray(priorities, np.float64)
        with self._lock:
            oldest_id, oldest_slot = self._oldest()
            newest_start = int(self._np_state.item_count) - self.window_length
            stored = (ids >= oldest_id) & (ids <= newest_start)
            slots = (oldest_slot + (ids[stored] - oldest_id)) % self._capacity
            self.tree.set(slots, priorities[stored] ** self.alpha)
            if priorities.size:
                self._np_state.max_priority = np.float64(max(self.max_priority, float(priorities.max())))


class PrioritizedPyReplay(PyUniformReplay):
    """`py_uniform` with prioritized sampling (`replay.prioritized`); one env, as `py_uniform`."""

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig, window_length: int):
        self.window_length = window_length
        super().__init__(data_spec, num_envs, config)

    def _make_buffer(self, config: ReplayConfig) -> PrioritizedPyReplayBuffer:
        return PrioritizedPyReplayBuffer(self.array_spec, config.capacity, self.window_length, config.priority_exponent)

    def prioritized_sampler(self, sample_batch_size: int, num_steps: int) -> Callable[[], PrioritizedBatch]:
        if num_steps != self.window_length:
            raise ValueError(f"this replay draws windows of {self.window_length} steps, not {num_steps}")
        window_specs = tensor_spec.add_outer_dims_nest(tensor_spec.from_spec(self.data_spec),
                                                       (sample_batch_size, num_steps))
        specs = tf.nest.flatten(window_specs)

        def sample_flat() -> list:
            items, ids, probabilities, size = self.buffer.sample_prioritized(sample_batch_size)
            return [np.asarray(a) for a in tf.nest.flatten(items)] + [ids, probabilities, size]

        def sample() -> PrioritizedBatch:
            if tf.executing_eagerly():
                items, ids, probabilities, size = self.buffer.sample_prioritized(sample_batch_size)
                return PrioritizedBatch(*tf.nest.map_structure(tf.constant, (items, ids, probabilities, size)))
            out = tf.numpy_function(sample_flat, [], [s.dtype for s in specs] + [tf.int64, tf.float64, tf.int64],
                                    stateful=True, name="py_prioritized_sample")
            for tensor, shape in zip(out, [s.shape for s in specs] + [[sample_batch_size], [sample_batch_size], []]):
                tensor.set_shape(shape)
            ids, probabilities, size = out[len(specs):]
            return PrioritizedBatch(tf.nest.pack_sequence_as(window_specs, out[:len(specs)]), ids, probabilities, size)

        return sample

    def update_priorities(self, keys: Any, priorities: Any) -> Optional[tf.Operation]:
        if tf.executing_eagerly():
            self.buffer.update_priorities(np.asarray(keys), np.asarray(priorities))
            return None
        return tf.numpy_function(self.buffer.update_priorities, [keys, tf.cast(priorities, tf.float64)], [],
                                 stateful=True, name="py_update_priorities")
