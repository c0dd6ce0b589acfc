"""Which module builds which `agent.kind`: a new agent is its module plus a line here (and its config keys)."""

from __future__ import annotations

from typing import Callable

from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.config import AgentConfig, NetworkConfig
from dqn_cartpole.core.agents import c51, dqn
from dqn_cartpole.core.agents.protocol import ValueAgent

BUILDERS: dict[str, Callable[..., ValueAgent]] = {
    "dqn": dqn.build_dqn_agent,
    "double_dqn": dqn.build_dqn_agent,
    "c51": c51.build_c51_agent,
}


def build_agent(agent_config: AgentConfig, network_config: NetworkConfig, time_step_spec: ts.TimeStep,
                action_spec: tensor_spec.BoundedTensorSpec) -> ValueAgent:
    """The configured agent (`agent.kind`), built and initialised, behind the `ValueAgent` interface."""
    return BUILDERS[agent_config.kind](agent_config, network_config, time_step_spec, action_spec)
