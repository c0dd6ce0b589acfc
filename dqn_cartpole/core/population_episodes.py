"""A population's evaluations, without TensorFlow: every seed's greedy episodes at once, and each seed's solve check.

A job holds the weights of the seeds to evaluate (kernel [K', in, out] and bias [K', out] per layer, seed-major). Each
seed's `episodes` greedy episodes are played side by side in one vector env (K' x episodes copies), the actions
computed in NumPy, one batched matmul per layer for all seeds (`ensemble_q_values`). A seed whose evaluation reaches
the solve return, and whose job says it may check, then plays its solve check in its own seeded copies, as its single
run's check (`triggers.SolveCheck`) plays them.

`PopulationEvaluator` runs in the population's process (`evaluation.overlap: inline`), in a thread, or in a child
process (`serve_child`, through `snapshot_evaluation.ProcessWorker`): `training.population_evaluation` hands it the
jobs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from dqn_cartpole.core.numpy_episodes import ACTIVATIONS, EvalResult, greedy_act, run_episodes
from dqn_cartpole.core.vector_env import VectorSteps, make_vector_steps
from dqn_cartpole.core.snapshot_evaluation import serve_evaluator


def ensemble_q_values(layers: Sequence[tuple], copies: int) -> Callable[[np.ndarray], np.ndarray]:
    """q(observations [K' * copies, d], seed-major) -> [K', copies, actions]: each seed's Q-values under its own
    layers (`layers`: (kernel [K', in, out], bias [K', out], activation name) each)."""
    def q_values(observations: np.ndarray) -> np.ndarray:
        x = np.asarray(observations, np.float32).reshape(len(layers[0][0]), copies, -1)
        for kernel, bias, activation in layers:
            x = ACTIVATIONS[activation](np.matmul(x, kernel) + bias[:, np.newaxis, :])  # (np.einsum: 10x slower)
        return x

    return q_values


@dataclass(frozen=True)
class CheckSpec:
    """What a seed's solve check plays, as `triggers.SolveCheck` plays a single run's."""

    episodes: int
    above: float  # the solve return: a check that can no longer reach it gives up
    max_return: Optional[float]
    seed_offset: int  # a seed's check copies are seeded with its seed + this + the iteration of its first check


@dataclass(frozen=True)
class PopulationSpec:
    """What every evaluation of a population plays (sent to a worker once)."""

    env_id: str
    max_episode_steps: Optional[int]
    episodes: int  # each seed's evaluation episodes
    seed: int  # the evaluation copies' seeds derive from it (one vector env per number of seeds evaluated together)
    gamma: float
    minimum_action: int
    member_seeds: tuple  # by seed index
    check: Optional[CheckSpec]  # None: no solve check


@dataclass(frozen=True)
class Job:
    """Seeds `indices`' weights at `iteration` (`layers`: (kernel [K', in, out], bias [K', out], activation) each),
    and which of them may start their solve check (`check`, one bool per index)."""

    iteration: int
    indices: tuple
    layers: list
    check: tuple


@dataclass(frozen=True)
class SeedOutcome:
    """One seed's evaluation, its mean max-Q at the episodes' first states, and its solve check's episodes (if its
    evaluation reached the solve return and it may check)."""

    result: EvalResult
    max_q_at_reset: float
    check: Optional[EvalResult]


@dataclass(frozen=True)
class Outcome:
    iteration: int
    seeds: list  # [SeedOutcome], in the job's order
    seconds: float  # each seed's share of the wall seconds


class PopulationEvaluator:
    """Plays jobs (see the module docstring); its envs are made as they are first needed."""

    def __init__(self, spec: PopulationSpec):
        self.spec = spec
        self.envs: dict[int, VectorSteps] = {}  # by the number of seeds played together
        self.check_envs: dict[int, VectorSteps] = {}  # by seed index, made at its first check

    def env_for(self, seeds: int) -> VectorSteps:
        spec = self.spec
        if seeds not in self.envs:
            self.envs[seeds] = make_vector_steps(spec.env_id, seeds * spec.episodes, seed=spec.seed + seeds,
                                                 max_episode_steps=spec.max_episode_steps)
        return self.envs[seeds]

    def check_env_for(self, index: int, iteration: int) -> VectorSteps:
        """Seed `index`'s solve-check copies, seeded at its first check as its single run's (`SolveCheck.check`)."""
        spec = self.spec
        if index not in self.check_envs:
            self.check_envs[index] = make_vector_steps(
                spec.env_id, spec.check.episodes, spec.member_seeds[index] + spec.check.seed_offset + iteration,
                spec.max_episode_steps)
        return self.check_envs[index]

    def __call__(self, job: Job) -> Outcome:
        started, spec, e = time.perf_counter(), self.spec, self.spec.episodes
        q_values = ensemble_q_values(job.layers, e)

        def act(observations: np.ndarray) -> np.ndarray:
            return np.argmax(q_values(observations), axis=-1).reshape(-1).astype(np.int64) + spec.minimum_action

        result = run_episodes(act, self.env_for(len(job.indices)), gamma=spec.gamma)
        firsts = result.first_observations
        max_q = np.max(q_values(firsts), axis=-1).mean(axis=1)  # [K']
        seeds = []
        for i, (index, checks) in enumerate(zip(job.indices, job.check)):
            own = EvalResult(result.returns[i * e:(i + 1) * e], result.lengths[i * e:(i + 1) * e],
                             result.discounted_returns[i * e:(i + 1) * e], firsts[i * e:(i + 1) * e])
            check = None
            if checks and spec.check is not None and own.average_return >= spec.check.above:
                seed_act = greedy_act([(kernel[i], bias[i], activation) for kernel, bias, activation in job.layers],
                                      spec.minimum_action)
                check = run_episodes(seed_act, self.check_env_for(index, job.iteration),
                                     give_up_below=spec.check.above, max_return=spec.check.max_return)
            seeds.append(SeedOutcome(own, float(max_q[i]), check))
        return Outcome(job.iteration, seeds, (time.perf_counter() - started) / max(1, len(job.indices)))

    def close(self) -> None:
        for env in [*self.envs.values(), *self.check_envs.values()]:
            env.close()
        self.envs.clear()
        self.check_envs.clear()


def serve_child() -> int:
    """The population's evaluator process: the spec, then an outcome for each job."""
    return serve_evaluator(PopulationEvaluator, "the population's evaluator failed: ")
