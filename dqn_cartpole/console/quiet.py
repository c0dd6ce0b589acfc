"""Silences TensorFlow, absl, gym and SDL start-up noise. Import before TensorFlow."""

from __future__ import annotations

import contextlib
import io
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
    # tf_agents.environments imports the legacy `gym`, which prints a notice to stderr on import.
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            import gym  # noqa: F401
        except ImportError:  # pragma: no cover - tf-agents always brings gym
            pass
    import absl.logging

    absl.logging.set_verbosity(absl.logging.ERROR)
    with NativeStderrFilter(TF_IMPORT_NOISE):  # shown when the user exported TF_CPP_MIN_LOG_LEVEL<3
        import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    tf.autograph.set_verbosity(0)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)


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
