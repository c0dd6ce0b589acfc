"""The DQN agent (or Double DQN) with its optimizer, loss, epsilon schedule and n-step targets.

Its loss sees each [B, n + 1] window through the episode-aware n-step rule (`n_step.n_step_transition`:
the return stops at the window's first LAST step, a termination or a truncation or the resume seam),
then computes DqnAgent's TD target from that transition.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib
from tf_agents.utils import common

from dqn_cartpole.config import AgentConfig, NetworkConfig
from dqn_cartpole.core.agents.common import EpisodeWindowsTrainMixin, TfAgentAdapter, agent_args
from dqn_cartpole.core.agents.n_step import valid_mask
from dqn_cartpole.core.agents.noisy import act_on_mean_weights, noisy_sigma0
from dqn_cartpole.core.networks import build_q_network
from dqn_cartpole.core.policies import NumpyQNetwork

TD_LOSSES = {"squared": common.element_wise_squared_loss, "huber": common.element_wise_huber_loss}


class _DqnTargetsMixin(EpisodeWindowsTrainMixin):
    """DqnAgent's loss and TD targets on episode-aware n-step transitions."""

    def _loss(self, experience, **kwargs):
        """DqnAgent's loss of the windows' n-step transitions (DqnAgent takes a Transition as it is)."""
        return super()._loss(self.n_step_transitions(experience), **kwargs)

    def td_targets(self, experience: trajectory_lib.Trajectory) -> tuple[tf.Tensor, tf.Tensor]:
        """(valid mask, TD targets) of a [B, n + 1] batch, exactly as the loss computes them."""
        time_steps, actions, next_time_steps = self.n_step_transitions(experience)
        next_q = self._compute_next_q_values(next_time_steps, actions.info)
        targets = dqn_agent.compute_td_targets(next_q, rewards=self._reward_scale_factor * next_time_steps.reward,
                                               discounts=self._gamma * next_time_steps.discount)
        return valid_mask(time_steps), targets


class DqnAgent(_DqnTargetsMixin, dqn_agent.DqnAgent):
    """DqnAgent with episode-aware n-step targets and global-norm clipping."""


class DdqnAgent(_DqnTargetsMixin, dqn_agent.DdqnAgent):
    """DdqnAgent with episode-aware n-step targets and global-norm clipping."""


class DqnFamilyAgent(TfAgentAdapter):
    """The `ValueAgent` of DQN and Double DQN: an adapter around TF-Agents' (Ddqn)DqnAgent above. Its Q-values are
    the Q-network's outputs, computed in NumPy when the network is a plain stack of Dense layers."""

    def __init__(self, agent: DqnAgent):
        q_network = agent._q_network  # pylint: disable=protected-access
        num_actions = int(agent.action_spec.maximum - agent.action_spec.minimum + 1)
        super().__init__(agent, q_network, NumpyQNetwork.of(q_network, num_actions))

    @staticmethod
    def item_priorities(loss_info: Any) -> tf.Tensor:
        """|n-step TD error| of each item (`protocol.PrioritizedAgent`): the library's td_error, r + gamma^k d Q' - Q,
        masked to 0 for a window that starts at a LAST step."""
        return tf.abs(loss_info.extra.td_error)


def build_dqn_agent(
    agent_config: AgentConfig,
    network_config: NetworkConfig,
    time_step_spec: ts.TimeStep,
    action_spec: tensor_spec.BoundedTensorSpec,
) -> DqnFamilyAgent:
    """Builds and initialises a DqnAgent (`kind: dqn`) or DdqnAgent (`double_dqn`), behind the `ValueAgent`
    interface."""
    num_actions = int(action_spec.maximum - action_spec.minimum + 1)
    args = agent_args(agent_config, network_config)
    agent_class = DdqnAgent if agent_config.kind == "double_dqn" else DqnAgent
    agent = agent_class(
        time_step_spec,
        action_spec,
        q_network=build_q_network(network_config.fc_layer_params, num_actions, network_config.dueling,
                                  noisy_sigma0(network_config)),
        td_errors_loss_fn=TD_LOSSES[agent_config.td_loss],
        **args,
    )
    agent.initialize()
    adapter = DqnFamilyAgent(agent)
    return act_on_mean_weights(adapter) if network_config.noisy else adapter
