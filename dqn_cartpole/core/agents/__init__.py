"""Agents behind one interface (`protocol.ValueAgent`): DQN and Double DQN (`dqn`)."""

from dqn_cartpole.core.agents.dqn import (DdqnAgent, DqnAgent, DqnFamilyAgent, EpisodeNStepTransition, TD_LOSSES,
                                          build_agent, epsilon_schedule, n_step_transition)
from dqn_cartpole.core.agents.protocol import ValueAgent

__all__ = ["DdqnAgent", "DqnAgent", "DqnFamilyAgent", "EpisodeNStepTransition", "TD_LOSSES", "ValueAgent",
           "build_agent", "epsilon_schedule", "n_step_transition"]
