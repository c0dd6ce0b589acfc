"""Silences TensorFlow, absl, gym and SDL start-up noise. Import before TensorFlow."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings


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
    import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    tf.autograph.set_verbosity(0)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)


# C++ log lines that carry no information for the user (XLA announces its first compile once).
NATIVE_NOISE = ("absl::InitializeLog", "Compiled cluster using XLA", "device_compiler.h")


@contextlib.contextmanager
def filtered_native_stderr(noise: tuple = NATIVE_NOISE):
    """Captures what native code writes to fd 2 meanwhile, and re-emits all but known noise.

    TensorFlow's C++ (absl) logging ignores TF_CPP_MIN_LOG_LEVEL for a few lines, so the only
    way to keep them off the console is at the file-descriptor level.
    """
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not any(n in line for n in noise):
                    sys.stderr.write(line)
            sys.stderr.flush()


# Reverb's C++ side logs every server start, checkpoint and in-process sampler to fd 2.
REVERB_NOISE = ("[reverb/cc/",)


class NativeStderrFilter:
    """Routes fd 2 through a pipe and drops lines of known native noise while it runs.

    Everything else (Python's stderr, the progress bar's partial lines) is passed on at once;
    `stop()` restores fd 2, so a traceback raised later prints directly.
    """

    def __init__(self, noise: tuple = REVERB_NOISE):
        self.noise = noise
        self._saved_fd: "int | None" = None

    def start(self) -> "NativeStderrFilter":
        import sys
        import threading

        sys.stderr.flush()
        self._saved_fd = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread = threading.Thread(target=self._pump, args=(read_fd,), daemon=True, name="stderr-filter")
        self._thread.start()
        return self

    def _could_be_noise(self, text: bytes) -> bool:
        return any(n.encode().startswith(text[:len(n)]) for n in self.noise)

    def _pump(self, read_fd: int) -> None:
        pending = b""
        while True:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = b"".join(line + b"\n" for line in lines if not self._could_be_noise(line))
            if pending and not self._could_be_noise(pending):
                out, pending = out + pending, b""  # e.g. a progress bar redrawn with \r
            if out:
                os.write(self._saved_fd, out)
        if pending and not self._could_be_noise(pending):
            os.write(self._saved_fd, pending)
        os.close(read_fd)

    def stop(self) -> None:
        import sys

        if self._saved_fd is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved_fd, 2)  # drops the pipe's last writer: the pump drains and ends
        self._thread.join(timeout=2)
        os.close(self._saved_fd)
        self._saved_fd = None
