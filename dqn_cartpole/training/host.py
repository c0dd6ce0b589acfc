"""The process a run lives in: a process of its own (the CLI), or one it shares with other work that goes on after
it (the Python API in a notebook's kernel, a worker that trains one run after another).

A run that owns its process may change it for good: it freezes the heap (`gc.freeze`, so exiting is fast) and runs
TensorFlow's ops on one thread, and its times count from the process's start, as the person who typed the command
counts them. A run in a shared process changes nothing that outlives it, so every object it made can be freed when
it ends, and its wall and CPU seconds count from its own start: a second run reports its own times, not the
process's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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
