"""Agents behind one interface (`protocol.ValueAgent`): DQN and Double DQN (`dqn`), C51 (`c51`), picked by
`agent.kind` (`registry`); the n-step window rule every agent's loss applies (`n_step`)."""

from dqn_cartpole.core.agents.c51 import C51Agent, C51ValueAgent
from dqn_cartpole.core.agents.common import TfAgentAdapter, epsilon_schedule
from dqn_cartpole.core.agents.dqn import DdqnAgent, DqnAgent, DqnFamilyAgent, TD_LOSSES
from dqn_cartpole.core.agents.n_step import n_step_transition, valid_mask, window_length
from dqn_cartpole.core.agents.protocol import PrioritizedAgent, ReturnDistribution, ValueAgent
from dqn_cartpole.core.agents.registry import BUILDERS, WINDOW_LENGTHS, build_agent, register, unregister, \
    window_length_for

__all__ = ["BUILDERS", "C51Agent", "C51ValueAgent", "DdqnAgent", "DqnAgent", "DqnFamilyAgent", "ReturnDistribution",
           "TD_LOSSES", "TfAgentAdapter", "ValueAgent", "build_agent", "epsilon_schedule", "n_step_transition", "PrioritizedAgent",
           "register", "unregister", "valid_mask", "window_length", "WINDOW_LENGTHS", "window_length_for"]
