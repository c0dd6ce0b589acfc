"""What a single-process run is made of, asked of the builder: envs, agent, replay, drivers, evaluators."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tf_agents.drivers import dynamic_step_driver
from tf_agents.metrics import tf_metrics

from dqn_cartpole.config import Config
from dqn_cartpole.core import build
from dqn_cartpole.core.agents import ValueAgent
from dqn_cartpole.core.episode_returns import EpisodeReturns
from dqn_cartpole.core.evaluation import EvalResult, make_episode_runner
from dqn_cartpole.core.policies import compiled_act_fn, greedy_policy
from dqn_cartpole.replay.base import Replay


@dataclass
class Pipeline:
    """Everything built for a run; the ExitStack it was built with releases it."""

    envs: build.Envs
    agent: ValueAgent
    replay: Replay
    env_steps: tf_metrics.EnvironmentSteps
    initial_driver: dynamic_step_driver.DynamicStepDriver
    collect_driver: Any  # a DynamicStepDriver (collection.driver: compiled) or a build.PyCollection (py)
    greedy_act: Callable
    evaluate_greedy: Callable[[], EvalResult]  # one episode per evaluation env copy
    stack: contextlib.ExitStack
    collect_returns: Optional[EpisodeReturns] = None  # the collect episodes' returns (None: a learner collects none)

    def env_step_count(self) -> int:
        return int(self.env_steps.result().numpy())

    def train_step_count(self) -> int:
        return int(self.agent.train_step_counter.numpy())

    def epsilon(self) -> float:
        return self.agent.epsilon()


def build_pipeline(config: Config, stack: contextlib.ExitStack, announce: Callable[[str], None],
                   replay_checkpoint_dir: Optional[str] = None) -> Pipeline:
    """Builds envs, agent, replay and drivers; `stack` closes everything they open."""
    envs = build.make_envs(config, stack)
    agent = build.make_agent(config, envs.tf_env)
    replay = build.make_replay(config, agent, stack, replay_checkpoint_dir, announce)
    env_steps = tf_metrics.EnvironmentSteps()
    # The random fill's driver watches the returns too, so the first collect episode's return is whole.
    collect_returns = EpisodeReturns(config.env.num_envs)
    observers = [replay.add_batch, env_steps, collect_returns]
    initial_driver = build.make_random_driver(envs.tf_env, observers, config.training.initial_collect_steps)
    if config.collection.driver == "py":
        steps = config.training.collect_steps_per_iteration
        collect_driver = build.make_py_collection(envs.collect, agent.collect_policy, replay, env_steps, steps)
    else:
        collect_driver = make_collect_driver(config, envs, agent, observers)
    return Pipeline(envs, agent, replay, env_steps, initial_driver, collect_driver, compiled_act_fn(agent.policy),
                    make_episode_runner(greedy_policy(agent), envs.evaluate, gamma=config.agent.gamma), stack,
                    collect_returns)


def make_collect_driver(config: Config, envs: build.Envs, agent: ValueAgent, observers: list) -> Any:
    """The collect policy's driver in the compiled loop (a TF driver), writing through the same observers as the
    initial fill, so `Replay.add_batch` stays the one write path (a py driver's is `build.make_py_collection`)."""
    return build.make_collect_driver(envs.tf_env, agent.collect_policy, observers,
                                     config.training.collect_steps_per_iteration)
