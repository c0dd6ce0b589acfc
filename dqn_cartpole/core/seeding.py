"""One seeding helper for Python, NumPy and TensorFlow (the envs are seeded through reset)."""

from __future__ import annotations

import random

import numpy as np
import tensorflow as tf


def seed_everything(seed: int) -> None:
    """Seeds Python's, NumPy's and TensorFlow's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
