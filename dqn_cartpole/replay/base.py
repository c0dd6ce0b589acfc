"""Replay backends behind one interface: Reverb, TFUniformReplayBuffer, PyUniformReplayBuffer.

The training loop sees only `Replay`: `add_batch` (usable inside a compiled graph, so it can
be a TF driver's observer), `as_dataset`, `get_next`, `single_pass` (replaces the deprecated
`gather_all`), `clear`, `size`, `inserts`, the resume seam (`held_steps`, `write_seam`) and
`close`. Only `build_replay` knows which backend it made.

Windows: every item the learner samples holds `n_step + 1` consecutive steps, which is what
the n-step TD target needs, and every collected step starts exactly one window:

* the uniform buffers store single steps and cut windows when sampling, across episode
  boundaries too;
* Reverb stores the windows as items, written by TF-Agents' `ReverbAddTrajectoryObserver`
  with end-of-episode padding, so the last n steps of an episode start windows too (padded
  with boundary steps).

The agent (`agents.n_step_transition`) stops each window's return at its first LAST step, so
the part of a window after an episode's end never counts: both layouts give the same
(start state, n-step return, bootstrap state, bootstrap discount) for every transition.
"""
from __future__ import annotations

import collections
import gc
import logging
import math
import os
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.replay_buffers import py_uniform_replay_buffer, replay_buffer, tf_uniform_replay_buffer
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib

from dqn_cartpole.config import ReplayConfig, sampling_mode
from dqn_cartpole.errors import UserError

log = logging.getLogger(__name__)

TABLE_NAME = "uniform_table"
# A second view of the same items (no copy of the data), ordered by insertion, for single_pass.
PASS_TABLE_NAME = "insertion_order"
_VISITED = float(2**62)  # above every insertion index: a visited item sinks to the bottom of the heap


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


def sequence_length_for(n_step: int) -> int:
    """Steps per sampled item: a transition is 2 steps, an n-step update needs n + 1."""
    return n_step + 1


def _to_numpy(nest: Any) -> Any:
    return tf.nest.map_structure(np.asarray, nest)


def _unstack_time(items: Any, num_steps: int, time_axis: int) -> tuple:
    """[..., time, ...] tensors -> a tuple of `num_steps` nests (get_next's time_stacked=False)."""
    per_leaf = [tf.unstack(t, num=num_steps, axis=time_axis) for t in tf.nest.flatten(items)]
    return tuple(tf.nest.pack_sequence_as(items, [steps[i] for steps in per_leaf]) for i in range(num_steps))


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

    def sampler(self, sample_batch_size: int, num_steps: int) -> Callable[[], Any]:
        """An in-graph callable returning one training batch, as `config.sampling` says.

        "dataset" reads the tf.data pipeline (parallel calls + prefetch overlap sampling with
        training, at the price of bit-for-bit reproducibility); "direct" samples in program
        order inside the compiled step, after that iteration's collection.
        """
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

    # -- bookkeeping
    def size(self) -> int:
        """Steps (for Reverb: items of sequence_length steps) currently stored."""
        raise NotImplementedError

    def inserts(self) -> int:
        """Steps (for Reverb: items) inserted since the replay was created, evicted or cleared ones included."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases servers and threads. Safe to call twice."""
        self._iterators.clear()


# ---------------------------------------------------------------------------- TF uniform


class TFUniformReplay(Replay):
    """`TFUniformReplayBuffer`: variables in the TF graph, one column per env."""

    backend = "tf_uniform"

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig):
        buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(
            data_spec, batch_size=num_envs, max_length=math.ceil(config.capacity / num_envs)
        )
        super().__init__(buffer, data_spec, num_envs, config)
        self._cleared_inserts = 0

    def single_pass(self) -> Any:
        # Not as_dataset(single_deterministic_pass=True): in tf-agents 0.19 that dataset reads
        # row `id % capacity` instead of `id % max_length`, so once the buffer has wrapped, env
        # b's later steps come from env b + 1 (tests/test_replay.py shows it). gather_all's
        # row arithmetic is right, and its private implementation skips the deprecation warning.
        return _to_numpy(self.buffer._gather_all())  # pylint: disable=protected-access

    def clear(self) -> None:
        self._cleared_inserts = self.inserts()
        super().clear()

    def size(self) -> int:
        return int(self.buffer.num_frames().numpy())

    def inserts(self) -> int:
        # last_id counts add_batch calls since the last clear (eviction does not lower it).
        last_id = int(self.buffer._get_last_id().numpy())  # pylint: disable=protected-access
        return self._cleared_inserts + (last_id + 1) * self.num_envs


# ---------------------------------------------------------------------------- Py uniform


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
            size = int(self._np_state.size)
            oldest = int(self._np_state.cur_id) if size == self._capacity else 0
            items = self._decode(self._storage.get((oldest + np.arange(size)) % self._capacity))
        return tf.nest.map_structure(lambda a: a[np.newaxis], items)

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
        self.array_spec = tensor_spec.to_nest_array_spec(data_spec)
        buffer = VectorizedPyUniformReplayBuffer(data_spec=self.array_spec, capacity=config.capacity)
        super().__init__(buffer, data_spec, num_envs, config)

    def add_batch(self, items: trajectory_lib.Trajectory) -> Any:
        if tf.executing_eagerly():
            return self.buffer.add_batch(_to_numpy(items))
        return tf.numpy_function(self._add_flat, tf.nest.flatten(items), [], stateful=True, name="py_uniform_add")

    def _add_flat(self, *flat: np.ndarray) -> None:
        self.buffer.add_batch(tf.nest.pack_sequence_as(self.array_spec, list(flat)))

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        if tf.executing_eagerly():
            return _to_numpy(self.buffer.get_next(sample_batch_size, num_steps, time_stacked)), ()
        # Inside a compiled step: sample in numpy, in program order (seeded by NumPy's seed).
        items = self.buffer.sample_op(sample_batch_size, num_steps)
        if num_steps is not None and not time_stacked:
            items = _unstack_time(items, num_steps, time_axis=0 if sample_batch_size is None else 1)
        return items, ()

    def single_pass(self) -> Any:
        return self.buffer.stored_items()

    def size(self) -> int:
        return int(self.buffer.size)

    def inserts(self) -> int:
        return int(self.buffer._np_state.item_count)  # pylint: disable=protected-access  # clear() keeps it


# ---------------------------------------------------------------------------- Reverb


class _WindowWriter:
    """Writes one env's stream of steps to Reverb: one item per `sequence_length` consecutive steps.

    Like tf-agents' ReverbTrajectorySequenceObserver (windows run across episode boundaries,
    as in the uniform buffers, and any nest works, not only Trajectory), but it also files each
    item in the insertion-order table under its insertion index.
    """

    def __init__(self, client: Any, sequence_length: int):
        self._client, self._length = client, sequence_length
        # validate_items=False, as tf-agents' observers: the table signature already fixes the shapes.
        self._writer = client.trajectory_writer(num_keep_alive_refs=sequence_length + 1, validate_items=False)
        self._steps = 0

    def append(self, step: Any, next_index: Callable[[], int]) -> None:
        self._writer.append(step)
        self._steps += 1
        if self._steps >= self._length:
            window = tf.nest.map_structure(lambda column: column[-self._length:], self._writer.history)
            self._writer.create_item(TABLE_NAME, 1.0, window)  # Uniform sampling ignores the priority
            self._writer.create_item(PASS_TABLE_NAME, float(next_index()), window)

    def flush(self) -> None:
        self._writer.flush()

    def forget(self) -> None:
        """Drops the steps held for the next window (after a clear)."""
        self._writer.end_episode(clear_buffers=True)
        self._steps = 0

    def close(self) -> None:
        self._writer.close()


class _ObserverWriter:
    """TF-Agents' `ReverbAddTrajectoryObserver` for one env's stream of Trajectory steps.

    It writes each (n_step + 1)-step window of an episode into both tables, and pads the end
    of each episode with boundary steps (`pad_end_of_episodes`, `tile_end_of_episodes`), so the
    episode's last n steps, and its LAST step, start a window each, as in the uniform buffers.
    Its priority is set to the insertion index first, which orders the pass table (the uniform
    table ignores it). It also keeps the steps it holds for the next windows, for `held_steps`.
    """

    def __init__(self, client: Any, sequence_length: int):
        from tf_agents.replay_buffers import reverb_utils

        self._observer = reverb_utils.ReverbAddTrajectoryObserver(
            client, [TABLE_NAME, PASS_TABLE_NAME], sequence_length=sequence_length,
            pad_end_of_episodes=True, tile_end_of_episodes=True)
        self._held: collections.deque = collections.deque(maxlen=sequence_length - 1)

    def append(self, step: trajectory_lib.Trajectory, next_index: Callable[[], int]) -> None:
        # This observer has no update_priority (its episode sibling has); it reads _priority per item.
        self._observer._priority = float(next_index())  # pylint: disable=protected-access
        self._observer(step)
        if step.is_boundary():
            self._held.clear()
        else:
            self._held.append(step)

    def held(self) -> list:
        """The held steps, oldest first, each as a list of its flattened fields."""
        return [[np.asarray(a).tolist() for a in tf.nest.flatten(step)] for step in self._held]

    def flush(self) -> None:
        self._observer.flush()

    def forget(self) -> None:
        self._observer.reset(write_cached_steps=False)
        self._held.clear()

    def close(self) -> None:
        self._observer.close()


class ReverbReplay(Replay):
    """An embedded Reverb server with a uniform table of (n_step + 1)-step sequences."""

    backend = "reverb"

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig, sequence_length: int,
                 checkpoint_dir: Optional[str] = None):
        import reverb  # only this backend pays for importing Reverb
        from tf_agents.replay_buffers import reverb_replay_buffer

        self.sequence_length = sequence_length
        signature = tensor_spec.add_outer_dim(tensor_spec.from_spec(data_spec), sequence_length)

        def table(name: str, sampler: Any) -> Any:
            return reverb.Table(name, max_size=config.capacity, sampler=sampler, remover=reverb.selectors.Fifo(),
                                rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature)

        # Both tables hold the same items (their data is shared, not copied) and evict the same
        # oldest one. Training samples the uniform table; single_pass walks the min-heap one,
        # whose priorities are insertion indices.
        tables = [table(TABLE_NAME, reverb.selectors.Uniform()), table(PASS_TABLE_NAME, reverb.selectors.MinHeap())]
        checkpointer = reverb.checkpointers.DefaultCheckpointer(checkpoint_dir) if checkpoint_dir else None
        try:
            self.server = reverb.Server(tables, port=config.reverb_port, checkpointer=checkpointer)
        except Exception as exc:  # pylint: disable=broad-except  # reverb raises bare RuntimeError/ValueError
            raise UserError(reverb_start_problem(exc, config.reverb_port, checkpoint_dir)) from None
        self.port = self.server.port
        buffer = reverb_replay_buffer.ReverbReplayBuffer(
            data_spec, table_name=TABLE_NAME, sequence_length=sequence_length, local_server=self.server,
            max_cycle_length=config.reverb_max_cycle_length,
            dataset_buffer_size=config.reverb_dataset_buffer_size,
            num_workers_per_iterator=config.reverb_num_workers_per_iterator,
        )
        super().__init__(buffer, data_spec, num_envs, config)
        self.client = buffer.py_client
        # Reverb's writers take unbatched steps of one stream: one writer per env. Training data
        # (Trajectory) goes through TF-Agents' observer; any other nest (e.g. the replay-buffer
        # tutorial's) through a plain window writer.
        writer = _ObserverWriter if isinstance(data_spec, trajectory_lib.Trajectory) else _WindowWriter
        self.writers = [writer(self.client, sequence_length) for _ in range(num_envs)]
        # A restored checkpoint brings its items and insert count back: continue the numbering.
        self._next_index = self._pass_inserts()
        self._cleared_inserts = 0
        self._closed = False

    # -- writing
    def add_batch(self, items: trajectory_lib.Trajectory) -> Any:
        if tf.executing_eagerly():
            return self._add_flat(*[np.asarray(t) for t in tf.nest.flatten(items)])
        return tf.numpy_function(self._add_flat, tf.nest.flatten(items), [], stateful=True, name="reverb_add")

    def _add_flat(self, *flat: np.ndarray) -> None:
        for env_index, writer in enumerate(self.writers):
            writer.append(tf.nest.pack_sequence_as(self.data_spec, [a[env_index] for a in flat]), self._take_index)

    def held_steps(self) -> list:
        if not all(isinstance(w, _ObserverWriter) for w in self.writers):
            return super().held_steps()
        return [writer.held() for writer in self.writers]

    def write_seam(self, observations: np.ndarray, held: list) -> None:
        # A new process's writers hold nothing: give them back the steps held at the checkpoint,
        # then end the episode, so those steps start their windows too.
        flat_specs = tf.nest.flatten(self.data_spec)
        for env_index, steps in enumerate(held):
            for step in steps:
                arrays = [np.asarray(v, s.dtype.as_numpy_dtype) for v, s in zip(step, flat_specs)]
                self.writers[env_index].append(tf.nest.pack_sequence_as(self.data_spec, arrays), self._take_index)
        self.add_batch(boundary_steps(self.data_spec, observations))
        self.flush()

    def _take_index(self) -> int:
        index, self._next_index = self._next_index, self._next_index + 1
        return index

    def flush(self) -> None:
        """Waits until every item created so far is in the tables."""
        for writer in self.writers:
            writer.flush()

    # -- reading
    def as_dataset(self, sample_batch_size: int, num_steps: int) -> tf.data.Dataset:
        self.flush()
        # tf.data refuses more parallel calls than interleaved Reverb streams.
        streams = min(sample_batch_size, self.config.reverb_max_cycle_length)
        parallel = self.config.num_parallel_calls if streams == 1 else min(self.config.num_parallel_calls, streams)
        return self.buffer.as_dataset(sample_batch_size=sample_batch_size, num_steps=num_steps,
                                      num_parallel_calls=parallel).prefetch(self.config.prefetch)

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        # ReverbReplayBuffer has no get_next: take one element of a fresh dataset instead. With
        # num_steps=None the uniform buffers return single steps; so does this.
        self.flush()
        dataset = self.buffer.as_dataset(sample_batch_size=sample_batch_size, num_steps=num_steps or 1)
        items, info = dataset.take(1).get_single_element()
        time_axis = 0 if sample_batch_size is None else 1
        if num_steps is None:
            items = tf.nest.map_structure(lambda t: tf.squeeze(t, time_axis), items)
        elif not time_stacked:
            items = _unstack_time(items, num_steps, time_axis)
        return items, info

    def single_pass(self) -> Any:
        """Every item once, oldest first: [items, sequence_length, ...].

        Reverb cannot enumerate a uniform table, so this walks the min-heap table: take the
        oldest item, sink it below the rest, repeat; then give every item its priority back.
        It makes two client calls per item: meant for inspection, not for training.
        """
        self.flush()
        count = int(self.client.server_info()[PASS_TABLE_NAME].current_size)
        items, priorities = [], {}
        try:
            for _ in range(count):
                (sample,) = self.client.sample(PASS_TABLE_NAME, num_samples=1, emit_timesteps=False)
                priorities[sample.info.key] = sample.info.priority
                self.client.mutate_priorities(PASS_TABLE_NAME, updates={sample.info.key: _VISITED})
                items.append(tf.nest.pack_sequence_as(self.data_spec, list(sample.data)))
        finally:
            if priorities:
                self.client.mutate_priorities(PASS_TABLE_NAME, updates=priorities)
        if not items:
            return tf.nest.map_structure(
                lambda s: np.zeros((0, self.sequence_length) + tuple(s.shape), s.dtype.as_numpy_dtype), self.data_spec)
        return tf.nest.map_structure(lambda *steps: np.stack(steps), *items)

    def clear(self) -> None:
        self.flush()
        self._cleared_inserts = self.inserts()
        for name in (TABLE_NAME, PASS_TABLE_NAME):
            self.client.reset(name)  # also resets the table's insert count
        for writer in self.writers:
            writer.forget()
        self._next_index = 0

    # -- bookkeeping
    def _table_info(self, name: str = TABLE_NAME) -> Any:
        return self.client.server_info()[name]

    def _pass_inserts(self) -> int:
        return int(self._table_info(PASS_TABLE_NAME).rate_limiter_info.insert_stats.completed)

    def size(self) -> int:
        self.flush()  # items are sent in the background: count them once they are in
        return int(self._table_info().current_size)

    def inserts(self) -> int:
        self.flush()
        return self._cleared_inserts + int(self._table_info().rate_limiter_info.insert_stats.completed)

    def checkpoint(self) -> str:
        """Writes a Reverb checkpoint of the tables; returns its path."""
        self.flush()
        return self.client.checkpoint()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Dataset iterators left alive keep their sampler threads retrying a stopped server.
        super().close()
        gc.collect()
        for writer in self.writers:
            try:
                writer.close()
            except Exception:  # pylint: disable=broad-except
                log.debug("reverb writer close failed", exc_info=True)
        self.server.stop()
        # A stopped server keeps ~35 threads until the object is freed; numpy_function's registry
        # can keep this Replay alive, so drop both references to the server here.
        self.server = None
        self.buffer._local_server = None  # pylint: disable=protected-access


def reverb_start_problem(exc: Exception, port: Optional[int], checkpoint_dir: Optional[str]) -> str:
    """One line saying why the Reverb server did not start: its port, or the table checkpoint it loads."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if "BuildAndStart" in first or "address" in first.lower():
        where = f"port {port}" if port else "a free port"
        return f"replay.reverb_port: cannot start the Reverb server on {where}: {first}"
    if checkpoint_dir and os.path.isdir(checkpoint_dir) and os.listdir(checkpoint_dir):
        return f"cannot start the Reverb server from the table checkpoint in {checkpoint_dir}: {first}"
    return f"cannot start the Reverb server: {first}"


def build_replay(config: ReplayConfig, data_spec: Any, num_envs: int, n_step: int,
                 checkpoint_dir: Optional[str] = None) -> Replay:
    """Makes the backend that `config.backend` names."""
    if config.backend == "tf_uniform":
        return TFUniformReplay(data_spec, num_envs, config)
    if config.backend == "py_uniform":
        return PyUniformReplay(data_spec, num_envs, config)
    return ReverbReplay(data_spec, num_envs, config, sequence_length_for(n_step), checkpoint_dir)
