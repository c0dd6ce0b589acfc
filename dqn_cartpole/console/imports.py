"""Importing TensorFlow and the libraries built on it: quietly, and without the garbage collector.

TensorFlow, TF-Agents, TF Probability, gymnasium and Reverb create about half a million objects on
import, and every one of them lives as long as the process. While they are being created, Python's
automatic full collections walk all of them again and again: measured here, 0.9 s of CPU out of an
import of 3.8 s. `heavy_imports` pauses the collector around the block's imports, then freezes what
they made (`gc.freeze`: out of the collector's reach for good, which costs nothing as it is never
garbage) and turns the collector back on. A process that goes on after its runs (the Python API)
imports TensorFlow with `import_tensorflow()`, which freezes nothing.

It also turns TensorFlow's oneDNN kernels off (`TF_ENABLE_ONEDNN_OPTS=0`, unless the environment
says otherwise): for a DQN's tiny matrices their set-up costs more than they save. Measured on the
default config's compiled loop, four processes each way side by side: 562-602 us per iteration
without them, 649-797 with them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import Iterator, Optional

from dqn_cartpole.console.quiet import silence


@contextlib.contextmanager
def heavy_imports(freeze: Optional[bool] = None) -> Iterator[None]:
    """`silence()` (which imports TensorFlow), then the block's imports, with the collector paused.

    `freeze` None: only the call that imports TensorFlow freezes the heap. A later one (a command the Python API
    reuses, in a process that goes on) imports little, and would make everything alive then permanent, the garbage
    the collector has not reached yet included.
    """
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # read once, when TensorFlow is imported
    if freeze is None:
        freeze = "tensorflow" not in sys.modules
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        silence()
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()


def import_tensorflow() -> None:
    """Imports TensorFlow quietly and with the collector paused, as `heavy_imports` does, but freezes nothing: for a
    process that goes on after its runs (a notebook's kernel), whose objects must stay collectable."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        silence()
    finally:
        if was_enabled:
            gc.enable()
