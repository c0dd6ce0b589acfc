"""Greedy evaluation: N episodes run side by side in a batched env, one policy call per step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dqn_cartpole.envs import BatchedGymnasiumEnvironment
from dqn_cartpole.policies import ActFn


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


def run_episodes(act: ActFn, env: BatchedGymnasiumEnvironment) -> EvalResult:
    """Runs exactly one episode in each of the env's `batch_size` copies.

    Copies that finish early are reset by the vector env but no longer counted.
    """
    n = env.batch_size
    returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
    done = np.zeros(n, dtype=bool)
    time_step = env.reset()
    while not done.all():
        time_step = env.step(act(time_step))
        active = ~done
        returns += np.where(active, time_step.reward, 0.0)
        lengths += active
        done |= time_step.is_last()
    return EvalResult(returns=returns, lengths=lengths)
