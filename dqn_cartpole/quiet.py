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
