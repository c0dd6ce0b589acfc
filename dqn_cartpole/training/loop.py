"""The compiled loop: many iterations of (collect, sample, train) per TensorFlow call, in chunks.

Speed comes from amortising TensorFlow's per-call cost: collection (a TF-Agents
`DynamicStepDriver`), sampling and the gradient step for many iterations run inside a single
compiled call, and Python only wakes up when a trigger (log, eval, checkpoint) is due or a stop
is requested. A learner that reads a dataset and collects nothing passes no driver.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from dqn_cartpole.console.quiet import NativeStderrFilter
from dqn_cartpole.core import build

# A stop request (Ctrl-C, SIGTERM) waits for the compiled call in flight: keep each one about this short.
STOP_LATENCY_S = 0.25
FIRST_CHUNK = 100  # iterations in the first calls, before their speed is known


def run_ops_on_one_thread() -> bool:
    """Makes TensorFlow run ops on one thread (inter-op and intra-op): call it before TF runs its first op.

    The compiled loop is a chain of small ops, each waiting for the one before, with a gradient
    step too small to split: a second thread has nothing to run, and every hand-off between threads
    costs a wake-up, which on a shared or virtual machine can cost more than the op. Measured on the
    tutorial's hyperparameters (tf_uniform, compiled, 2 busy cores): 600-700 us of CPU per iteration
    instead of 900-1,000, and the wall time follows. Returns False, changing nothing, once
    TensorFlow has started.
    """
    try:
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
    except RuntimeError:  # TensorFlow has already started (e.g. a test that trains in-process)
        return False
    return True


def gradient_step(agent: Any, jit_compile: bool) -> Callable[[Any], tf.Tensor]:
    """The agent's update on one batch of experience, as a graph function returning its loss.

    `jit_compile` compiles it with XLA. Alone, a DQN step of these sizes runs ~30% faster with XLA;
    inside the compiled loop it ran slower (at the tutorial's settings 340-370 us per sample and step
    instead of 210-215, and 0.3-0.4 s more to trace and compile), as launching the XLA cluster and
    moving its inputs cost more than the fusion saves. So the configs leave it off.
    """
    return tf.function(lambda experience: agent.train(experience).loss, jit_compile=jit_compile, autograph=False)


def repeat_steps(once: Callable[[], tf.Tensor], train_steps: int, initial: tf.Tensor) -> Callable[[], tf.Tensor]:
    """`train_steps` calls of `once` (one gradient step each) in one graph, returning the last one's output
    (shaped like `initial`)."""

    def train_many() -> tf.Tensor:
        if train_steps == 1:
            return once()
        _, outputs = tf.while_loop(lambda j, _: j < train_steps, lambda j, _: (j + 1, once()),
                                   (tf.constant(0), initial))
        return outputs

    return train_many


def make_train_step(agent: Any, sample: Callable[[], Any], train_steps: int, jit_compile: bool) -> Callable:
    """`train_steps` gradient steps on fresh samples, as one graph function returning the last loss.

    A way of running that wants more from each step than its loss builds it from `gradient_step` and
    `repeat_steps` (a learner's policy lag: `distributed.policy_lag.make_lagged_train_step`).
    """
    step = gradient_step(agent, jit_compile)
    return repeat_steps(lambda: step(sample()), train_steps, tf.constant(0.0))


def compile_iterations(train: Callable[[], tf.Tensor], driver: Optional[Any] = None) -> Callable:
    """Compiles `num_iterations` x (collect with `driver`, if any, then `train`) into one graph call.

    Returns f(time_step, policy_state, num_iterations) -> (time_step, policy_state, losses): the
    losses are [num_iterations], or [num_iterations, k] when `train` returns a vector per step (loss first).
    """

    # autograph=False: TF-Agents is written for graph mode, and skipping autograph cuts the
    # first trace of agent.train from ~6 s to ~0.3 s.
    @tf.function(autograph=False)
    def run_iterations(time_step, policy_state, num_iterations):
        def body(i, time_step, policy_state, losses):
            if driver is not None:
                time_step, policy_state = driver.run(time_step, policy_state)
            # A TF driver returns its time step after its observers wrote the step: the train step's samples come
            # after the writes (py_uniform's write and sample are numpy ops with no order of their own).
            with tf.control_dependencies(tf.nest.flatten(time_step)):
                return i + 1, time_step, policy_state, losses.write(i, train())

        losses = tf.TensorArray(tf.float32, size=num_iterations)
        _, time_step, policy_state, losses = tf.while_loop(
            lambda i, *_: i < num_iterations, body, (tf.constant(0), time_step, policy_state, losses))
        return time_step, policy_state, losses.stack()

    return run_iterations


def python_iterations(train: Callable[[], tf.Tensor], collection: Any) -> Callable:
    """The tutorial's loop, with the signature of `compile_iterations`' result: per iteration, a Python
    `PyDriver` collects (`collection`, a `build.PyCollection`), then one compiled call trains.

    The driver's time steps are numpy (the Python env's). The compiled call is a concrete function
    (no per-call lookup of a trace); for a buffer that lives in the graph it first writes the
    iteration's steps, which the driver's stash kept. The run's env-step metric is brought up to
    date once per chunk. Its outputs are `compile_iterations`' ([num_iterations] or [num_iterations, k]).
    """
    stash = collection.stash
    if stash is None:
        call = tf.function(train, autograph=False).get_concrete_function()
        iteration = call
    else:
        def write_then_train(steps: Any) -> tf.Tensor:
            with tf.control_dependencies([stash.add_all(steps)]):
                return train()

        call = tf.function(write_then_train, input_signature=[stash.signature], autograph=False).get_concrete_function()
        iteration = lambda: call(stash.take())  # noqa: E731

    def run_iterations(time_step, policy_state, num_iterations):
        outputs = []  # a loss per iteration, or a vector (loss first: prioritized replay's train step)
        for _ in range(int(num_iterations)):
            time_step, policy_state = collection.driver.run(time_step, policy_state)
            outputs.append(iteration().numpy())
        collection.count()
        return time_step, policy_state, tf.constant(np.asarray(outputs, np.float32))

    return run_iterations


def make_iterations(train: Callable[[], tf.Tensor], collection: Any) -> Callable:
    """`compile_iterations` with a TF driver, or with none (the data come from other processes), or
    `python_iterations` with a Python driver (a `build.PyCollection`)."""
    if isinstance(collection, build.PyCollection):
        return python_iterations(train, collection)
    return compile_iterations(train, collection)


@dataclass
class Chunk:
    """One compiled call's outcome."""

    first: int  # the iteration it started at
    size: int
    time_step: Any
    policy_state: Any
    losses: np.ndarray
    extras: Optional[np.ndarray] = None  # [size, k]: what a train step returns after its loss (see `split_outputs`)

    def first_bad_loss(self) -> Optional[tuple[int, float]]:
        """(iteration, value) of the first NaN or Inf loss in the chunk, if any."""
        finite = np.isfinite(self.losses)
        if finite.all():
            return None
        bad = int(np.argmin(finite))
        return self.first + bad + 1, float(self.losses[bad])


class ChunkedLoop:
    """Runs the compiled iterations in chunks that end on every trigger's interval and stay short.

    A chunk never crosses a multiple of any of `intervals`, so triggers see exact iterations, and
    after the first (traced) call its size adapts so one call lasts about STOP_LATENCY_S.
    """

    def __init__(self, run_iterations: Callable, intervals: Sequence[int]):
        self.run_iterations = run_iterations
        self.intervals = list(intervals)
        self.max_chunk = FIRST_CHUNK
        self.traced = False
        self.loop_s = 0.0  # seconds in compiled calls after the first, which traces
        self.loop_iterations = 0

    def chunk_size(self, iteration: int, total: int) -> int:
        return min([total - iteration, self.max_chunk] + [i - iteration % i for i in self.intervals])

    def prepare(self, time_step_spec: Any, batch_size: int, policy_state: Any = ()) -> None:
        """Traces the compiled call and has TensorFlow optimise and instantiate its graph, with a call of 0 iterations
        (which runs no iteration and touches nothing): what the first `run` would otherwise do first. A stand-in
        time step of zeros is enough, since no step is taken."""
        time_step = tf.nest.map_structure(lambda spec: tf.zeros([batch_size, *spec.shape], spec.dtype), time_step_spec)
        with NativeStderrFilter():  # XLA's one-off notices
            self.run_iterations(time_step, policy_state, tf.constant(0))
        self.traced = True

    def run(self, iteration: int, total: int, time_step: Any, policy_state: Any) -> Chunk:
        size = self.chunk_size(iteration, total)
        started = time.perf_counter()
        first_call = not self.traced
        with NativeStderrFilter() if first_call else contextlib.nullcontext():  # XLA's one-off notices
            time_step, policy_state, losses = self.run_iterations(time_step, policy_state, tf.constant(size))
        self.traced = True
        losses, extras = split_outputs(losses.numpy())
        if not first_call:
            elapsed = time.perf_counter() - started
            self.loop_s += elapsed
            self.loop_iterations += size
            self.max_chunk = max(1, int(size * STOP_LATENCY_S / max(elapsed, 1e-6)))
        return Chunk(iteration, size, time_step, policy_state, losses, extras)


def split_outputs(outputs: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """A chunk's per-iteration outputs -> (losses, the values a train step returns after its loss, or None)."""
    if outputs.ndim == 1:
        return outputs, None
    return outputs[:, 0], outputs[:, 1:]
