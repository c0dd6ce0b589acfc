"""A replay that lives on the learner: the collectors' windows reach it through a Reverb queue, and it keeps
them in its own in-graph uniform buffer, samples there and checkpoints them with the agent.

Sampling from a Reverb server costs about 50 µs per item over loopback, and a DQN learner samples a
batch (128 items in the default config) per gradient step: reading a server can never keep pace with
an in-graph buffer. Reading each *new* item once costs one item per env step instead. So here:

* collectors write (n_step + 1)-step windows into the server's queue table (`QUEUE_TABLE_NAME`)
  with the same writers as a Reverb replay (`StreamWriters`: every collected step starts one
  window, episode ends padded), each item tagged with the train step of the weights that
  collected it;
* `QueueReader` reads the queue inside the learner's compiled chunk: a raw
  `reverb.TrajectoryDataset` of one worker (a FIFO table needs one), no per-item maps;
* `LearnerSideReplay` (a `TFUniformReplay` whose items are windows) moves the items it reads
  into its buffer (one column) and samples batches of whole windows there, in program order;
* before each gradient step it reads as many items as keep the run's samples per insert (in whole
  reads of `read_batch` items, so it may hold up to `read_batch - 1` more):
  after `train_step` gradient steps of `batch_size` it holds
  `min_size + ceil(train_step x batch_size / samples_per_insert)` items. The queue's own rate
  limiter makes the collectors wait while it is full (the learner fell behind); the read waits
  while it is empty (the collectors fell behind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import tensorflow as tf
from tf_agents.specs import tensor_spec

from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.replay.base import to_numpy
from dqn_cartpole.replay.packing import StepPacker
from dqn_cartpole.replay.reverb_tables import QUEUE_TABLE_NAME
from dqn_cartpole.replay.uniform import ProgramOrderUniformReplayBuffer, TFUniformReplay, sample_windows

# Items the queue's reader requests ahead. They leave the queue when requested, so a learner that is killed
# loses them; a few are enough to hide the round trip.
READ_AHEAD = 8
# Items a learner takes from the queue per read. Each read is one call into the Reverb dataset (about 0.4 ms
# on 2 loaded cores, whatever it returns), so reading 8 at a time costs an eighth per gradient step; the
# learner then holds up to 7 windows more than its samples per insert asks for (the queue allows 25).
LEARNER_READ_BATCH = 8


@dataclass(frozen=True)
class LearnerRatio:
    """How many items the learner holds before a gradient step: `min_size`, then one per
    `samples_per_insert` sampled items (a batch of `batch_size` counts `batch_size`)."""

    samples_per_insert: float
    min_size: int
    batch_size: int

    def due(self, train_steps: int) -> int:
        """Items held once `train_steps` gradient steps have sampled (Python numbers)."""
        return self.min_size + math.ceil(train_steps * self.batch_size / self.samples_per_insert - 1e-9)

    def due_tensor(self, train_steps: tf.Tensor) -> tf.Tensor:
        """`due` inside the graph (int64)."""
        sampled = tf.cast(train_steps, tf.float64) * float(self.batch_size) / self.samples_per_insert
        return self.min_size + tf.cast(tf.math.ceil(sampled - 1e-9), tf.int64)


class QueueReader:
    """The learner's end of the queue: items ([sequence_length, ...] windows) and their tags, read in FIFO order,
    `read_batch` at a time."""

    def __init__(self, address: str, data_spec: Any, sequence_length: int, rate_limiter_timeout_ms: int = -1,
                 read_batch: int = 1):
        from dqn_cartpole.replay.reverb_client import packed_dataset

        self.packer, self.read_batch = StepPacker(data_spec), read_batch
        dataset = packed_dataset(address, QUEUE_TABLE_NAME, self.packer, sequence_length,
                                 in_flight=max(READ_AHEAD, read_batch), workers=1,
                                 rate_limiter_timeout_ms=rate_limiter_timeout_ms)
        # Whole reads only: when a read waits rate_limiter_timeout_ms the stream ends, and a partial last batch would
        # reach the buffer as missing rows (an InvalidArgumentError) instead of OutOfRangeError; its items are lost.
        self.iterator: Optional[Any] = iter(dataset.batch(read_batch, drop_remainder=True))

    def next(self) -> tuple[Any, tf.Tensor]:
        """(windows [read_batch, sequence_length, ...], the train steps that collected them [read_batch]) of the
        oldest items; waits until the queue has them.

        After `rate_limiter_timeout_ms` of waiting the dataset ends: tf.errors.OutOfRangeError.
        """
        sample = self.iterator.get_next()
        return self.packer.unpack(sample.data[0]), sample.info.priority

    def close(self) -> None:
        self.iterator = None


class LearnerSideReplay(TFUniformReplay):
    """The learner's own uniform buffer of windows (a TFUniformReplayBuffer of one column, whose items are
    (window, collecting train step)), filled from a `QueueReader` at the run's samples per insert."""

    backend = "learner"

    def __init__(self, data_spec: Any, config: ReplayConfig, sequence_length: int, reader: QueueReader,
                 ratio: LearnerRatio, train_step: tf.Variable):
        window = tensor_spec.add_outer_dim(tensor_spec.from_spec(data_spec), sequence_length)
        self.item_spec = (window, tf.TensorSpec([], tf.float64, name="collected_at"))
        super().__init__(self.item_spec, 1, config)  # size, inserts and clear count items, as they count steps
        self.sequence_length, self.reader, self.ratio, self.train_step = sequence_length, reader, ratio, train_step
        self._drain = tf.function(self.drain, autograph=False)

    @staticmethod
    def buffer_class(config: ReplayConfig) -> type:
        """Only the learner's own graph calls touch the buffer, one after another (the queue's reads, then the
        batch; a checkpoint between chunks): program order, so its writes need no lock."""
        return ProgramOrderUniformReplayBuffer

    # -- writing: only from the queue
    def drain(self, count: tf.Tensor) -> tf.Tensor:
        """Moves at least `count` items from the queue into the buffer (whole reads of `read_batch`), inside the
        graph; returns how many."""
        batch = self.reader.read_batch

        def add_one(windows: Any, tags: tf.Tensor, j: tf.Tensor) -> tf.Tensor:
            item = (tf.nest.map_structure(lambda t: t[j:j + 1], windows), tags[j:j + 1])
            with tf.control_dependencies([self.buffer.add_batch(item)]):
                return j + 1

        def move_read(i: tf.Tensor) -> tf.Tensor:
            windows, tags = self.reader.next()
            added = tf.while_loop(lambda j: j < batch, lambda j: (add_one(windows, tags, j),), (tf.constant(0),))[0]
            with tf.control_dependencies([added]):
                return i + batch

        count = tf.cast(count, tf.int64)
        return tf.while_loop(lambda i: i < count, lambda i: (move_read(i),), (tf.constant(0, tf.int64),))[0]

    def read(self, count: int) -> None:
        """Moves at least `count` items (whole reads) from the queue into the buffer now (waiting for them as the
        sampler does)."""
        self._drain(tf.constant(count, tf.int64))

    def fill(self, stopped: Callable[[], bool], chunk: int = 100) -> bool:
        """Reads until the buffer holds what the next gradient step needs (`initial_collect_steps` at first),
        `chunk` items per call; False if `stopped()` first."""
        due = self.ratio.due(int(self.train_step.numpy()))
        while self.inserts() < due:
            if stopped():
                return False
            self.read(min(chunk, due - self.inserts()))
        return True

    # -- reading; the counts are the learner's own (no call to the server)
    def _inserts_tensor(self) -> tf.Tensor:
        return self._cleared_inserts + self.buffer._get_last_id() + 1  # pylint: disable=protected-access

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        """Uniform windows [batch?, sequence_length, ...] and their tags; `num_steps` must be the window length."""
        if num_steps not in (None, self.sequence_length):
            raise ValueError(f"this replay holds windows of {self.sequence_length} steps, not {num_steps}")
        if sample_batch_size is None:
            (windows, tags), _ = self.buffer.get_next()
        else:  # the ops a batch needs (sample_windows), not the library's get_next with its lock and probabilities
            windows, tags = sample_windows(self.buffer, sample_batch_size, None)
        if tf.executing_eagerly():
            return to_numpy(windows), to_numpy(tags)
        return windows, tags

    def sampler(self, sample_batch_size: int, num_steps: int, with_tags: bool = False) -> Callable[[], Any]:
        """Before each batch, reads from the queue what the ratio asks for the coming gradient step, then
        samples in program order (in the graph, after those items are in)."""
        if num_steps != self.sequence_length:
            raise ValueError(f"this replay holds windows of {self.sequence_length} steps, not {num_steps}")

        def sample() -> Any:
            missing = self.ratio.due_tensor(self.train_step + 1) - tf.cast(self._inserts_tensor(), tf.int64)
            read = self.drain(tf.maximum(missing, 0))
            with tf.control_dependencies([read]):
                windows, tags = self.get_next(sample_batch_size, num_steps)
            return (windows, tags) if with_tags else windows

        return sample

    def as_dataset(self, sample_batch_size: int, num_steps: int) -> tf.data.Dataset:
        raise NotImplementedError("a learner-side replay is sampled in the graph (sampler), not through tf.data")

    def single_pass(self) -> Any:
        """Every window once, oldest first: [items, sequence_length, ...] (as Reverb's single pass)."""
        windows, _ = super().single_pass()
        return tf.nest.map_structure(lambda a: a[0], windows)

    def close(self) -> None:
        super().close()
        self.reader.close()


