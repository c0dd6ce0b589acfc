"""Replay backends behind one interface: Reverb, TFUniformReplayBuffer, PyUniformReplayBuffer.

The training loop sees only `Replay`: `add_batch` (usable inside a compiled graph, so it can
be a TF driver's observer), `as_dataset`, `get_next`, `single_pass` (replaces the deprecated
`gather_all`), `clear`, `stats` and `close`. Only `build_replay` knows which backend it made.

Sequence length: every item the learner samples holds `n_step + 1` consecutive steps, which is
what DqnAgent's n-step TD target needs. Reverb stores those sequences as items; the uniform
buffers store single steps and cut windows of `num_steps` when sampling.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.replay_buffers import py_uniform_replay_buffer, replay_buffer, tf_uniform_replay_buffer
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib
from tf_agents.utils import nest_utils

from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.errors import UserError

log = logging.getLogger(__name__)

TABLE_NAME = "uniform_table"


def sequence_length_for(n_step: int) -> int:
    """Steps per sampled item: a transition is 2 steps, an n-step update needs n + 1."""
    return n_step + 1


class Replay:
    """A replay buffer plus the few things the loop needs around it."""

    backend: str = ""

    def __init__(self, buffer: replay_buffer.ReplayBuffer, data_spec: Any, num_envs: int, config: ReplayConfig):
        self.buffer = buffer
        self.data_spec = data_spec
        self.num_envs = num_envs
        self.config = config
        self._iterators: list = []

    # -- writing
    def add_batch(self, items: trajectory_lib.Trajectory) -> tf.Operation:
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
                 time_stacked: bool = True) -> Any:
        """One uniform sample: (items, info)."""
        return self.buffer.get_next(sample_batch_size, num_steps, time_stacked)

    def sampler(self, sample_batch_size: int, num_steps: int) -> Callable[[], Any]:
        """An in-graph callable returning one training batch, as `config.sampling` says.

        "dataset" reads the tf.data pipeline (parallel calls + prefetch overlap sampling with
        training, at the price of bit-for-bit reproducibility); "direct" samples in program
        order inside the compiled step, after that iteration's collection.
        """
        if self.config.sampling == "direct":
            return lambda: self.get_next(sample_batch_size, num_steps)[0]
        iterator = iter(self.as_dataset(sample_batch_size, num_steps))
        self._iterators.append(iterator)  # keep it alive as long as the replay
        return lambda: iterator.get_next()[0]

    def single_pass(self) -> Any:
        """Everything stored, in order, as one nest shaped [envs, time, ...]."""
        raise NotImplementedError

    def clear(self) -> None:
        self.buffer.clear()

    # -- bookkeeping
    def size(self) -> int:
        """Transitions (or, for Reverb, items) currently stored."""
        raise NotImplementedError

    def inserts(self) -> int:
        """Items inserted since the buffer was created."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases servers and threads. Safe to call twice."""


# ---------------------------------------------------------------------------- TF uniform


class TFUniformReplay(Replay):
    """`TFUniformReplayBuffer`: variables in the TF graph, one column per env."""

    backend = "tf_uniform"

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig):
        buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(
            data_spec, batch_size=num_envs, max_length=math.ceil(config.capacity / num_envs)
        )
        super().__init__(buffer, data_spec, num_envs, config)

    def single_pass(self) -> Any:
        # One deterministic pass: a sequence of every env's whole column, batched by env.
        dataset = self.buffer.as_dataset(single_deterministic_pass=True, sample_batch_size=self.num_envs,
                                         num_steps=self.buffer_frames_per_env())
        for items, _ in dataset.take(1):
            return items
        return None

    def buffer_frames_per_env(self) -> int:
        return int(self.buffer.num_frames().numpy()) // self.num_envs

    def size(self) -> int:
        return int(self.buffer.num_frames().numpy())

    def inserts(self) -> int:
        # last_id counts add_batch calls since creation (it is not reset by eviction).
        return int(self.buffer._get_last_id().numpy() + 1) * self.num_envs  # pylint: disable=protected-access


# ---------------------------------------------------------------------------- Py uniform


class PyUniformReplay(Replay):
    """`PyUniformReplayBuffer`: numpy storage in Python; one env, since it stores one stream."""

    backend = "py_uniform"

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig):
        if num_envs != 1:
            raise UserError(
                f"replay.backend: py_uniform stores a single stream of steps; set env.num_envs: 1 (got {num_envs})"
            )
        self.array_spec = tensor_spec.to_nest_array_spec(data_spec)
        buffer = py_uniform_replay_buffer.PyUniformReplayBuffer(data_spec=self.array_spec, capacity=config.capacity)
        super().__init__(buffer, data_spec, num_envs, config)
        self._flat_specs = tf.nest.flatten(data_spec)

    def add_batch(self, items: trajectory_lib.Trajectory) -> Any:
        if tf.executing_eagerly():
            return self.buffer.add_batch(tf.nest.map_structure(np.asarray, items))
        return tf.numpy_function(self._add_flat, tf.nest.flatten(items), [], stateful=True, name="py_uniform_add")

    def _add_flat(self, *flat: np.ndarray) -> None:
        self.buffer.add_batch(tf.nest.pack_sequence_as(self.array_spec, list(flat)))

    def as_dataset(self, sample_batch_size: int, num_steps: int) -> tf.data.Dataset:
        # PyUniformReplayBuffer's dataset is a Python generator: it refuses num_parallel_calls.
        dataset = self.buffer.as_dataset(sample_batch_size=sample_batch_size, num_steps=num_steps)
        return dataset.map(lambda items: (items, ())).prefetch(self.config.prefetch)

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        if tf.executing_eagerly():
            return self.buffer.get_next(sample_batch_size, num_steps, time_stacked), ()
        # Inside a compiled step: sample in numpy, in program order (seeded by NumPy's seed).
        outer = [d for d in (sample_batch_size, num_steps if time_stacked else None) if d is not None]
        specs = tf.nest.flatten(tensor_spec.add_outer_dims_nest(self.data_spec, tuple(outer)))

        def sample() -> list:
            return [np.asarray(a) for a in tf.nest.flatten(
                self.buffer.get_next(sample_batch_size, num_steps, time_stacked))]

        flat = tf.numpy_function(sample, [], [s.dtype for s in specs], stateful=True, name="py_uniform_sample")
        for tensor, spec in zip(flat, specs):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(self.data_spec, flat), ()

    def single_pass(self) -> Any:
        size = self.size()
        if size == 0:
            return None
        state = self.buffer._np_state  # pylint: disable=protected-access
        start = int(state.cur_id) if size == self.buffer._capacity else 0  # pylint: disable=protected-access
        decode, storage = self.buffer._decode, self.buffer._storage  # pylint: disable=protected-access
        items = [decode(storage.get((start + i) % self.buffer._capacity)) for i in range(size)]  # pylint: disable=protected-access
        stacked = nest_utils.stack_nested_arrays(items)
        return tf.nest.map_structure(lambda a: a[np.newaxis], stacked)

    def size(self) -> int:
        return int(self.buffer.size)

    def inserts(self) -> int:
        return int(self.buffer._np_state.item_count)  # pylint: disable=protected-access


# ---------------------------------------------------------------------------- Reverb


class ReverbReplay(Replay):
    """An embedded Reverb server with a uniform table of (n_step + 1)-step sequences."""

    backend = "reverb"

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig, sequence_length: int,
                 checkpoint_dir: Optional[str] = None):
        import reverb  # only this backend pays for importing Reverb
        from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils

        self.sequence_length = sequence_length
        signature = tensor_spec.add_outer_dim(tensor_spec.from_spec(data_spec))
        table = reverb.Table(
            TABLE_NAME,
            max_size=config.capacity,
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            rate_limiter=reverb.rate_limiters.MinSize(1),
            signature=signature,
        )
        checkpointer = reverb.checkpointers.DefaultCheckpointer(checkpoint_dir) if checkpoint_dir else None
        try:
            self.server = reverb.Server([table], port=config.reverb_port, checkpointer=checkpointer)
        except Exception as exc:  # reverb raises a bare RuntimeError when the port is taken
            raise UserError(f"replay.reverb_port: cannot start the Reverb server: {str(exc).splitlines()[0]}") from None
        self.port = self.server.port
        buffer = reverb_replay_buffer.ReverbReplayBuffer(
            data_spec, table_name=TABLE_NAME, sequence_length=sequence_length, local_server=self.server
        )
        super().__init__(buffer, data_spec, num_envs, config)
        # One writer per env: Reverb's observer takes unbatched steps of a single episode stream.
        self.observers = [
            reverb_utils.ReverbAddTrajectoryObserver(buffer.py_client, TABLE_NAME, sequence_length=sequence_length)
            for _ in range(num_envs)
        ]
        self._closed = False

    def add_batch(self, items: trajectory_lib.Trajectory) -> Any:
        if tf.executing_eagerly():
            return self._add_flat(*[np.asarray(t) for t in tf.nest.flatten(items)])
        return tf.numpy_function(self._add_flat, tf.nest.flatten(items), [], stateful=True, name="reverb_add")

    def _add_flat(self, *flat: np.ndarray) -> None:
        for env_index, observer in enumerate(self.observers):
            observer(tf.nest.pack_sequence_as(self.data_spec, [a[env_index] for a in flat]))

    def flush(self) -> None:
        for observer in self.observers:
            observer.flush()

    def as_dataset(self, sample_batch_size: int, num_steps: int) -> tf.data.Dataset:
        self.flush()
        return super().as_dataset(sample_batch_size, num_steps)

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        # ReverbReplayBuffer has no get_next: take one element of a fresh dataset instead.
        self.flush()
        dataset = self.buffer.as_dataset(sample_batch_size=sample_batch_size, num_steps=num_steps)
        return next(iter(dataset))

    def single_pass(self) -> Any:
        self.flush()
        if self.size() == 0:
            return None
        dataset = self.buffer.as_dataset(single_deterministic_pass=True, sample_batch_size=1)
        items = [item for item, _ in dataset.take(self.size())]
        return tf.nest.map_structure(lambda *xs: tf.concat(xs, axis=1), *items)

    def clear(self) -> None:
        self.flush()
        self.buffer.py_client.reset(TABLE_NAME)
        for observer in self.observers:
            observer.reset(write_cached_steps=False)

    def table_info(self) -> Any:
        return self.buffer.py_client.server_info()[TABLE_NAME]

    def size(self) -> int:
        return int(self.table_info().current_size)

    def inserts(self) -> int:
        return int(self.table_info().rate_limiter_info.insert_stats.completed)

    def checkpoint(self) -> str:
        """Writes a Reverb checkpoint of the table; returns its path."""
        self.flush()
        return self.buffer.py_client.checkpoint()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for observer in self.observers:
            try:
                observer.close()
            except Exception:  # pylint: disable=broad-except
                log.debug("reverb observer close failed", exc_info=True)
        self.server.stop()


def build_replay(config: ReplayConfig, data_spec: Any, num_envs: int, n_step: int,
                 checkpoint_dir: Optional[str] = None) -> Replay:
    """Makes the backend that `config.backend` names."""
    if config.backend == "tf_uniform":
        return TFUniformReplay(data_spec, num_envs, config)
    if config.backend == "py_uniform":
        return PyUniformReplay(data_spec, num_envs, config)
    return ReverbReplay(data_spec, num_envs, config, sequence_length_for(n_step), checkpoint_dir)
