"""Reverb's client side: the replay the learner reads (`ReverbReplay`) and the fast reader it uses.

It knows the server only by its address (a server in this process is read without gRPC).
Starting and stopping servers is `replay.reverb_tables`' job; writing is `replay.reverb_writers`'.
Reads go through `fast_dataset`: raw `reverb.TrajectoryDataset` streams, each batched,
interleaved, with no per-item maps (Acme's `make_reverb_dataset`), each batch of packed windows
unpacked at once (`replay.packing`). TF-Agents' `ReverbReplayBuffer.as_dataset` ran two maps on
every item before batching, which quadrupled the client's CPU per item.
"""

from __future__ import annotations

import gc
import logging
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.errors import UserError
from dqn_cartpole.replay import deadlines
from dqn_cartpole.replay.base import Replay, boundary_steps, unstack_time
from dqn_cartpole.replay.packing import StepPacker
from dqn_cartpole.replay.prioritized import INITIAL_MAX_PRIORITY, PrioritizedBatch
from dqn_cartpole.replay.reverb_tables import PASS_TABLE_NAME, TABLE_NAME
from dqn_cartpole.replay.reverb_writers import StreamWriters

log = logging.getLogger(__name__)

_VISITED = float(2**62)  # above every insertion index: a visited item sinks to the bottom of the heap


def packed_dataset(address: str, table: str, packer: StepPacker, sequence_length: int, *,
                   in_flight: int, workers: int = -1, rate_limiter_timeout_ms: int = -1) -> tf.data.Dataset:
    """One raw stream of `table`'s items: ReplaySample(info, data=[packed window [sequence_length, nbytes]]).

    The dtype and shape come from the packer, so building it makes no call to the server.
    `in_flight` samples are requested at a time; a FIFO table needs `workers=1`.
    """
    import reverb

    window = packer.window_spec(sequence_length)
    return reverb.TrajectoryDataset(address, table, dtypes=[window.dtype], shapes=[window.shape],
                                    max_in_flight_samples_per_worker=in_flight, num_workers_per_iterator=workers,
                                    rate_limiter_timeout_ms=rate_limiter_timeout_ms)


def fast_dataset(address: str, table: str, packer: StepPacker, sequence_length: int, batch_size: int, streams: int,
                 in_flight: Optional[int] = None, workers: int = -1, rate_limiter_timeout_ms: int = -1
                 ) -> tf.data.Dataset:
    """(items [batch, sequence_length, ...], SampleInfo of [batch] fields) from `table`, as Acme reads Reverb.

    `streams` raw streams (`packed_dataset`), each batching its own items (`in_flight` samples
    requested at a time, default 2 x batch), interleaved; nothing runs per item. Each batch of
    packed windows is unpacked at once.
    """

    def stream(_: tf.Tensor) -> tf.data.Dataset:
        return packed_dataset(address, table, packer, sequence_length, in_flight=in_flight or 2 * batch_size,
                              workers=workers, rate_limiter_timeout_ms=rate_limiter_timeout_ms
                              ).batch(batch_size, drop_remainder=True)

    if streams == 1:
        dataset = stream(tf.constant(0, tf.int64))
    else:
        dataset = tf.data.Dataset.range(streams).interleave(stream, cycle_length=streams, num_parallel_calls=streams,
                                                            deterministic=False)
    return dataset.map(lambda sample: (packer.unpack(sample.data[0]), sample.info))  # once per batch


class ReverbReplay(Replay):
    """A client of a Reverb server's uniform table of windows of the agent's `window_length` steps."""

    backend = "reverb"

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig, sequence_length: int, address: str,
                 rate_limiter_timeout_ms: int = -1):
        """`address` is the server's HOST:PORT (a server in this process is read without gRPC).

        `rate_limiter_timeout_ms` >= 0 makes a sample that waits that long fail (-1: wait forever).
        """
        import reverb

        # No TF-Agents buffer: its reads cannot unpack the packed windows, and `fast_dataset` replaces them.
        super().__init__(None, data_spec, num_envs, config)
        self.sequence_length, self.address, self.rate_limiter_timeout_ms = sequence_length, address, rate_limiter_timeout_ms
        self.packer = StepPacker(data_spec)
        self.client = reverb.Client(address)
        self._counts_source: Optional[Callable[[], Optional[dict]]] = None
        self.check_signature()
        # A restored checkpoint brings its items and insert count back: continue the numbering.
        self.writers = StreamWriters(self.client, data_spec, num_envs, sequence_length, (TABLE_NAME, PASS_TABLE_NAME),
                                     first_index=self._pass_inserts())
        self._cleared_inserts = self._cleared_samples = 0
        self._closed = False

    def check_signature(self) -> None:
        """A table restored from an older checkpoint (a column per field) cannot take packed windows: one line."""
        expected = self.packer.window_spec(self.sequence_length)
        signature = deadlines.server_info(self.client)[TABLE_NAME].signature
        if tf.nest.flatten(signature) != [expected]:
            raise UserError(f"the Reverb table at {self.address} holds {tf.nest.flatten(signature)} per item, not this "
                            f"version's packed windows {expected} (a checkpoint written by an older version?); start "
                            f"a new run, or resume it with the version that wrote it")

    def counts_from(self, source: Callable[[], Optional[dict]]) -> None:
        """Reads the counts (size, inserts, samples) from `source()`, a recent `server_info` kept by someone
        else (a learner's background watch), instead of asking the server each time."""
        self._counts_source = source

    # -- writing
    def add_batch(self, items: Any) -> Any:
        return self.writers.add_batch(items)

    def held_steps(self) -> list:
        held = self.writers.held_steps()
        return super().held_steps() if held is None else held

    def write_seam(self, observations: np.ndarray, held: list) -> None:
        # A new process's writers hold nothing: give them back the steps held at the checkpoint,
        # then end the episode, so those steps start their windows too.
        self.writers.give_back(held)
        self.add_batch(boundary_steps(self.data_spec, observations))
        self.flush()

    def tag_items(self, train_step: int) -> None:
        """See `StreamWriters.tag_items`."""
        self.writers.tag_items(train_step)

    def give_up_waiting_when(self, interrupted: Callable[[], bool]) -> None:
        """See `StreamWriters.give_up_waiting_when`."""
        self.writers.give_up_waiting_when(interrupted)

    def flush(self) -> None:
        """Waits until every item created so far is in the tables."""
        self.writers.flush()

    # -- reading
    def as_dataset(self, sample_batch_size: int, num_steps: int) -> tf.data.Dataset:
        """Uniform batches (info fields [batch]) of windows of `num_steps` <= sequence_length steps: the first
        `num_steps` steps of whole items (every stored step starts one item, so they are uniform too)."""
        if not 0 < num_steps <= self.sequence_length:
            raise ValueError(f"Reverb holds windows of {self.sequence_length} steps; cannot read {num_steps}")
        self.flush()
        dataset = fast_dataset(self.address, TABLE_NAME, self.packer, self.sequence_length, sample_batch_size,
                               streams=self.config.reverb_max_cycle_length,
                               in_flight=self.config.reverb_dataset_buffer_size,
                               workers=self.config.reverb_num_workers_per_iterator,
                               rate_limiter_timeout_ms=self.rate_limiter_timeout_ms)
        if num_steps < self.sequence_length:
            dataset = dataset.map(lambda items, info: (tf.nest.map_structure(lambda t: t[:, :num_steps], items), info))
        return dataset.prefetch(self.config.prefetch)

    def sampler(self, sample_batch_size: int, num_steps: int, with_tags: bool = False) -> Callable[[], Any]:
        if not with_tags:
            return super().sampler(sample_batch_size, num_steps)
        iterator = iter(self.as_dataset(sample_batch_size, num_steps))
        self._iterators.append(iterator)

        def sample() -> tuple:
            items, info = iterator.get_next()
            return items, info.priority  # the collecting train step of each item

        return sample

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        # Reverb has no get_next: take one batch of a fresh dataset instead. With num_steps=None
        # the uniform buffers return single steps; so does this.
        items, info = next(iter(self.as_dataset(sample_batch_size or 1, num_steps or 1)))
        if sample_batch_size is None:
            items, info = tf.nest.map_structure(lambda t: t[0], (items, info))
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
        count = int(deadlines.server_info(self.client)[PASS_TABLE_NAME].current_size)
        items, priorities = [], {}
        try:
            for _ in range(count):
                sample = deadlines.sample_one(self.client, PASS_TABLE_NAME, "replay call", emit_timesteps=False)
                priorities[sample.info.key] = sample.info.priority
                self._within(lambda: self.client.mutate_priorities(PASS_TABLE_NAME, updates={sample.info.key: _VISITED}))
                items.append(sample.data[0])
        finally:
            if priorities:
                self._within(lambda: self.client.mutate_priorities(PASS_TABLE_NAME, updates=priorities))
        rows = np.stack(items) if items else np.zeros((0, self.sequence_length, self.packer.nbytes), np.uint8)
        return self.packer.unpack_numpy(rows)

    def clear(self) -> None:
        self.flush()
        self._cleared_inserts, self._cleared_samples = self.inserts(), self.samples()
        for name in (TABLE_NAME, PASS_TABLE_NAME):
            self._within(lambda name=name: self.client.reset(name))  # also resets the table's insert count
        self.writers.forget()

    # -- bookkeeping
    def _table_info(self, name: str = TABLE_NAME) -> Any:
        info = self._counts_source() if self._counts_source is not None else None
        return (info if info is not None else deadlines.server_info(self.client))[name]

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
        """Writes a Reverb checkpoint of the tables; returns its path (ServerUnanswered if the server is gone)."""
        self.flush()
        return deadlines.checkpoint(self.client)

    @staticmethod
    def _within(call: Callable[[], Any]) -> Any:
        return deadlines.within(deadlines.CALL_TIMEOUT_S, call, "replay call")

    def close(self) -> None:
        """Closes the writers and readers; the server, owned by whoever started it, keeps running."""
        if self._closed:
            return
        self._closed = True
        # Dataset iterators left alive keep their sampler threads retrying a stopped server.
        super().close()
        gc.collect()
        self.writers.close()


class BackgroundPriorities:
    """Writes a learner's new priorities to a server in another process from a thread of their own, so a compiled
    chunk never waits on the server: Reverb's in-graph update waits for ever for a server that is gone (the chunk
    could not be cancelled, nor the learner stopped), and a table restarted on its port answers it only then.

    `put` (in the graph, through a numpy_function) hands a batch over; the thread writes what has piled up since its
    last write in one call, within a deadline. A write the server does not take (gone, restarted) is dropped: its
    items' priorities are lost with the server, or stay as the restored table holds them.
    """

    def __init__(self, client: Any, table: str):
        import queue
        import threading

        self.client, self.table = client, table
        self.written = self.dropped = 0  # batches
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="priority writer", daemon=True)
        self._thread.start()

    def put(self, keys: np.ndarray, priorities: np.ndarray) -> np.ndarray:
        self._pending.put((keys, priorities))
        return np.array(len(keys), np.int64)

    def _run(self) -> None:
        import queue

        while not self._closed.is_set():
            try:
                batches = [self._pending.get(timeout=0.2)]
            except queue.Empty:
                continue
            while True:
                try:
                    batches.append(self._pending.get_nowait())
                except queue.Empty:
                    break
            updates = {int(key): float(value) for keys, values in batches for key, value in zip(keys, values)}
            try:
                deadlines.within(deadlines.CALL_TIMEOUT_S,
                                 lambda: self.client.mutate_priorities(self.table, updates=updates),
                                 "write the priorities")
                self.written += len(batches)
            except deadlines.ServerProblem:
                self.dropped += len(batches)
                log.debug("priorities not written", exc_info=True)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=1.0)  # a write stuck on a gone server is left behind (a daemon thread)


class PrioritizedReverbReplay(ReverbReplay):
    """A client of a Reverb server whose training table has a `Prioritized` selector (`replay.prioritized`).

    Reverb keeps the priorities, their sums and the probabilities it samples with. This client writes each new item
    at the largest priority written so far (`max_priority`, a variable a checkpoint keeps: Reverb's table checkpoint
    keeps the items' own priorities), samples `PrioritizedBatch`es, and writes the learner's new priorities back:
    with one in-graph op per batch (`TFClient.update_priorities`) to a server of its own process, or, to a server in
    another process (`in_background`: a learner's), through `BackgroundPriorities`.
    """

    def __init__(self, data_spec: Any, num_envs: int, config: ReplayConfig, sequence_length: int, address: str,
                 rate_limiter_timeout_ms: int = -1, in_background: bool = False):
        super().__init__(data_spec, num_envs, config, sequence_length, address, rate_limiter_timeout_ms)
        self.max_priority = tf.Variable(INITIAL_MAX_PRIORITY, dtype=tf.float64, trainable=False, name="max_priority")
        self.background = BackgroundPriorities(self.client, TABLE_NAME) if in_background else None

    # -- writing: new items at the largest priority seen
    def add_batch(self, items: Any) -> Any:
        if tf.executing_eagerly():
            return self._add_at(self.max_priority.numpy(), *[np.asarray(t) for t in tf.nest.flatten(items)])
        return tf.numpy_function(self._add_at, [self.max_priority.read_value()] + tf.nest.flatten(items), [],
                                 stateful=True, name="reverb_prioritized_add")

    def _add_at(self, priority: np.ndarray, *flat: np.ndarray) -> None:
        for writer in self.writers.writers:
            writer.priority = float(priority)
        self.writers.add_flat(*flat)

    # -- reading and writing back
    def prioritized_sampler(self, sample_batch_size: int, num_steps: int) -> Callable[[], Any]:
        iterator = iter(self.as_dataset(sample_batch_size, num_steps))
        self._iterators.append(iterator)

        def sample() -> PrioritizedBatch:
            items, info = iterator.get_next()
            return PrioritizedBatch(items, info.key, info.probability, info.table_size)

        return sample

    def update_priorities(self, keys: Any, priorities: Any) -> Any:
        priorities = tf.cast(priorities, tf.float64)
        written = self._write_priorities(tf.cast(keys, tf.uint64), priorities)
        with tf.control_dependencies([] if written is None else [written]):
            raised = self.max_priority.assign(tf.maximum(self.max_priority, tf.reduce_max(priorities)))
        return raised if written is None else tf.group(written, raised)

    def _write_priorities(self, keys: Any, priorities: Any) -> Any:
        """Hands a batch's new priorities to the server: the op that does it, or None (written already, eagerly)."""
        if self.background is not None:
            return tf.numpy_function(self.background.put, [keys, priorities], tf.int64, stateful=True,
                                     name="reverb_priorities_in_background")
        if tf.executing_eagerly():
            updates = dict(zip(np.asarray(keys).tolist(), priorities.numpy().tolist()))
            self._within(lambda: self.client.mutate_priorities(TABLE_NAME, updates=updates))
            return None
        import reverb

        # The client op made in the graph it runs in: a client resource made eagerly was gone from a resumed run's
        # compiled loop ("Resource ... ReverbClient does not exist").
        return reverb.TFClient(self.address).update_priorities(TABLE_NAME, keys, priorities)

    def priority_trackables(self) -> dict:
        return {"replay_max_priority": self.max_priority}

    def close(self) -> None:
        if self.background is not None:
            self.background.close()
        super().close()
