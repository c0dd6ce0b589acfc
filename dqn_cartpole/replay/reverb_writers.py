"""Reverb's writing side: each env's stream of steps becomes (sequence_length)-step windows in the tables.

`StreamWriters` holds one `WindowWriter` per env (Reverb's writers take unbatched steps of one
stream). Every step is packed into one row of bytes (`packing.StepPacker`) and handed, as one
column, straight to the C++ trajectory writer; each window is an item made of the references
the writer returns. A Trajectory stream follows TF-Agents' `ReverbAddTrajectoryObserver(
pad_end_of_episodes=True, tile_end_of_episodes=True)`: windows stay inside an episode, and its
end is padded with n boundary steps, so its last n steps, and its LAST step, start a window
each, as in the uniform buffers. Any other nest (the replay-buffer tutorial's) is one stream whose
windows run on across episodes, like `ReverbTrajectorySequenceObserver`. That observer spent
0.5-1 ms per step in Python (nest operations, eager zeros for its padding, a blocking
`end_episode` per episode); this spends about a tenth of that and never waits for the server
at an episode's end.
"""

from __future__ import annotations

import collections
import itertools
import logging
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib

from dqn_cartpole.replay.base import boundary_steps
from dqn_cartpole.replay.packing import StepPacker

log = logging.getLogger(__name__)

LAST = int(ts.StepType.LAST)
# Items a writer lets wait for the server's confirmation before it waits itself, and the items it creates between two
# such waits: at most MAX_PENDING + CHECK_EVERY (48) are ever unconfirmed, under the 50-odd from which Reverb's writer
# warns "The number of pending items is alarmingly high". Counted in items, not windows: a window is an item in
# each of its tables (two in a single-process or `server`-mode replay). A full queue or a samples-per-insert ratio
# holds a collector here, in slices it can give up on.
MAX_PENDING, CHECK_EVERY = 32, 16
# An item's priority in the first table when no collector tagged it (Reverb's and TF-Agents' default).
DEFAULT_PRIORITY = 1.0


class WriterInterrupted(Exception):
    """A write waiting on the server (e.g. held by a samples-per-insert ratio) was given up on."""


class PatientWriter:
    """A trajectory writer whose blocking calls wait in short slices and can be given up on.

    `flush` and `end_episode` wait until the server confirms the items, which a
    `SampleToInsertRatio` (or a full queue) can hold back for ever once the learner stops reading
    (reverb#144). Here each wait lasts WAIT_SLICE_MS at a time, and between slices
    `interrupted()` is asked: when it says so, WriterInterrupted is raised and the caller can
    leave (a collector on SIGTERM or on the run's stop). Unconfirmed items are then dropped with
    the writer. Everything else goes to the writer.
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


class WindowWriter:
    """One env's stream: each packed step is appended, and each `sequence_length` consecutive steps become an
    item in every one of `tables`. With `episodes`, windows stay inside an episode (see the module docstring).

    The items of `tables[0]` get `priority` (the collecting train step, see `StreamWriters.tag_items`),
    those of the others their insertion index (which orders the insertion-order table). With `keep_alive`
    (Ape-X priorities, see `StreamWriters`) each window instead waits in `waiting`, with its packed steps, until
    `create_waiting` is given its priority; the writer keeps the references of that many newest steps alive.
    """

    def __init__(self, client: Any, sequence_length: int, tables: Sequence[str], padding: Optional[np.ndarray],
                 keep_alive: Optional[int] = None):
        self._length, self._tables = sequence_length, tuple(tables)
        self.priority = DEFAULT_PRIORITY
        self.waiting: Optional[list] = None if keep_alive is None else []  # (window, index, its packed steps)
        self._rows: collections.deque = collections.deque(maxlen=sequence_length)  # the newest steps (waiting)
        # validate_items=False, as tf-agents' observers: the table signature already fixes the shapes.
        writer = client.trajectory_writer(num_keep_alive_refs=keep_alive or sequence_length + 1,
                                          validate_items=False)
        self._writer = PatientWriter(writer)
        # The C++ writer directly: the Python wrapper's nest handling per step cost more than the write.
        self._cpp = writer._writer  # pylint: disable=protected-access
        self._padding = padding  # the packed boundary step that ends an episode's windows (None: no episodes)
        self._refs: collections.deque = collections.deque(maxlen=sequence_length)  # the newest steps' references
        self._held: collections.deque = collections.deque(maxlen=sequence_length - 1)
        self._unchecked = 0  # items created since the writer last waited for the server (see MAX_PENDING)

    def append(self, row: np.ndarray, boundary: bool, next_index: Callable[[], int]) -> None:
        """Appends one packed step; `boundary`: a LAST step, which ends its episode's windows (with `episodes`)."""
        self._write(row, next_index)
        if self._padding is None:
            return
        if not boundary:
            self._held.append(row)
            return
        for _ in range(self._length - 1):
            self._write(self._padding, next_index)
        self._refs.clear()  # the next episode's windows start with its own steps
        self._held.clear()

    def _write(self, row: np.ndarray, next_index: Callable[[], int]) -> None:
        (ref,) = self._cpp.Append([row])
        self._refs.append(ref)
        if self.waiting is not None:
            self._rows.append(row)
        if len(self._refs) < self._length:
            return
        window, index = [list(self._refs)], float(next_index())
        if self.waiting is not None:
            self.waiting.append((window, index, np.stack(self._rows)))
            return
        self._create(window, index, self.priority)

    def create_waiting(self, priorities: np.ndarray) -> None:
        """Creates the waiting windows' items, the i-th at `priorities[i]` in the first table."""
        waiting, self.waiting = self.waiting, []
        for (window, index, _), priority in zip(waiting, priorities):
            self._create(window, index, float(priority))

    def _create(self, window: list, index: float, priority: float) -> None:
        for table in self._tables:  # uniform sampling and a queue ignore the priority
            self._cpp.CreateItem(table, priority if table == self._tables[0] else index, window, [False])
        self._unchecked += len(self._tables)
        if self._unchecked >= CHECK_EVERY:
            self._writer.flush(block_until_num_items=MAX_PENDING)
            self._unchecked = 0

    def held(self) -> list:
        """The packed steps that start no window yet (an episode's newest n), oldest first."""
        return list(self._held)

    def give_up_when(self, interrupted: Callable[[], bool]) -> None:
        self._writer.interrupted = interrupted

    def flush(self) -> None:
        self._writer.flush()

    def forget(self) -> None:
        """Drops the steps held for the next windows (after a clear)."""
        self._writer.end_episode(clear_buffers=True)
        self._refs.clear()
        self._held.clear()
        self._rows.clear()
        if self.waiting:
            self.waiting = []

    def close(self) -> None:
        try:
            self._writer.flush()
        except WriterInterrupted:  # its last items were not confirmed: drop them with the writer
            pass
        self._writer.close()


class StreamWriters:
    """The writing half of a Reverb replay: one `WindowWriter` per env, into `tables` (the first one gets the
    collecting train step as priority). A collector writes through this alone; a `ReverbReplay` adds the
    reading half.

    With `priorities` (prioritized replay on a server: a collector is an Ape-X actor), the windows wait in the
    writers until `flush`, which hands all of them at once, packed ([windows, sequence_length, bytes]), to
    `priorities` and creates each item at the priority it returns. A collector flushes after every
    `refresh_steps` env steps (per env at most), so the writers keep that many steps' references alive.
    """

    def __init__(self, client: Any, data_spec: Any, num_envs: int, sequence_length: int, tables: Sequence[str],
                 first_index: int = 0, priorities: Optional[Callable[[np.ndarray], np.ndarray]] = None,
                 refresh_steps: int = 0):
        self.data_spec = data_spec
        self.packer = StepPacker(data_spec)
        self.episodes = isinstance(data_spec, trajectory_lib.Trajectory)
        padding, self._step_type = None, None
        if self.episodes:
            marks = tf.nest.map_structure(lambda _: False, data_spec)._replace(step_type=True)
            self._step_type = tf.nest.flatten(marks).index(True)  # where the step type sits among the fields
            observation = np.zeros((1,) + tuple(data_spec.observation.shape), data_spec.observation.dtype.as_numpy_dtype)
            padding = self.packer.pack([a[0] for a in tf.nest.flatten(boundary_steps(data_spec, observation))])
        # A step appends at most sequence_length rows (a LAST step adds its padding): the oldest waiting window's.
        keep_alive = None if priorities is None else sequence_length * (refresh_steps + 1) + 1
        self._priorities = priorities
        self.writers = [WindowWriter(client, sequence_length, tables, padding, keep_alive) for _ in range(num_envs)]
        self._indices = itertools.count(first_index)  # the next windows' insertion indices (they order the pass table)

    def add_batch(self, items: Any) -> Any:
        """Adds one step of every env ([envs, ...]); eagerly (numpy) or inside a graph (a numpy_function)."""
        if tf.executing_eagerly():
            return self.add_flat(*[np.asarray(t) for t in tf.nest.flatten(items)])
        return tf.numpy_function(self.add_flat, tf.nest.flatten(items), [], stateful=True, name="reverb_add")

    def add_flat(self, *flat: np.ndarray) -> None:
        """Adds one step of every env, given as its fields in `tf.nest.flatten` order, each a numpy array [envs, ...]:
        what `add_batch` runs for a collector's driver."""
        for env_index, writer in enumerate(self.writers):
            step = [a[env_index] for a in flat]
            boundary = self.episodes and int(step[self._step_type]) == LAST
            writer.append(self.packer.pack(step), boundary, self._indices.__next__)

    def held_steps(self) -> Optional[list]:
        """Per env, the steps held for the next windows, each as a list of its fields' values (JSON-able);
        None for a stream without episodes (it holds none back)."""
        if not self.episodes:
            return None
        unpack = self.packer.unpack_numpy
        return [[[np.asarray(v).tolist() for v in tf.nest.flatten(unpack(row))] for row in writer.held()]
                for writer in self.writers]

    def give_back(self, held: list) -> None:
        """A new process's writers hold nothing: give them back the steps held at a checkpoint."""
        for env_index, steps in enumerate(held):
            for step in steps:  # held steps are never LAST: those end their episode
                self.writers[env_index].append(self.packer.pack(step), False, self._indices.__next__)

    def tag_items(self, train_step: int) -> None:
        """Items created from now on carry `train_step` as their priority in the first table.

        A collector tags them with the train step of the weights it collects with, and the learner
        reads it back with each sample (policy lag). The uniform and the FIFO selectors ignore
        priorities, so sampling is unchanged (0 is allowed). A window that spans a weight pull
        carries the step at the item's creation, i.e. of its newest step.
        """
        for writer in self.writers:
            writer.priority = float(train_step)

    def give_up_waiting_when(self, interrupted: Callable[[], bool]) -> None:
        """Writes held back by the server (a samples-per-insert ratio, a full queue) raise WriterInterrupted
        once `interrupted()` is true, instead of waiting for ever (a collector that must stop)."""
        for writer in self.writers:
            writer.give_up_when(interrupted)

    def flush(self) -> None:
        """Creates the waiting windows' items (`priorities`), then waits until every item is in the tables."""
        self.create_waiting()
        for writer in self.writers:
            writer.flush()

    def create_waiting(self) -> None:
        """The windows waiting for their priorities (`priorities`), all in one call, become items."""
        if self._priorities is None:
            return
        counts = [len(writer.waiting) for writer in self.writers]
        if not sum(counts):
            return
        priorities = self._priorities(np.stack([rows for writer in self.writers for _, _, rows in writer.waiting]))
        for writer, start, count in zip(self.writers, np.cumsum([0] + counts), counts):
            writer.create_waiting(priorities[start:start + count])

    def forget(self) -> None:
        """Drops the steps held for the next windows (after a clear) and restarts the numbering."""
        for writer in self.writers:
            writer.forget()
        self._indices = itertools.count()

    def close(self) -> None:
        try:
            self.create_waiting()
        except Exception:  # pylint: disable=broad-except  # closing on an error: those windows are dropped
            log.debug("the waiting windows' priorities failed", exc_info=True)
        for writer in self.writers:
            try:
                writer.close()
            except Exception:  # pylint: disable=broad-except
                log.debug("reverb writer close failed", exc_info=True)
