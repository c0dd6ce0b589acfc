"""What a population is made of: K seeds' envs, one batched agent, one replay of K columns, the drivers, and a
single-seed agent through which each seed's greedy policy is evaluated and exported (`select`).

The pieces are the single run's: `build`'s env copies, drivers and agent, TF-Agents' `DqnAgent` (over the ensemble
network: `core.agents.population`), `TFUniformReplayBuffer` (`replay.population`). Env copy k is seed k's, seeded as
its single run's env (`make_batched_env(..., seed_per_copy=True)`: copy k gets seed k).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import tensorflow as tf
from tf_agents.drivers import dynamic_step_driver
from tf_agents.environments import tf_py_environment
from tf_agents.policies import random_tf_policy

from dqn_cartpole.config import Config
from dqn_cartpole.core import build, ensemble, envs
from dqn_cartpole.core.agents import ValueAgent
from dqn_cartpole.core.agents.population import PopulationAgent, build_population_agent
from dqn_cartpole.core.episode_returns import EpisodeReturns
from dqn_cartpole.core.tf_cartpole import TFCartPole, max_episode_steps
from dqn_cartpole.replay.population import SeedReplay, make_population_replay
from dqn_cartpole.training.loop import compile_iterations, repeat_steps
from dqn_cartpole.training.pipeline import Pipeline


class LockstepDriver(dynamic_step_driver.DynamicStepDriver):
    """TF-Agents' `DynamicStepDriver`, stepping K env copies together until one of them has taken `steps` counted
    steps (not `steps` * K counted steps over all copies, the library's rule).

    The library counts a batch's steps without its boundary steps (an episode's LAST -> the next FIRST): with one
    copy, a single run's iteration that crosses an episode's end steps twice. With K copies its rule would step
    every seed again whenever any seed crosses an end, which early on (episodes of ~20 steps, 16 seeds) is almost
    every iteration, and would halve each seed's train steps per env step. Here an iteration steps every copy
    once (more only if every copy crossed an end): with one copy, exactly the single run's driver."""

    def __init__(self, env: Any, policy: Any, observers: Sequence[Any], steps: int):
        super().__init__(env, policy, list(observers), num_steps=steps)

    def _loop_condition_fn(self):
        return lambda counter, *_: tf.less(tf.reduce_max(counter), self._num_steps)


class EnvStepsPerEnv(tf.Module):
    """A driver observer counting each env copy's steps as `tf_metrics.EnvironmentSteps` counts a run's (boundary
    steps excluded); checkpointed with the population."""

    def __init__(self, copies: int):
        super().__init__(name="env_steps_per_env")
        self.steps = tf.Variable(tf.zeros([copies], tf.int64), trainable=False, name="steps")

    def __call__(self, trajectory: Any) -> Any:
        self.steps.assign_add(tf.cast(~trajectory.is_boundary(), tf.int64))
        return trajectory

    def result(self) -> tf.Tensor:
        return tf.reduce_sum(self.steps)


@dataclass
class PopulationPipeline:
    """Everything built for a population; the ExitStack it was built with releases it."""

    seeds: tuple
    collect: envs.BatchedGymnasiumEnvironment  # copy k: seed k's env
    tf_env: Any  # a TFPyEnvironment over `collect`, or CartPole in TF ops over it (`tf_cartpole.TFCartPole`)
    agent: PopulationAgent
    view: ValueAgent  # a single-seed agent: holds one seed's weights at a time (`select`)
    replay: Any  # replay.population's PopulationReplay (tf_uniform) or PopulationPyReplay (py_uniform)
    env_steps: EnvStepsPerEnv
    returns: EpisodeReturns
    initial_driver: Any
    collect_driver: Any
    stack: contextlib.ExitStack

    def env_steps_of(self, index: int) -> int:
        """Seed `index`'s env steps, counted as a single run counts its own."""
        return int(self.count("env_steps", self.env_steps.steps.numpy)[index])

    def train_steps_of(self, index: int) -> int:
        """Seed `index`'s train steps (those of the updates it took part in)."""
        return int(self.count("train_steps", self.agent.tf_agent.seed_train_steps.numpy)[index])

    def __post_init__(self):
        self.selected: Any = None  # (seed index, weights version) the view agent holds
        self.weights_changed = 0  # `put_back`s so far
        self.frozen: Optional[dict] = None  # the counts read in this `counts_read_once` block

        @tf.function(autograph=False, input_signature=[tf.TensorSpec([], tf.int32)])
        def select_seed(index):
            ensemble.assign_seed(self.view.q_network.variables, self.agent.online_variables(), index)
            self.view.train_step_counter.assign(self.agent.tf_agent.seed_train_steps[index])
            return self.view.train_step_counter.read_value()

        self._select = select_seed

    def select(self, index: int) -> None:
        """The view agent holds seed `index`'s online weights and train-step count (between compiled chunks: one
        compiled call, skipped when it holds them already)."""
        version = self.weights_version()
        if self.selected != (index, version):
            self._select(tf.constant(index, tf.int32))
            self.selected = (index, version)

    @contextlib.contextmanager
    def counts_read_once(self) -> Iterator[None]:
        """Inside (between two compiled chunks, where nothing changes them), the seeds' counts (`count`) are read
        once for all seeds, not once per seed: a population's train rows read them K times."""
        self.frozen = {}
        try:
            yield
        finally:
            self.frozen = None

    def count(self, name: str, read: Callable[[], Any]) -> Any:
        """`read()`, once per `counts_read_once` block (each call outside one reads)."""
        if self.frozen is None:
            return read()
        if name not in self.frozen:
            self.frozen[name] = read()
        return self.frozen[name]

    def put_back(self, index: int, values: Sequence[Any]) -> None:
        """Seed `index`'s online weights become `values` (a single-seed network's, in its variables' order:
        `SeedRun.snapshot`'s copy), between compiled chunks."""
        for variable, value in zip(self.agent.online_variables(), values):
            variable[index].assign(value)
        self.weights_changed += 1

    def take_returns(self, index: int) -> tuple[Optional[float], int]:
        """Seed `index`'s collect episodes since its last take (`EpisodeReturns.take_env`); inside `counts_read_once`,
        every seed's are taken at once, at the first seed's call."""
        if self.frozen is None:
            return self.returns.take_env(index)
        return self.count("returns", self.returns.take_each)[index]

    def weights_version(self) -> tuple:
        """Changes whenever any seed's online weights may have changed (a train step, a `put_back`)."""
        return int(self.agent.train_step_counter.numpy()), self.weights_changed

    def seed_layers(self, indices: Sequence[int]) -> list[tuple]:
        """The online network's layers of seeds `indices` as arrays, (kernel [K', in, out], bias [K', out],
        activation name) each: a copy, NumPy's to play (`core.population_episodes.ensemble_q_values`)."""
        layers, indices = [], list(indices)
        for layer in self.agent.q_network.layers:
            activation = tf.keras.activations.serialize(layer.activation)
            layers.append((layer.kernel.numpy()[indices], layer.bias.numpy()[indices], activation))
        return layers

    def make_train(self, config: Config) -> Any:
        """One iteration's gradient step(s): per seed that still trains, a batch from its own replay, through the
        ensemble's layers restricted to those seeds (`ensemble.only_seeds`), so a held seed costs no compute; returns
        the seeds' losses [K] (0 for a held one). With none left to train, no step at all."""
        sample = self.replay.seeds_sampler(config.training.batch_size, self.agent.window_length)
        agent, held = self.agent, tf.zeros([len(self.seeds)])

        def step() -> tf.Tensor:
            seeds = agent.tf_agent.active_seeds()

            def train() -> tf.Tensor:
                with ensemble.only_seeds(seeds):
                    return agent.train(sample(seeds)).loss

            return tf.cond(tf.size(seeds) > 0, train, lambda: held)

        return repeat_steps(step, config.training.train_steps_per_iteration, held)

    def make_iterations(self, config: Config) -> Any:
        """`loop.compile_iterations` of the population's collect driver and train step."""
        return compile_iterations(self.make_train(config), self.collect_driver)


def build_population_pipeline(config: Config, seeds: Sequence[int], stack: contextlib.ExitStack) -> PopulationPipeline:
    """The population of `seeds` (each seed's run as `config` says, with its own seed)."""
    k = len(seeds)
    collect = envs.make_batched_env(config.env.id, k, seed=list(seeds), max_episode_steps=config.env.max_episode_steps,
                                    seed_per_copy=True)
    stack.callback(collect.close)
    if build.uses_graph_env(config):  # CartPole in TF ops (`collection.graph_env`): copy k from seed k's generator
        tf_env = TFCartPole(collect, max_episode_steps(config.env.id, config.env.max_episode_steps))
    else:
        tf_env = tf_py_environment.TFPyEnvironment(collect)
    agent = build_population_agent(config.agent, config.network, tf_env.time_step_spec(), tf_env.action_spec(), k)
    view = build.make_agent(config, tf_env)
    replay = make_population_replay(agent.collect_data_spec, k, config.replay)
    stack.callback(replay.close)
    env_steps, returns = EnvStepsPerEnv(k), EpisodeReturns(k, per_env=True)
    observers = [replay.add_batch, env_steps, returns]
    random_policy = random_tf_policy.RandomTFPolicy(tf_env.time_step_spec(), tf_env.action_spec())
    initial_driver = LockstepDriver(tf_env, random_policy, observers, config.training.initial_collect_steps)
    collect_driver = LockstepDriver(tf_env, agent.collect_policy, observers,
                                    config.training.collect_steps_per_iteration)
    return PopulationPipeline(tuple(seeds), collect, tf_env, agent, view, replay, env_steps, returns, initial_driver,
                              collect_driver, stack)


class SeedPipeline(Pipeline):
    """One seed's run as the single run's triggers see it (`triggers.LogTrain`, `Evaluate.record`, `SolveCheck`,
    `PolicyExport`): the view agent (holding this seed's weights once `select`ed), its replay's counts, its env steps
    and train steps. It has no evaluation envs of its own: the population plays every seed's evaluation episodes
    at once (`population_evaluation`), so `Evaluate`'s own episodes (`evaluate_greedy`) are never played."""

    def __init__(self, population: PopulationPipeline, index: int, stack: contextlib.ExitStack):
        super().__init__(build.Envs(population.collect, population.tf_env, None), population.view,
                         SeedReplay(population.replay, population), population.env_steps, None, None, None, None,
                         stack, SeedReturns(population, index))
        self.population, self.index = population, index

    def env_step_count(self) -> int:
        return self.population.env_steps_of(self.index)

    def train_step_count(self) -> int:
        return self.population.train_steps_of(self.index)

    def epsilon(self) -> float:
        return self.population.count("epsilon", self.population.agent.epsilon)


class SeedReturns:
    """One seed's collect episodes' returns (`EpisodeReturns.take`'s answer, for env copy `index`)."""

    def __init__(self, population: PopulationPipeline, index: int):
        self.population, self.index = population, index

    def take(self) -> tuple:
        return self.population.take_returns(self.index)
