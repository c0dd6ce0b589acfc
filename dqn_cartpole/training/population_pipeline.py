"""What a population is made of: K seeds' envs, one batched agent, one replay of K columns, the drivers, and a
single-seed agent through which each seed's greedy policy is evaluated and exported (`select`).

The pieces are the single run's: `build`'s env copies, drivers and agent, TF-Agents' `DqnAgent` (over the ensemble
network: `core.agents.population`), `TFUniformReplayBuffer` (`replay.population`). Env copy k is seed k's, seeded as
its single run's env (`make_batched_env(..., seed_per_copy=True)`: copy k gets seed k).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.metrics import tf_metrics

from dqn_cartpole.config import Config
from dqn_cartpole.core import build, ensemble, envs
from dqn_cartpole.core.agents import ValueAgent
from dqn_cartpole.core.agents.population import PopulationAgent, build_population_agent
from dqn_cartpole.core.episode_returns import EpisodeReturnsPerEnv
from dqn_cartpole.core.evaluation import make_episode_runner
from dqn_cartpole.core.policies import greedy_policy
from dqn_cartpole.replay.population import PopulationReplay, SeedReplay
from dqn_cartpole.training.loop import compile_iterations, gradient_step, repeat_steps
from dqn_cartpole.training.pipeline import Pipeline


@dataclass
class PopulationPipeline:
    """Everything built for a population; the ExitStack it was built with releases it."""

    seeds: tuple
    collect: envs.BatchedGymnasiumEnvironment  # copy k: seed k's env
    tf_env: tf_py_environment.TFPyEnvironment
    agent: PopulationAgent
    view: ValueAgent  # a single-seed agent: holds one seed's weights at a time (`select`)
    replay: PopulationReplay
    env_steps: tf_metrics.EnvironmentSteps  # all seeds' steps together
    returns: EpisodeReturnsPerEnv
    initial_driver: Any
    collect_driver: Any
    stack: contextlib.ExitStack

    def env_steps_per_seed(self) -> int:
        """Env steps of each seed (the seeds step together)."""
        return int(self.env_steps.result().numpy()) // len(self.seeds)

    def select(self, index: int) -> None:
        """The view agent holds seed `index`'s online weights and train-step count (between compiled chunks)."""
        ensemble.assign_seed(self.view.q_network.variables, self.agent.online_variables(), index)
        self.view.train_step_counter.assign(self.agent.tf_agent.seed_train_steps[index])

    def make_train(self, config: Config) -> Any:
        """One iteration's gradient step(s): per seed, a batch from its own replay; returns the seeds' losses [K]."""
        sample = self.replay.sampler(config.training.batch_size, self.agent.window_length)
        step = gradient_step(self.agent, config.training.jit_compile)
        return repeat_steps(lambda: step(sample()), config.training.train_steps_per_iteration,
                            tf.zeros([len(self.seeds)]))

    def make_iterations(self, config: Config) -> Any:
        """`loop.compile_iterations` of the population's collect driver and train step."""
        return compile_iterations(self.make_train(config), self.collect_driver)


def build_population_pipeline(config: Config, seeds: Sequence[int], stack: contextlib.ExitStack) -> PopulationPipeline:
    """The population of `seeds` (each seed's run as `config` says, with its own seed)."""
    k = len(seeds)
    collect = envs.make_batched_env(config.env.id, k, seed=list(seeds), max_episode_steps=config.env.max_episode_steps,
                                    seed_per_copy=True)
    stack.callback(collect.close)
    tf_env = tf_py_environment.TFPyEnvironment(collect)
    agent = build_population_agent(config.agent, config.network, tf_env.time_step_spec(), tf_env.action_spec(), k)
    view = build.make_agent(config, tf_env)
    replay = PopulationReplay(agent.collect_data_spec, k, config.replay)
    stack.callback(replay.close)
    env_steps, returns = tf_metrics.EnvironmentSteps(), EpisodeReturnsPerEnv(k)
    observers = [replay.add_batch, env_steps, returns]
    # A TF driver's num_steps counts the steps of all its env copies together: each seed's steps times K.
    initial_driver = build.make_random_driver(tf_env, observers, config.training.initial_collect_steps * k)
    collect_driver = build.make_collect_driver(tf_env, agent.collect_policy, observers,
                                               config.training.collect_steps_per_iteration * k)
    return PopulationPipeline(tuple(seeds), collect, tf_env, agent, view, replay, env_steps, returns, initial_driver,
                              collect_driver, stack)


class SeedPipeline(Pipeline):
    """One seed's run as the single run's triggers see it (`triggers.LogTrain`, `Evaluate`, `SolveCheck`,
    `PolicyExport`): the view agent (holding this seed's weights once `select`ed), its replay's counts, its env steps
    and train steps, its own evaluation envs."""

    def __init__(self, population: PopulationPipeline, index: int, config: Config, stack: contextlib.ExitStack):
        seed = population.seeds[index]
        evaluate = build.make_env_copies(config, config.evaluation.num_eval_episodes, seed + build.EVAL_SEED_OFFSET,
                                         stack)
        super().__init__(build.Envs(population.collect, population.tf_env, evaluate), population.view,
                         SeedReplay(population.replay), population.env_steps, None, None, None,
                         make_episode_runner(greedy_policy(population.view), evaluate, gamma=config.agent.gamma),
                         stack, SeedReturns(population.returns, index))
        self.population, self.index = population, index

    def env_step_count(self) -> int:
        return self.population.env_steps_per_seed()

    def train_step_count(self) -> int:
        return int(self.population.agent.tf_agent.seed_train_steps[self.index].numpy())

    def epsilon(self) -> float:
        return self.population.agent.epsilon()


class SeedReturns:
    """One seed's collect episodes' returns (`EpisodeReturns.take`'s answer, for env copy `index`)."""

    def __init__(self, returns: EpisodeReturnsPerEnv, index: int):
        self.returns, self.index = returns, index

    def take(self) -> tuple:
        return self.returns.take_env(self.index)
