"""The process a run lives in: a process of its own (the CLI), or one it shares with other work that goes on after
it (the Python API in a notebook's kernel, a worker that trains one run after another).

A run that owns its process may change it for good: it freezes the heap (`gc.freeze`: the ~0.5 million long-lived
objects of TensorFlow and a traced graph, which full collections walked, the last at exit taking 2-6 s after the
summary; frozen, the exit takes ~0.2 s, and garbage among them costs a few MB) and runs TensorFlow's ops on one thread,
and its times count from the process's start, as the person who typed the command counts them. A run in a shared
process changes nothing that outlives it, so every object it made can be freed when it ends, and its wall and CPU
seconds count from its own start: a second run reports its own times, not the process's.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterator

from dqn_cartpole.processes.start_time import process_start_time


@dataclass(frozen=True)
class Host:
    """Where a run's clocks start, and whether it may change process-wide settings."""

    started: float  # Unix time the run's wall seconds count from
    cpu_started: float  # `time.process_time()` its CPU seconds count from
    owns_process: bool  # the process ends with the run: it may freeze the heap and set TensorFlow's threads


def own_process() -> Host:
    """A run that is its process's only work, from the process's start to its exit (the CLI, a role)."""
    return Host(started=process_start_time(), cpu_started=0.0, owns_process=True)


def shared_process() -> Host:
    """A run in a process that goes on after it: its clocks start now, and it leaves the process as it found it."""
    return Host(started=time.time(), cpu_started=time.process_time(), owns_process=False)


CUSTOM_GRADIENT_PREFIX = "CustomGradient-"  # tf.custom_gradient's names in TensorFlow's gradient registry


@contextlib.contextmanager
def custom_gradients_released() -> Iterator[None]:
    """Drops the gradient functions `tf.custom_gradient` registered while the block ran.

    In graph mode each use of a custom gradient registers its gradient function in TensorFlow's global gradient
    registry, for good, and the function holds the graph it was traced in: Keras' legacy optimizer does so in
    every traced train step (its `apply_gradients` sums the gradients through the default strategy's
    `all_reduce`), so each run in a process kept its traced train step alive after it ended (356 graph ops,
    ~2,550 Python objects a smoke run). Once the run ends nothing differentiates through its graphs again.
    (The registry is TensorFlow's private `_registry`, pinned at 2.15; without it this does nothing.)
    """
    from tensorflow.python.framework import ops  # pylint: disable=import-outside-toplevel

    registry = getattr(getattr(ops, "gradient_registry", None), "_registry", None)
    before = set(registry) if isinstance(registry, dict) else None
    try:
        yield
    finally:
        if before is not None:
            for name in set(registry) - before:
                if name.startswith(CUSTOM_GRADIENT_PREFIX):
                    del registry[name]
