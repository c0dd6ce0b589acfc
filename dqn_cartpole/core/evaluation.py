"""Greedy evaluation: N episodes side by side in a batched env, in NumPy for the agent's own greedy policy
(`policies.NumpyGreedy`), else (a saved policy, any TF policy) with the whole loop in one graph call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.core.envs import BatchedGymnasiumEnvironment
from dqn_cartpole.core.policies import NumpyGreedy


@dataclass(frozen=True)
class EvalResult:
    """Per-episode returns and lengths of one evaluation (and discounted returns, sum of gamma^t r_t, from each
    episode's first observation, which `first_observations` holds).

    With `keep_actions` (see `make_episode_runner`): each episode's actions, [episodes, steps] (row i
    valid up to lengths[i]), and whether it ended by failure rather than by the time limit.
    """

    returns: np.ndarray
    lengths: np.ndarray
    discounted_returns: Optional[np.ndarray] = None
    first_observations: Optional[np.ndarray] = None
    actions: Optional[np.ndarray] = None
    terminated: Optional[np.ndarray] = None

    @property
    def average_return(self) -> float:
        return float(np.mean(self.returns))

    @property
    def standard_error(self) -> float:
        """The standard error of `average_return` (0 for a single episode)."""
        n = len(self.returns)
        return float(np.std(self.returns, ddof=1) / np.sqrt(n)) if n > 1 else 0.0

    @property
    def average_length(self) -> float:
        return float(np.mean(self.lengths))

    def spread_columns(self) -> dict[str, float]:
        """The eval CSV's spread across episodes and the average discounted return."""
        discounted = None if self.discounted_returns is None else float(np.mean(self.discounted_returns))
        return {"min_return": float(np.min(self.returns)), "max_return": float(np.max(self.returns)),
                "std_return": float(np.std(self.returns)), "average_discounted_return": discounted}


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
    """`make_episode_runner`'s loop in NumPy, step for step the compiled one's, for the agent's greedy policy."""
    n = env.batch_size
    give_up = give_up_below is not None and max_return is not None

    def going_on(done: np.ndarray, returns: np.ndarray) -> bool:
        if done.all():
            return False
        return not give_up or float(np.where(done, returns, max_return).sum()) >= give_up_below * n

    def run() -> EvalResult:
        act = greedy.snapshot()
        time_step = env.reset()
        first = time_step.observation
        returns, discounted, lengths = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)
        done, terminated, scale, actions = np.zeros(n, bool), np.zeros(n, bool), 1.0, []
        while going_on(done, returns):
            action = act(time_step.observation)
            time_step = env.step(action)
            active = ~done
            reward = np.asarray(time_step.reward, np.float64)
            returns += np.where(active, reward, 0.0)
            discounted += np.where(active, scale * reward, 0.0)  # G = sum_t gamma^t r_{t+1}
            last = np.asarray(time_step.step_type) == ts.StepType.LAST
            if keep_actions:
                actions.append(action)
                terminated |= active & last & (np.asarray(time_step.discount) == 0.0)
            lengths += active
            done |= last
            scale *= gamma
        kept = {"actions": np.stack(actions, axis=1) if actions else np.zeros((n, 0), np.int64),
                "terminated": terminated} if keep_actions else {}
        return EvalResult(returns=returns, lengths=lengths, discounted_returns=discounted,
                          first_observations=first, **kept)

    return run
