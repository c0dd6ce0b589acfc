"""Which module builds which `agent.kind`, and how long a window it trains on: a new agent is its module plus a
line in each table here (and its config keys), or, from outside this package, its module and a call to `register`."""

from __future__ import annotations

from typing import Callable

from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.config import AgentConfig, NetworkConfig, register_agent_kind
from dqn_cartpole.core.agents import c51, dqn, n_step
from dqn_cartpole.core.agents.protocol import ValueAgent


def n_step_window_length(agent_config: AgentConfig) -> int:
    """The n-step family's window, n_step + 1: every shipped kind's, and a registered kind's unless it says
    otherwise."""
    return n_step.window_length(agent_config.n_step)


BUILDERS: dict[str, Callable[..., ValueAgent]] = {
    "dqn": dqn.build_dqn_agent,
    "double_dqn": dqn.build_dqn_agent,
    "c51": c51.build_c51_agent,
}
# Steps per sampled window (`ValueAgent.window_length`), known before the agent is built: what a replay server's
# tables, a collector's writers and a learner's reader are made for.
WINDOW_LENGTHS: dict[str, Callable[[AgentConfig], int]] = {kind: n_step_window_length for kind in BUILDERS}
SHIPPED = tuple(BUILDERS)


def register(kind: str, builder: Callable[..., ValueAgent],
             window_length: Callable[[AgentConfig], int] = n_step_window_length) -> None:
    """Adds an agent kind from outside this package (a plugin's module, a test's agent): `agent.kind: KIND` then
    loads and builds it like a shipped kind. The builder takes (agent config, network config, time_step_spec,
    action_spec) and returns a `ValueAgent`; `window_length(agent config)` is the window it trains on (n_step + 1
    unless given). A kind's own config keys are not added: it reads the shared ones. Registration holds in this
    process: runs trained here (`dqn_cartpole.train`) can use the kind; a command's own child processes (`sweep`,
    `--topology local`) do not know it."""
    if not kind.isidentifier():
        raise ValueError(f"agent kind {kind!r}: must be a name (letters, digits, _)")
    if kind in BUILDERS and BUILDERS[kind] is not builder:
        raise ValueError(f"agent kind {kind!r} is registered already")
    BUILDERS[kind], WINDOW_LENGTHS[kind] = builder, window_length
    register_agent_kind(kind)


def unregister(kind: str) -> None:
    """Removes a kind `register` added (a shipped kind stays)."""
    if kind in SHIPPED:
        raise ValueError(f"agent kind {kind!r} is one of the shipped kinds")
    BUILDERS.pop(kind, None)
    WINDOW_LENGTHS.pop(kind, None)
    register_agent_kind(kind, registered=False)


def window_length_for(agent_config: AgentConfig) -> int:
    """Steps per sampled window of the configured agent: the `window_length` its built agent has."""
    if agent_config.kind not in WINDOW_LENGTHS:
        raise ValueError(f"agent.kind {agent_config.kind} has no entry in core/agents/registry.py's WINDOW_LENGTHS")
    return WINDOW_LENGTHS[agent_config.kind](agent_config)


def build_agent(agent_config: AgentConfig, network_config: NetworkConfig, time_step_spec: ts.TimeStep,
                action_spec: tensor_spec.BoundedTensorSpec) -> ValueAgent:
    """The configured agent (`agent.kind`), built and initialised, behind the `ValueAgent` interface."""
    agent = BUILDERS[agent_config.kind](agent_config, network_config, time_step_spec, action_spec)
    if agent.window_length != window_length_for(agent_config):  # the replay is built for the table's length
        raise ValueError(f"agent.kind {agent_config.kind}: its agent trains on windows of {agent.window_length} "
                         f"steps, its WINDOW_LENGTHS entry says {window_length_for(agent_config)}")
    return agent
