"""Reverb's client side: the replay the learner reads and the writers that add each env's steps.

It knows the server only by its address (and, when the server lives in this process, the
server object itself, which lets sampling skip gRPC). Starting and stopping servers is
`replay.reverb_tables`' job.
"""

from __future__ import annotations

import collections
import gc
import logging
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib

from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.replay.base import Replay, boundary_steps, unstack_time
from dqn_cartpole.replay.reverb_tables import PASS_TABLE_NAME, TABLE_NAME

log = logging.getLogger(__name__)

_VISITED = float(2**62)  # above every insertion index: a visited item sinks to the bottom of the heap
# The uniform table's priority when no collector tagged its items (Reverb's and TF-Agents' default).
DEFAULT_PRIORITY = 1.0


class WindowWriter:
    """Writes one env's stream of steps to Reverb: one item per `sequence_length` consecutive steps.

    Like tf-agents' ReverbTrajectorySequenceObserver (windows run across episode boundaries,
    as in the uniform buffers, and any nest works, not only Trajectory), but it also files each
    item in the insertion-order table under its insertion index. Its uniform-table items get
    `priority` (see `ReverbReplay.tag_items`).
    """

    def __init__(self, client: Any, sequence_length: int):
        self._client, self._length = client, sequence_length
        self.priority = DEFAULT_PRIORITY
        # validate_items=False, as tf-agents' observers: the table signature already fixes the shapes.
        self._writer = PatientWriter(client.trajectory_writer(num_keep_alive_refs=sequence_length + 1,
                                                              validate_items=False))
        self._steps = 0

    def give_up_when(self, interrupted: Callable[[], bool]) -> None:
        self._writer.interrupted = interrupted

    def append(self, step: Any, next_index: Callable[[], int]) -> None:
        self._writer.append(step)
        self._steps += 1
        if self._steps >= self._length:
            window = tf.nest.map_structure(lambda column: column[-self._length:], self._writer.history)
            self._writer.create_item(TABLE_NAME, self.priority, window)  # Uniform sampling ignores the priority
            self._writer.create_item(PASS_TABLE_NAME, float(next_index()), window)

    def flush(self) -> None:
        self._writer.flush()

    def forget(self) -> None:
        """Drops the steps held for the next window (after a clear)."""
        self._writer.end_episode(clear_buffers=True)
        self._steps = 0

    def close(self) -> None:
        self._writer.close()


class WriterInterrupted(Exception):
    """A write waiting on the server (e.g. held by a samples-per-insert ratio) was given up on."""


class PatientWriter:
    """A trajectory writer whose blocking calls wait in short slices and can be given up on.

    `flush` and `end_episode` wait until the server confirms the items, which a
    `SampleToInsertRatio` can hold back for ever once the learner stops sampling (reverb#144).
    Here each wait lasts WAIT_SLICE_MS at a time, and between slices `interrupted()` is asked: when
    it says so, WriterInterrupted is raised and the caller can leave (a collector on SIGTERM or on
    the run's stop). Unconfirmed items are then dropped with the writer. Everything else goes to
    the writer.
    """

    WAIT_SLICE_MS = 500

    def __init__(self, writer: Any):
        self._writer = writer
        self.interrupted: Callable[[], bool] = lambda: False

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        del timeout_ms  # waits in slices instead
        self._wait(lambda: self._writer.flush(block_until_num_items, timeout_ms=self.WAIT_SLICE_MS))

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None) -> None:
        del timeout_ms
        from reverb import errors

        try:
            self._writer.end_episode(clear_buffers, timeout_ms=self.WAIT_SLICE_MS)
        except errors.DeadlineExceededError:  # the episode is ended all the same; its items are in flight
            self.flush()

    def _wait(self, call: Callable[[], None]) -> None:
        from reverb import errors

        while True:
            try:
                call()
                return
            except errors.DeadlineExceededError:
                if self.interrupted():
                    raise WriterInterrupted("gave up waiting for the replay server to take the items") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


class ObserverWriter:
    """TF-Agents' `ReverbAddTrajectoryObserver` for one env's stream of Trajectory steps.

    It writes each (n_step + 1)-step window of an episode into both tables, and pads the end
    of each episode with boundary steps (`pad_end_of_episodes`, `tile_end_of_episodes`), so the
    episode's last n steps, and its LAST step, start a window each, as in the uniform buffers.
    Its priority is set to the insertion index first, which orders the pass table; the uniform
    table's items get `priority` instead (see `UniformTablePriority`). It also keeps the steps it
    holds for the next windows, for `held_steps`.
    """

    def __init__(self, client: Any, sequence_length: int):
        from tf_agents.replay_buffers import reverb_utils

        self._observer = reverb_utils.ReverbAddTrajectoryObserver(
            client, [TABLE_NAME, PASS_TABLE_NAME], sequence_length=sequence_length,
            pad_end_of_episodes=True, tile_end_of_episodes=True)
        self._patient = PatientWriter(self._observer._writer)  # pylint: disable=protected-access
        self._uniform = UniformTablePriority(self._patient)
        self._observer._writer = self._uniform  # pylint: disable=protected-access
        self._held: collections.deque = collections.deque(maxlen=sequence_length - 1)

    def append(self, step: trajectory_lib.Trajectory, next_index: Callable[[], int]) -> None:
        # This observer has no update_priority (its episode sibling has); it reads _priority per item.
        self._observer._priority = float(next_index())  # pylint: disable=protected-access
        self._observer(step)
        if step.is_boundary():
            self._held.clear()
        else:
            self._held.append(step)

    @property
    def priority(self) -> float:
        return self._uniform.priority

    @priority.setter
    def priority(self, value: float) -> None:
        self._uniform.priority = value

    def give_up_when(self, interrupted: Callable[[], bool]) -> None:
        self._patient.interrupted = interrupted

    def held(self) -> list:
        """The held steps, oldest first, each as a list of its flattened fields."""
        return [[np.asarray(a).tolist() for a in tf.nest.flatten(step)] for step in self._held]

    def flush(self) -> None:
        self._observer.flush()

    def forget(self) -> None:
        self._observer.reset(write_cached_steps=False)
        self._held.clear()

    def close(self) -> None:
        try:
            self._observer.close()
        except WriterInterrupted:  # its last episode's items were not confirmed: drop them with the writer
            self._patient.close()


class UniformTablePriority:
    """TF-Agents' observer's trajectory writer, with the uniform table's items created at `priority`.

    The observer gives an item one priority in every table; the insertion-order table needs the
    insertion index, while the uniform table (whose selector ignores priorities) carries the
    train step of the weights that collected the item. Everything else goes to the writer.
    """

    def __init__(self, writer: Any):
        self._writer = writer
        self.priority = DEFAULT_PRIORITY

    def create_item(self, table: str, priority: float, trajectory: Any) -> None:
        self._writer.create_item(table, self.priority if table == TABLE_NAME else priority, trajectory)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


class ReverbReplay(Replay):
    """A client of a Reverb server's uniform table of (n_step + 1)-step windows."""

    backend = "reverb"

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig, sequence_length: int, address: str,
                 local_server: Any = None, rate_limiter_timeout_ms: int = -1):
        """`address` is the server's HOST:PORT; `local_server`, a server of this process, makes sampling skip gRPC.

        `rate_limiter_timeout_ms` >= 0 makes a sample that waits that long fail (-1: wait forever).
        """
        from tf_agents.replay_buffers import reverb_replay_buffer

        self.sequence_length = sequence_length
        self.address = address
        buffer = reverb_replay_buffer.ReverbReplayBuffer(
            data_spec, table_name=TABLE_NAME, sequence_length=sequence_length,
            server_address=None if local_server is not None else address, local_server=local_server,
            max_cycle_length=config.reverb_max_cycle_length,
            dataset_buffer_size=config.reverb_dataset_buffer_size,
            num_workers_per_iterator=config.reverb_num_workers_per_iterator,
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
        )
        super().__init__(buffer, data_spec, num_envs, config)
        self.client = buffer.py_client
        # Reverb's writers take unbatched steps of one stream: one writer per env. Training data
        # (Trajectory) goes through TF-Agents' observer; any other nest (e.g. the replay-buffer
        # tutorial's) through a plain window writer.
        writer = ObserverWriter if isinstance(data_spec, trajectory_lib.Trajectory) else WindowWriter
        self.writers = [writer(self.client, sequence_length) for _ in range(num_envs)]
        # A restored checkpoint brings its items and insert count back: continue the numbering.
        self._next_index = self._pass_inserts()
        self._cleared_inserts = self._cleared_samples = 0
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
        if not all(isinstance(w, ObserverWriter) for w in self.writers):
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

    def tag_items(self, train_step: int) -> None:
        """Items created from now on carry `train_step` as their uniform-table priority.

        A collector tags them with the train step of the weights it collects with, and the learner
        reads it back from each sample's `SampleInfo.priority` (policy lag). The uniform selector
        ignores priorities, so sampling is unchanged (0 is allowed). A window that spans a weight
        pull carries the step at the item's creation, i.e. of its newest step.
        """
        for writer in self.writers:
            writer.priority = float(train_step)

    def give_up_waiting_when(self, interrupted: Callable[[], bool]) -> None:
        """Writes held back by the server (a samples-per-insert ratio) raise WriterInterrupted once
        `interrupted()` is true, instead of waiting for ever (a collector that must stop)."""
        for writer in self.writers:
            writer.give_up_when(interrupted)

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
            items = unstack_time(items, num_steps, time_axis)
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
        self._cleared_inserts, self._cleared_samples = self.inserts(), self.samples()
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

    def samples(self) -> int:
        # The server's count: every sampled item, prefetched ones too; a restored table checkpoint
        # brings it back with the inserts (reverb#64), so the ratio runs on across a resume.
        return self._cleared_samples + int(self._table_info().rate_limiter_info.sample_stats.completed)

    def checkpoint(self) -> str:
        """Writes a Reverb checkpoint of the tables; returns its path."""
        self.flush()
        return self.client.checkpoint()

    def close(self) -> None:
        """Closes the writers and readers; the server, owned by whoever started it, keeps running."""
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
        # numpy_function's registry can keep this Replay alive: drop the reference to a local server.
        self.buffer._local_server = None  # pylint: disable=protected-access
