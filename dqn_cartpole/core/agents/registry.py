"""Which module builds which `agent.kind`: a new agent is its module plus a line here (and its config keys), or,
from outside this package, its module and a call to `register`."""

from __future__ import annotations

from typing import Callable

from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.config import AgentConfig, NetworkConfig, register_agent_kind
from dqn_cartpole.core.agents import c51, dqn
from dqn_cartpole.core.agents.protocol import ValueAgent

BUILDERS: dict[str, Callable[..., ValueAgent]] = {
    "dqn": dqn.build_dqn_agent,
    "double_dqn": dqn.build_dqn_agent,
    "c51": c51.build_c51_agent,
}
SHIPPED = tuple(BUILDERS)


def register(kind: str, builder: Callable[..., ValueAgent]) -> None:
    """Adds an agent kind from outside this package (a plugin's module, a test's agent): `agent.kind: KIND` then
    loads and builds it like a shipped kind. The builder takes (agent config, network config, time_step_spec,
    action_spec) and returns a `ValueAgent`. A kind's own config keys are not added: it reads the shared ones.
    Registration holds in this process: runs trained here (`dqn_cartpole.train`) can use the kind; a command's own
    child processes (`sweep`, `--topology local`) do not know it."""
    if not kind.isidentifier():
        raise ValueError(f"agent kind {kind!r}: must be a name (letters, digits, _)")
    if kind in BUILDERS and BUILDERS[kind] is not builder:
        raise ValueError(f"agent kind {kind!r} is registered already")
    BUILDERS[kind] = builder
    register_agent_kind(kind)


def unregister(kind: str) -> None:
    """Removes a kind `register` added (a shipped kind stays)."""
    if kind in SHIPPED:
        raise ValueError(f"agent kind {kind!r} is one of the shipped kinds")
    BUILDERS.pop(kind, None)
    register_agent_kind(kind, registered=False)


def build_agent(agent_config: AgentConfig, network_config: NetworkConfig, time_step_spec: ts.TimeStep,
                action_spec: tensor_spec.BoundedTensorSpec) -> ValueAgent:
    """The configured agent (`agent.kind`), built and initialised, behind the `ValueAgent` interface."""
    return BUILDERS[agent_config.kind](agent_config, network_config, time_step_spec, action_spec)
