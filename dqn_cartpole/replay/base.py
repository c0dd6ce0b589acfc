"""The replay interface the training loop sees, and the rule every backend's windows follow.

The loop sees only `Replay`: `add_batch` (usable inside a compiled graph, so it can be a TF
driver's observer), `as_dataset`, `get_next`, `single_pass` (replaces the deprecated
`gather_all`), `clear`, `size`, `inserts`, the resume seam (`held_steps`, `write_seam`) and
`close`; with prioritized replay also `prioritized_sampler`, `update_priorities` and `priority_trackables`
(`replay.prioritized`: Reverb's `PrioritizedReverbReplay`, `prioritized_py.PrioritizedPyReplay`). The builder (`core.build`) picks the backend: `replay.uniform` holds the two uniform
buffers, `replay.reverb_tables` the Reverb server side, `replay.reverb_client` its client side.

Windows: every item the learner samples holds the agent's `window_length` consecutive steps
(`core.agents`: n_step + 1 for the DQN family, what the n-step target needs), and every collected
step starts exactly one window:

* the uniform buffers store single steps and cut windows when sampling, across episode
  boundaries too;
* Reverb stores the windows as items, written by TF-Agents' `ReverbAddTrajectoryObserver`
  with end-of-episode padding, so the last n steps of an episode start windows too (padded
  with boundary steps).

The agents (`core.agents.n_step.n_step_transition`, in every agent's loss) stop each window's return at its first LAST
step, so the part of a window after an episode's end never counts: both layouts give the same
(start state, n-step return, bootstrap state, bootstrap discount) for every transition.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.replay_buffers import replay_buffer
from tf_agents.trajectories import trajectory as trajectory_lib

from dqn_cartpole.config import ReplayConfig, sampling_mode


def boundary_steps(data_spec: trajectory_lib.Trajectory, observations: np.ndarray) -> trajectory_lib.Trajectory:
    """A batch of LAST -> FIRST steps at `observations`, as a driver writes when an episode ends."""
    batch = np.asarray(observations).shape[0]

    def zeros(spec: Any) -> np.ndarray:
        return np.zeros((batch,) + tuple(spec.shape), spec.dtype.as_numpy_dtype)

    return trajectory_lib.boundary(
        observation=np.asarray(observations, data_spec.observation.dtype.as_numpy_dtype),
        action=tf.nest.map_structure(zeros, data_spec.action),
        policy_info=tf.nest.map_structure(zeros, data_spec.policy_info),
        reward=zeros(data_spec.reward), discount=np.ones_like(zeros(data_spec.discount)))


def to_numpy(nest: Any) -> Any:
    return tf.nest.map_structure(np.asarray, nest)


def unstack_time(items: Any, num_steps: int, time_axis: int) -> tuple:
    """[..., time, ...] tensors -> a tuple of `num_steps` nests (get_next's time_stacked=False)."""
    per_leaf = [tf.unstack(t, num=num_steps, axis=time_axis) for t in tf.nest.flatten(items)]
    return tuple(tf.nest.pack_sequence_as(items, [steps[i] for steps in per_leaf]) for i in range(num_steps))


class Replay:
    """A replay buffer plus the few things the loop needs around it."""

    backend: str = ""
    # add_batch is a TF op (a buffer in the graph): cheap inside a compiled call, about 1 ms per eager call.
    writes_in_graph: bool = False

    def __init__(self, buffer: replay_buffer.ReplayBuffer, data_spec: Any, num_envs: int, config: ReplayConfig):
        self.buffer = buffer
        self.data_spec = data_spec
        self.num_envs = num_envs
        self.config = config
        self._iterators: list = []

    # -- writing
    def add_batch(self, items: trajectory_lib.Trajectory) -> Any:
        """Adds a batch (one step of every env); works eagerly and inside a tf.function."""
        return self.buffer.add_batch(items)

    # -- reading
    def as_dataset(self, sample_batch_size: int, num_steps: int) -> tf.data.Dataset:
        """Uniform samples of `num_steps` consecutive steps, batched, with parallel calls and prefetch."""
        return self.buffer.as_dataset(
            sample_batch_size=sample_batch_size,
            num_steps=num_steps,
            num_parallel_calls=self.config.num_parallel_calls,
        ).prefetch(self.config.prefetch)

    def get_next(self, sample_batch_size: Optional[int] = None, num_steps: Optional[int] = None,
                 time_stacked: bool = True) -> tuple[Any, Any]:
        """One uniform sample: (items, info). Items are [batch, num_steps, ...] when both are given."""
        return self.buffer.get_next(sample_batch_size, num_steps, time_stacked)

    def sampler(self, sample_batch_size: int, num_steps: int, with_tags: bool = False) -> Callable[[], Any]:
        """An in-graph callable returning one training batch, as `config.sampling` says; with `with_tags`
        (a learner), (batch, the train step of the weights that collected each item, [batch]).

        "dataset" reads the tf.data pipeline (parallel calls + prefetch overlap sampling with
        training, at the price of bit-for-bit reproducibility); "direct" samples in program
        order inside the compiled step, after that iteration's collection.
        """
        if with_tags:
            raise ValueError(f"replay backend {self.backend}: its items carry no collecting train step")
        if sampling_mode(self.config) == "direct":
            return lambda: self.get_next(sample_batch_size, num_steps)[0]
        iterator = iter(self.as_dataset(sample_batch_size, num_steps))
        self._iterators.append(iterator)  # keep it alive as long as the replay
        return lambda: iterator.get_next()[0]

    def single_pass(self) -> Any:
        """Everything stored, each item once, oldest first, as a nest of numpy arrays (eager only).

        The uniform buffers return steps shaped [envs, time, ...]; Reverb returns its items
        shaped [items, sequence_length, ...].
        """
        raise NotImplementedError

    def clear(self) -> None:
        """Empties the buffer; `inserts()` keeps counting from where it was."""
        self.buffer.clear()

    # -- the resume seam
    def held_steps(self) -> list:
        """Per env, the steps a writer holds that start no stored window yet (JSON-able lists).

        The uniform buffers hold none: every step is stored as it comes. A checkpoint keeps
        these so a resumed run can still write the windows they start (`write_seam`).
        """
        return [[] for _ in range(self.num_envs)]

    def write_seam(self, observations: np.ndarray, held: list) -> None:
        """Ends every env's stored stream where a resumed run takes over.

        The resumed run starts fresh episodes, so the stream gets a LAST step at each env's last
        observation (`observations`, [envs, ...]): the windows before it read as a time-limit
        truncation there, never as a step into the new episode.
        """
        del held  # the uniform buffers hold nothing back
        self.add_batch(boundary_steps(self.data_spec, observations))

    # -- prioritized replay (`replay.prioritized`): the backends that keep priorities override these
    def prioritized_sampler(self, sample_batch_size: int, num_steps: int) -> Callable[[], Any]:
        """An in-graph callable returning one `replay.prioritized.PrioritizedBatch` of windows drawn in proportion
        to their priorities^alpha."""
        raise ValueError(f"replay backend {self.backend} keeps no priorities (prioritized replay: reverb or "
                         f"py_uniform)")

    def update_priorities(self, keys: tf.Tensor, priorities: tf.Tensor) -> Any:
        """Writes the new priorities of the sampled items `keys` (a batch's `PrioritizedBatch.keys`), and raises the
        largest priority seen, which new items enter at; works inside a graph."""
        raise ValueError(f"replay backend {self.backend} keeps no priorities")

    def priority_trackables(self) -> dict:
        """What a checkpoint must keep of the priorities besides the buffer itself (e.g. the largest seen)."""
        return {}

    # -- bookkeeping
    def size(self) -> int:
        """Steps (for Reverb: items of sequence_length steps) currently stored."""
        raise NotImplementedError

    def inserts(self) -> int:
        """Steps (for Reverb: items) inserted since the replay was created, evicted or cleared ones included."""
        raise NotImplementedError

    def samples(self) -> Optional[int]:
        """Items sampled since the replay was created, as the backend counts them (Reverb: the server's
        count, prefetched items included); None when it does not count (the uniform buffers)."""
        return None

    def close(self) -> None:
        """Releases servers and threads. Safe to call twice."""
        self._iterators.clear()
