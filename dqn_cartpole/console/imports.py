"""Importing TensorFlow and the libraries built on it: quietly, and without the garbage collector.

TensorFlow, TF-Agents, TF Probability, gymnasium and Reverb create about half a million objects on
import, and every one of them lives as long as the process. While they are being created, Python's
automatic full collections walk all of them again and again: measured here, 0.9 s of CPU out of an
import of 3.8 s. `heavy_imports` pauses the collector around the block's imports, then freezes what
they made (`gc.freeze`: out of the collector's reach for good, which costs nothing as it is never
garbage) and turns the collector back on. A process that goes on after its runs (the Python API)
imports TensorFlow with `import_tensorflow()`, which freezes nothing.

It also lets the legacy `gym` (which TF-Agents imports) find Python's own distutils, not setuptools'
(`stdlib_distutils`), and turns TensorFlow's oneDNN kernels off (`TF_ENABLE_ONEDNN_OPTS=0`, unless the environment
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
        stdlib_distutils()
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
    with heavy_imports(freeze=False):
        pass


def stdlib_distutils() -> None:
    """Lets `import distutils` find Python's own instead of setuptools' copy, which imports all of setuptools.

    Nothing here uses distutils, but TF-Agents imports the legacy `gym`, whose video recorder imports
    `distutils.spawn`: through setuptools' shim (its `distutils-precedence.pth`) that imported setuptools, 0.2 s of
    CPU of the start-up (gym's import: 0.45 s, 0.24 s without it). Python 3.11 still has distutils (3.12 does not:
    there the shim stays)."""
    if sys.version_info >= (3, 12) or "distutils" in sys.modules:
        return
    try:
        import _distutils_hack
    except ImportError:  # no setuptools shim: nothing to do
        return
    _distutils_hack.remove_shim()
