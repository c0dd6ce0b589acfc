"""Prioritized replay (Schaul et al., 2016), the parts every backend shares: what a prioritized sample carries, the
importance weights, the beta schedule, and the NumPy sum-tree the Py backend keeps its priorities in.

An item i with priority p_i is sampled with probability P(i) = p_i^alpha / sum_k p_k^alpha. Its loss is scaled by
    w_i = (N P(i))^-beta / max_j w_j
(N items stored, the max over the sampled batch), beta rising linearly from `importance_exponent` to 1 over
`importance_anneal_steps` train steps. After each train step the learner writes the batch's new priorities back
(|n-step TD error| + epsilon for the DQN family, the item's cross-entropy + epsilon for C51), and a new item enters at
the largest priority written so far (1 before any), so it is sampled at least once soon.

Reverb keeps its priorities itself (a `Prioritized` selector: `replay.reverb_client.PrioritizedReverbReplay`); the Py
backend keeps them in `SumTree` (`replay.prioritized_py`). The TF-only `tf_uniform` keeps none: the config refuses it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from dqn_cartpole.config import ReplayConfig

INITIAL_MAX_PRIORITY = 1.0  # what new items get before any priority is written


class PrioritizedBatch(NamedTuple):
    """One prioritized sample: the items and what their importance weights and the priority update need."""

    items: Any  # [B, window, ...]
    keys: tf.Tensor  # [B]: what `Replay.update_priorities` names each item by (Reverb's uint64 keys, the Py ids)
    probabilities: tf.Tensor  # [B] float64: P(i), the probability the item was drawn with
    table_size: tf.Tensor  # [B] or [] int64: N, the items that could be drawn


def importance_weights(probabilities: tf.Tensor, table_size: tf.Tensor, beta: tf.Tensor) -> tf.Tensor:
    """w_i = (N P(i))^-beta / max_j w_j over the batch, as float32 [B]."""
    n_p = tf.cast(table_size, tf.float64) * tf.cast(probabilities, tf.float64)
    weights = tf.pow(n_p, -tf.cast(beta, tf.float64))
    return tf.cast(weights / tf.reduce_max(weights), tf.float32)


def beta_schedule(config: ReplayConfig, train_step: tf.Variable) -> tf.Tensor:
    """beta at `train_step`: `importance_exponent`, rising linearly to 1 over `importance_anneal_steps`."""
    progress = tf.minimum(tf.cast(train_step, tf.float64) / float(config.importance_anneal_steps), 1.0)
    return config.importance_exponent + (1.0 - config.importance_exponent) * progress


class SumTree:
    """Sums of p^alpha over a binary tree whose leaves are a buffer's slots, in one float64 array `nodes`
    (node 1 the root, node k's children 2k and 2k + 1, the leaves from `leaves` on): setting a batch of leaves and
    drawing a batch in proportion to them are a few NumPy calls per tree level.

    `nodes` is an attribute of `state` (a TF-Agents NumpyState, so it is checkpointed with the buffer, and a restore
    replaces the array: it is read from `state` each time, never cached).
    """

    def __init__(self, state: Any, capacity: int):
        self.state, self.capacity = state, capacity
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.state.sum_tree = np.zeros(2 * self.leaves, np.float64)

    @property
    def nodes(self) -> np.ndarray:
        return self.state.sum_tree

    def total(self) -> float:
        return float(self.nodes[1])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.nodes[np.asarray(slots, np.int64) + self.leaves]

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """leaf[slots] = values (the last one wins for a repeated slot), then every sum above them again."""
        nodes = self.nodes
        index = np.asarray(slots, np.int64) + self.leaves
        nodes[index] = values
        index = np.unique(index // 2)
        while index.size and index[0] >= 1:
            nodes[index] = nodes[2 * index] + nodes[2 * index + 1]  # recomputed, so no rounding drift builds up
            if index[0] == 1:
                break
            index = np.unique(index // 2)

    def draw(self, uniforms: np.ndarray, redraw: Any = None) -> np.ndarray:
        """Slots drawn in proportion to their leaves, one per uniform in [0, 1) (the tree must not be empty).

        Rounding can, very rarely, lead a path to a leaf of 0: `redraw(count)` gives fresh uniforms for those."""
        slots = self._descend(uniforms)
        for _ in range(8):
            empty = self.get(slots) <= 0
            if redraw is None or not empty.any():
                break
            slots[empty] = self._descend(redraw(int(empty.sum())))
        return slots

    def _descend(self, uniforms: np.ndarray) -> np.ndarray:
        nodes = self.nodes
        target = np.asarray(uniforms, np.float64) * nodes[1]
        index = np.ones(target.shape, np.int64)
        while index.size and index[0] < self.leaves:  # every path has the same depth
            left = nodes[2 * index]
            right = target >= left
            target = np.where(right, target - left, target)
            index = 2 * index + right
        return index - self.leaves
