"""Agents behind one interface (`protocol.ValueAgent`): DQN and Double DQN (`dqn`); the n-step window rule every
agent's loss applies (`n_step`)."""

from dqn_cartpole.core.agents.common import epsilon_schedule
from dqn_cartpole.core.agents.dqn import DdqnAgent, DqnAgent, DqnFamilyAgent, TD_LOSSES, build_agent
from dqn_cartpole.core.agents.n_step import n_step_transition, valid_mask, window_length
from dqn_cartpole.core.agents.protocol import ValueAgent

__all__ = ["DdqnAgent", "DqnAgent", "DqnFamilyAgent", "TD_LOSSES", "ValueAgent", "build_agent", "epsilon_schedule",
           "n_step_transition", "valid_mask", "window_length"]
