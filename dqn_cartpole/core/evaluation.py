"""Greedy evaluation: N episodes side by side in a batched env, the whole loop in one graph call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf
from tf_agents.environments import tf_py_environment

from dqn_cartpole.core.envs import BatchedGymnasiumEnvironment


@dataclass(frozen=True)
class EvalResult:
    """Per-episode returns and lengths of one evaluation."""

    returns: np.ndarray
    lengths: np.ndarray

    @property
    def average_return(self) -> float:
        return float(np.mean(self.returns))

    @property
    def average_length(self) -> float:
        return float(np.mean(self.lengths))


def make_episode_runner(policy, env: BatchedGymnasiumEnvironment) -> Callable[[], EvalResult]:
    """Returns run() -> EvalResult: exactly one episode in each of the env's `batch_size` copies.

    `policy` is an in-memory TFPolicy or one loaded with `tf.saved_model.load`. The episode
    loop (policy call, env step, bookkeeping) is compiled once, which makes a step ~3x cheaper
    than calling the policy from Python. Copies that finish early are reset by the vector env
    but no longer counted.
    """
    tf_env = tf_py_environment.TFPyEnvironment(env)
    n = env.batch_size

    def step(time_step, returns, lengths, done):
        time_step = tf_env.step(policy.action(time_step).action)
        active = ~done
        returns += tf.where(active, time_step.reward, 0.0)
        lengths += tf.cast(active, tf.int32)
        return time_step, returns, lengths, done | time_step.is_last()

    @tf.function(autograph=False)
    def episodes():
        start = (tf_env.reset(), tf.zeros([n]), tf.zeros([n], tf.int32), tf.zeros([n], tf.bool))
        _, returns, lengths, _ = tf.while_loop(lambda *state: ~tf.reduce_all(state[3]), step, start)
        return returns, lengths

    def run() -> EvalResult:
        returns, lengths = episodes()
        return EvalResult(returns=returns.numpy().astype(np.float64), lengths=lengths.numpy().astype(np.int64))

    return run
