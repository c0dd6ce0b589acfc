"""The population's periodic evaluation, every seed at once: each seed's `evaluation.num_eval_episodes` greedy
episodes are played side by side in one vector env (K' x E copies), its actions computed in NumPy from its slice of
the ensemble's weights, one batched matmul per layer for all seeds (`ensemble_greedy`). Each seed's result then goes to its
own `Evaluate` trigger (`SeedRun.take_evaluation`): its eval row, policy/best and, past the solve return, its solve
check. One seed's evaluation alone (`numpy_episodes.run_episodes` through its `NumpyGreedy`) plays the same episodes
at about K times the Python cost per step.

A single run's evaluation env draws every copy's episodes from one generator too (gymnasium's vector CartPole); here
one generator per number of seeds evaluated together, seeded from the first seed, so a seed's evaluation episodes
are not its single run's, though they come from the same distribution.
"""

from __future__ import annotations

import contextlib
import time
from typing import Sequence

import numpy as np
import tensorflow as tf

from dqn_cartpole.config import Config
from dqn_cartpole.core.numpy_episodes import ACTIVATIONS, ActFn, EvalResult, run_episodes
from dqn_cartpole.core.vector_env import VectorSteps, make_vector_steps
from dqn_cartpole.training.population_pipeline import PopulationPipeline

POPULATION_EVAL_SEED_OFFSET = 50_000  # the shared evaluation envs' seeds: neither training nor the checks use them


def ensemble_greedy(layers: Sequence[tuple], copies: int, minimum_action: int) -> ActFn:
    """act(observations [K' * copies, d], seed-major) -> actions: per seed, argmax_a Q(s, a) under its own layers
    (`layers`: (kernel [K', in, out], bias [K', out], activation name) each)."""
    def act(observations: np.ndarray) -> np.ndarray:
        x = np.asarray(observations, np.float32).reshape(len(layers[0][0]), copies, -1)
        for kernel, bias, activation in layers:
            x = ACTIVATIONS[activation](np.matmul(x, kernel) + bias[:, np.newaxis, :])  # (np.einsum: 10x slower)
        return np.argmax(x, axis=-1).reshape(-1).astype(np.int64) + minimum_action

    return act


def seed_layers(pipeline: PopulationPipeline, indices: Sequence[int]) -> list[tuple]:
    """The online network's layers of seeds `indices` as arrays."""
    layers = []
    for layer in pipeline.agent.q_network.layers:
        activation = tf.keras.activations.serialize(layer.activation)
        layers.append((layer.kernel.numpy()[list(indices)], layer.bias.numpy()[list(indices)], activation))
    return layers


class PopulationEvaluation:
    """Plays the greedy episodes of any set of seeds at once (see the module docstring)."""

    def __init__(self, pipeline: PopulationPipeline, config: Config, stack: contextlib.ExitStack):
        self.pipeline, self.config, self.stack = pipeline, config, stack
        self.seed = pipeline.seeds[0] + POPULATION_EVAL_SEED_OFFSET  # the envs' seeds derive from it
        self.episodes = config.evaluation.num_eval_episodes
        self.envs: dict[int, VectorSteps] = {}  # by the number of seeds played together, made once
        self.minimum_action = int(np.asarray(pipeline.tf_env.action_spec().minimum))

    def env_for(self, seeds: int) -> VectorSteps:
        if seeds not in self.envs:
            cfg = self.config
            env = make_vector_steps(cfg.env.id, seeds * self.episodes,
                                    seed=self.seed + seeds,
                                    max_episode_steps=cfg.env.max_episode_steps)
            self.stack.callback(env.close)
            self.envs[seeds] = env
        return self.envs[seeds]

    def reseed(self, seed: int) -> None:
        """The envs' episodes from `seed` on (a resumed population's: `checkpoints.resume_seed`); those made before are
        closed, the next `play` makes them anew."""
        self.seed = seed + POPULATION_EVAL_SEED_OFFSET
        for env in self.envs.values():
            env.close()
        self.envs.clear()

    def play(self, indices: Sequence[int]) -> tuple[list[EvalResult], float]:
        """One evaluation of each seed of `indices` (its `evaluation.num_eval_episodes` episodes); and the seconds
        it took, each seed's share."""
        started = time.perf_counter()
        act = ensemble_greedy(seed_layers(self.pipeline, indices), self.episodes, self.minimum_action)
        result = run_episodes(act, self.env_for(len(indices)), gamma=self.config.agent.gamma)
        e = self.episodes
        results = [EvalResult(result.returns[i * e:(i + 1) * e], result.lengths[i * e:(i + 1) * e],
                              result.discounted_returns[i * e:(i + 1) * e],
                              result.first_observations[i * e:(i + 1) * e]) for i in range(len(indices))]
        return results, (time.perf_counter() - started) / max(1, len(indices))

