"""What every role builds first, from the builder: its envs and an agent (for the data spec and the weights)."""

from __future__ import annotations

import contextlib
from typing import Any

from tf_agents.environments import tf_py_environment

from dqn_cartpole.config import Config
from dqn_cartpole.core import build, envs

# Collector i steps its envs on seed + COLLECTOR_SEED_OFFSET * (i + 1): streams apart from the learner's envs.
COLLECTOR_SEED_OFFSET = 100_000


def agent_with_envs(config: Config, copies: int, seed: int, stack: contextlib.ExitStack
                    ) -> tuple[envs.BatchedGymnasiumEnvironment, tf_py_environment.TFPyEnvironment, Any]:
    """`copies` envs on `seed`, their TF wrapper and the configured agent for their specs."""
    env = build.make_env_copies(config, copies, seed, stack)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    return env, tf_env, build.make_agent(config, tf_env)
