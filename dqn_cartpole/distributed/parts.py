"""What every role builds first, from the builder: its envs and an agent (for the data spec and the weights),
and for the learner and the evaluator, a pipeline around a client of the replay server."""

from __future__ import annotations

import contextlib
from typing import Any, Optional

from tf_agents.environments import tf_py_environment

from dqn_cartpole.config import Config
from dqn_cartpole.core import build, envs
from dqn_cartpole.distributed.variables import check_server

# Collector i steps its envs on seed + COLLECTOR_SEED_OFFSET * (i + 1): streams apart from the learner's envs.
COLLECTOR_SEED_OFFSET = 100_000


def agent_with_envs(config: Config, copies: int, seed: int, stack: contextlib.ExitStack
                    ) -> tuple[envs.BatchedGymnasiumEnvironment, tf_py_environment.TFPyEnvironment, Any]:
    """`copies` envs on `seed`, their TF wrapper and the configured agent for their specs."""
    env = build.make_env_copies(config, copies, seed, stack)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    return env, tf_env, build.make_agent(config, tf_env)


def remote_pipeline(config: Config, address: str, stack: contextlib.ExitStack,
                    rate_limiter_timeout_ms: Optional[int] = None) -> Any:
    """What a learner or an evaluator is made of: the run's envs and agent, a client of the server at
    `address` (no drivers: the collectors are other processes), the greedy policy and its evaluation."""
    from tf_agents.metrics import tf_metrics

    from dqn_cartpole.core.evaluation import make_episode_runner
    from dqn_cartpole.core.policies import compiled_act_fn
    from dqn_cartpole.training.pipeline import Pipeline

    check_server(address, config.distributed.connect_timeout_s)
    run_envs = build.make_envs(config, stack)
    agent = build.make_agent(config, run_envs.tf_env)
    replay = build.make_replay_client(config.replay, agent.collect_data_spec, config.env.num_envs,
                                      config.agent.n_step, address, stack,
                                      rate_limiter_timeout_ms=rate_limiter_timeout_ms)
    return Pipeline(run_envs, agent, replay, tf_metrics.EnvironmentSteps(), None, None, compiled_act_fn(agent.policy),
                    make_episode_runner(agent.policy, run_envs.evaluate, gamma=config.agent.gamma), stack)


def count_env_steps(pipeline: Any) -> int:
    """The collectors' env steps, as the items they inserted (one per collected step); kept in the pipeline."""
    inserts = pipeline.replay.inserts()
    pipeline.env_steps.environment_steps.assign(inserts)
    return inserts
