"""What a run is made of: envs, agent, replay, drivers, the greedy evaluation (a single process builds it in
`local.build_pipeline`, a learner or an evaluator in `distributed.parts.remote_pipeline`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tf_agents.drivers import dynamic_step_driver
from tf_agents.metrics import tf_metrics

from dqn_cartpole.core import build
from dqn_cartpole.core.agents import ValueAgent
from dqn_cartpole.core.episode_returns import EpisodeReturns
from dqn_cartpole.core.evaluation import EvalResult
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
