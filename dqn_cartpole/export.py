"""Exports the greedy policy as a SavedModel with TF-Agents' PolicySaver, atomically."""

from __future__ import annotations

import os
import shutil

import tensorflow as tf
from tf_agents.policies import policy_saver


def make_saver(policy, train_step: tf.Variable) -> policy_saver.PolicySaver:
    """One saver per policy: it traces the policy once and reuses that for every save."""
    return policy_saver.PolicySaver(policy, batch_size=None, train_step=train_step)


def save_policy(saver: policy_saver.PolicySaver, path: str) -> str:
    """Writes the SavedModel under a temporary name, then swaps it in, so `path` is never half-written."""
    tmp, old = path + ".tmp", path + ".old"
    for stale in (tmp, old):
        shutil.rmtree(stale, ignore_errors=True)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    saver.save(tmp)
    if os.path.exists(path):
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def load_policy(path: str):
    """Loads a policy saved by `save_policy` (plain TensorFlow; no project code needed)."""
    return tf.saved_model.load(path)
