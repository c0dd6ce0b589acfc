"""Greedy evaluation: N episodes side by side in a batched env, in NumPy for the agent's own greedy policy
(`policies.NumpyGreedy`), else (a saved policy, any TF policy) with the whole loop in one graph call."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.environments import tf_py_environment

from dqn_cartpole.core.envs import BatchedGymnasiumEnvironment
from dqn_cartpole.core.numpy_episodes import EvalResult, run_episodes
from dqn_cartpole.core.policies import NumpyGreedy

__all__ = ["EvalResult", "make_episode_runner", "numpy_episode_runner"]


def make_episode_runner(policy, env: BatchedGymnasiumEnvironment, gamma: float = 1.0,
                        keep_actions: bool = False, give_up_below: Optional[float] = None,
                        max_return: Optional[float] = None) -> Callable[[], EvalResult]:
    """Returns run() -> EvalResult: exactly one episode in each of the env's `batch_size` copies.

    Each episode's discounted return uses `gamma` (the agent's discount, so it is comparable
    with the Q-values). `keep_actions` also returns every action taken and how each episode
    ended (what a video needs to replay the episodes).

    With `give_up_below` and the env's `max_return`, the run stops as soon as the average can no
    longer reach `give_up_below` (the finished episodes' returns, plus `max_return` for each
    unfinished one, fall short): the episodes still running are then cut, and the average is
    below `give_up_below` too.

    `policy` is a `NumpyGreedy` (its weights are read at the start of each run), an in-memory
    TFPolicy or one loaded with `tf.saved_model.load`. A TF policy's episode loop (policy call, env
    step, bookkeeping) is compiled once, which makes a step ~3x cheaper than calling the policy from
    Python. Copies that finish early are reset by the vector env but no longer counted.
    """
    if isinstance(policy, NumpyGreedy):
        return numpy_episode_runner(policy, env, gamma, keep_actions, give_up_below, max_return)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    n = env.batch_size

    def step(time_step, returns, lengths, done, discounted, scale, actions, terminated):
        action = policy.action(time_step).action
        time_step = tf_env.step(action)
        active = ~done
        returns += tf.where(active, time_step.reward, 0.0)
        discounted += tf.where(active, scale * time_step.reward, 0.0)  # G = sum_t gamma^t r_{t+1}
        if keep_actions:
            actions = actions.write(actions.size(), tf.cast(action, tf.int64))
            terminated |= active & time_step.is_last() & tf.equal(time_step.discount, 0.0)
        lengths += tf.cast(active, tf.int32)
        return (time_step, returns, lengths, done | time_step.is_last(), discounted, scale * gamma, actions,
                terminated)

    def going_on(time_step, returns, lengths, done, *_):
        if give_up_below is None or max_return is None:
            return ~tf.reduce_all(done)
        best_case = tf.reduce_sum(tf.where(done, returns, max_return))  # the unfinished all reach max_return
        return ~tf.reduce_all(done) & (best_case >= give_up_below * n)

    @tf.function(autograph=False)
    def episodes():
        first = tf_env.reset()
        start = (first, tf.zeros([n]), tf.zeros([n], tf.int32), tf.zeros([n], tf.bool), tf.zeros([n]),
                 tf.ones([n]), tf.TensorArray(tf.int64, size=0, dynamic_size=True, element_shape=[n]),
                 tf.zeros([n], tf.bool))
        _, returns, lengths, _, discounted, _, actions, terminated = tf.while_loop(going_on, step, start)
        return returns, lengths, discounted, first.observation, tf.transpose(actions.stack()), terminated

    def run() -> EvalResult:
        returns, lengths, discounted, first, actions, terminated = episodes()
        kept = {"actions": actions.numpy(), "terminated": terminated.numpy()} if keep_actions else {}
        return EvalResult(returns=returns.numpy().astype(np.float64), lengths=lengths.numpy().astype(np.int64),
                          discounted_returns=discounted.numpy().astype(np.float64), first_observations=first.numpy(),
                          **kept)

    return run


def numpy_episode_runner(greedy: NumpyGreedy, env: BatchedGymnasiumEnvironment, gamma: float, keep_actions: bool,
                         give_up_below: Optional[float], max_return: Optional[float]) -> Callable[[], EvalResult]:
    """`make_episode_runner`'s loop in NumPy (`numpy_episodes.run_episodes`), step for step the compiled one's,
    for the agent's greedy policy, with its weights as they are at the start of each run. It steps the env's
    copies without TF-Agents' wrapping (`BatchedGymnasiumEnvironment.steps`): the same episodes."""
    steps = getattr(env, "steps", env)

    def run() -> EvalResult:
        return run_episodes(greedy.snapshot(), steps, gamma, keep_actions, give_up_below, max_return)

    return run
