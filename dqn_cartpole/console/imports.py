"""Importing TensorFlow and the libraries built on it: quietly, and without the garbage collector.

TensorFlow, TF-Agents, TF Probability, gymnasium and Reverb create about half a million objects on
import, and every one of them lives as long as the process. While they are being created, Python's
automatic full collections walk all of them again and again: measured here, 0.9 s of CPU out of an
import of 3.8 s. `heavy_imports` pauses the collector around the block's imports, then freezes what
they made (`gc.freeze`: out of the collector's reach for good, which costs nothing as it is never
garbage) and turns the collector back on.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

from dqn_cartpole.console.quiet import silence


@contextlib.contextmanager
def heavy_imports() -> Iterator[None]:
    """`silence()` (which imports TensorFlow), then the block's imports, with the collector paused."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        silence()
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
