"""Silences TensorFlow, absl, gym and SDL start-up noise. Import before TensorFlow."""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
import warnings
from typing import Optional


def silence() -> None:
    """Keeps the console for the progress bar, actionable warnings and the summary."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # cuDNN/cuFFT factory and oneDNN notices
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame: no ALSA errors on headless machines
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(gym|gymnasium|tensorflow|tf_agents|keras)")
    silence_gym_notice()
    import absl.logging

    absl.logging.set_verbosity(absl.logging.ERROR)
    with NativeStderrFilter(TF_IMPORT_NOISE):  # shown when the user exported TF_CPP_MIN_LOG_LEVEL<3
        import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    tf.autograph.set_verbosity(0)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)


def silence_gym_notice() -> None:
    """Drops gym's "unmaintained since 2022" notice at its source, before gym is imported.

    TF-Agents 0.19 (pinned) imports the legacy `gym` package for its gym suite, and gym, on import, prints the
    notice that the `gym_notices` package keeps for its version: that gym is unmaintained and its user should move
    to gymnasium. This project already runs on gymnasium; the import is TF-Agents' and cannot be avoided at our
    pins, so the notice asks for nothing a user of this project can do. Its entries are removed from gym_notices'
    table (a notice of another kind, such as 0.24.0's warning about `gym.make`, is kept). Hiding stderr around our
    own `import gym` missed every import of gym that did not come through us first (a notebook that imports
    `dqn_cartpole.core` before training)."""
    if "gym" in sys.modules:
        return
    try:
        from gym_notices import notices
    except ImportError:  # no gym_notices: gym prints nothing
        return
    for version, text in list(notices.notices.items()):
        if text.startswith("Gym has been unmaintained"):
            del notices.notices[version]


def in_jupyter() -> bool:
    """Whether this process is a Jupyter kernel (IPython's kernel app), as `tqdm.auto` decides it."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


_KERNEL_FILTER: Optional["NativeStderrFilter"] = None


def filter_kernel_stderr() -> None:
    """In a Jupyter kernel, filters the native noise (`ALL_NOISE`) out of its stderr for the kernel's life.

    The commands filter it around what they run; a notebook imports TensorFlow, TF-Agents and Reverb in its own
    cells (`from dqn_cartpole.core.envs import ...`), whose C++ lines (TF's cuDNN/cuFFT/cuBLAS `E` lines, its CPU
    notices, Reverb's info lines) reach the cell's output through the kernel's fd 2. So in a kernel the filter
    stays in place from `import dqn_cartpole` on; it passes everything else (Python's stderr, the libraries'
    real warnings and errors) through, and is stopped when the kernel exits. Elsewhere (a script, the CLI) it does
    nothing: a process-wide pipe on fd 2 would outlive what a crash prints."""
    global _KERNEL_FILTER  # pylint: disable=global-statement
    if _KERNEL_FILTER is not None or not in_jupyter():
        return
    _KERNEL_FILTER = NativeStderrFilter().start()
    atexit.register(_KERNEL_FILTER.stop)


# C++ log lines that carry no information for the user (XLA announces its first compile once).
NATIVE_NOISE = ("absl::InitializeLog", "Compiled cluster using XLA", "device_compiler.h",
                "SetPriority unimplemented for this stream")
# What importing TensorFlow prints on a machine without a GPU unless TF_CPP_MIN_LOG_LEVEL is 3.
TF_IMPORT_NOISE = ("Unable to register cuDNN factory", "Unable to register cuFFT factory",
                   "Unable to register cuBLAS factory", "TF-TRT Warning", "oneDNN custom operations",
                   "This TensorFlow binary is optimized", "rebuild TensorFlow with the appropriate compiler flags",
                   "Could not find cuda drivers", "Cannot dlopen some GPU libraries")
# Reverb's C++ info lines (server start and stop, in-process sampling, checkpoints). Its lines
# carry no severity, so only these known messages are dropped: errors and warnings stay visible.
REVERB_NOISE = ("Sampler and server are owned by the same process", "Started replay server on port",
                "Shutting down replay server", "Initializing TFRecordCheckpointer in", "Loading latest checkpoint from",
                "Stored checkpoint to", "No checkpoint found in", "Loading checkpoint from",
                "Loading and verifying metadata of the checkpointed tables",
                "Completed reading compressed trajectory data", "items have been successfully loaded from checkpoint")
ALL_NOISE = NATIVE_NOISE + TF_IMPORT_NOISE + REVERB_NOISE
# Native log lines start with "[reverb/cc/..." (Reverb) or a date (TensorFlow, absl).
_LOG_LINE_START = re.compile(rb"^(\[|\d)")


class NativeStderrFilter:
    """Routes fd 2 through a pipe and drops the lines that contain known native noise.

    TensorFlow's and Reverb's C++ logging ignore Python's logging settings (and TensorFlow's
    ignores TF_CPP_MIN_LOG_LEVEL for a few lines), so the only way to keep them off the console
    is at the file-descriptor level. Everything else is passed on as it comes: Python's stderr,
    errors and warnings of the native libraries, and partial lines such as the progress bar's
    (only a partial line that starts like a native log line is held until its end). Use it as a
    context manager, or `start()` / `stop()` around a long-lived resource; `stop()` restores
    fd 2, so a traceback raised later prints directly.
    """

    def __init__(self, noise: tuple = ALL_NOISE):
        self.noise = tuple(n.encode() for n in noise)
        self._saved_fd: Optional[int] = None
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "NativeStderrFilter":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> "NativeStderrFilter":
        sys.stderr.flush()
        self._saved_fd = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread = threading.Thread(target=self._pump, args=(read_fd,), daemon=True, name="stderr-filter")
        self._thread.start()
        return self

    def is_noise(self, line: bytes) -> bool:
        return any(n in line for n in self.noise)

    def _pump(self, read_fd: int) -> None:
        pending = b""
        while True:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = b"".join(line + b"\n" for line in lines if not self.is_noise(line))
            if pending and not _LOG_LINE_START.match(pending):
                out, pending = out + pending, b""  # e.g. a progress bar redrawn with \r
            if out:
                os.write(self._saved_fd, out)
        if pending and not self.is_noise(pending):
            os.write(self._saved_fd, pending)
        os.close(read_fd)

    def stop(self) -> None:
        if self._saved_fd is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved_fd, 2)  # drops the pipe's last writer: the pump drains and ends
        self._thread.join(timeout=2)
        os.close(self._saved_fd)
        self._saved_fd = None
