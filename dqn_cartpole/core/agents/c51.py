"""C51 (Bellemare et al., 2017): an adapter around TF-Agents' CategoricalDqnAgent and CategoricalQNetwork.

The network gives, per action, logits over `num_atoms` returns evenly spaced from `min_q_value` to
`max_q_value` (the support); an action's Q-value is the expectation of that distribution. The loss
is the cross-entropy between the taken action's distribution and the target: the target network's
distribution at the bootstrap state, for the action greedy under the target network's expected Q,
shifted by the n-step return and scaled by the bootstrap discount (r + gamma^k d z), then projected
back onto the support.

The library's `_loss` builds its own n-step return by multiplying the window's discounts, which
runs on past a truncation or the resume seam into the next episode. This module's loss takes the
window's transition from `n_step.n_step_transition` instead, the rule DQN's loss applies, and
masks windows that start at a LAST step, as DQN's does.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.categorical_dqn import categorical_dqn_agent
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import categorical_q_network
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib
from tf_agents.utils import common

from dqn_cartpole.config import AgentConfig, NetworkConfig, c51_values
from dqn_cartpole.core.agents.common import EpisodeWindowsTrainMixin, TfAgentAdapter, agent_args
from dqn_cartpole.core.agents.n_step import valid_mask
from dqn_cartpole.core.agents.noisy import act_on_mean_weights, noisy_sigma0
from dqn_cartpole.core.agents.protocol import ReturnDistribution
from dqn_cartpole.core.networks import CategoricalSequentialQNetwork, mean_weights
from dqn_cartpole.core.policies import NumpyQNetwork


class C51Agent(EpisodeWindowsTrainMixin, categorical_dqn_agent.CategoricalDqnAgent):
    """CategoricalDqnAgent whose loss reads episode-aware n-step windows; global-norm clipping; with `double_q`, the
    online network picks the next action (`agent.double_q`)."""

    double_q = False  # set by the builder before the first trace

    def _next_q_distribution(self, next_time_steps: ts.TimeStep) -> tf.Tensor:
        """The target network's distribution at the next state [B, atoms], for the action greedy under the target
        network's expected Q (the library's) or, with `double_q`, under the online network's (Rainbow)."""
        if not self.double_q:
            return super()._next_q_distribution(next_time_steps)
        observation, step_type = next_time_steps.observation, next_time_steps.step_type
        target_logits, _ = self._target_q_network(observation, step_type=step_type, training=False)
        online_logits, _ = self._q_network(observation, step_type=step_type, training=False)
        online_q = common.convert_q_logits_to_values(online_logits, self._support)
        action = tf.argmax(online_q, axis=-1, output_type=tf.int32)
        return tf.gather(tf.nn.softmax(target_logits), action, axis=1, batch_dims=1)

    def target_distribution(self, experience: trajectory_lib.Trajectory) -> tuple[tf.Tensor, tf.Tensor]:
        """(valid mask [B], target distribution [B, atoms]) of a [B, n + 1] batch, exactly as the loss computes
        them."""
        time_steps, _, next_time_steps = self.n_step_transitions(experience)
        return valid_mask(time_steps), self._projected_target(next_time_steps, self._gamma, self._reward_scale_factor)

    def _projected_target(self, next_time_steps: ts.TimeStep, gamma: float, reward_scale_factor: float) -> tf.Tensor:
        """The Bellman update of the target network's next distribution, r + gamma^k d z, projected on the support."""
        reward = reward_scale_factor * next_time_steps.reward[:, None]
        target_support = reward + gamma * next_time_steps.discount[:, None] * self._support[None, :]
        next_probabilities = self._next_q_distribution(next_time_steps)  # the target network's, at its greedy action
        return categorical_dqn_agent.project_distribution(target_support, next_probabilities, self._support)

    def _loss(self, experience, td_errors_loss_fn=None, gamma=1.0, reward_scale_factor=1.0, weights=None,
              training=False):
        """The cross-entropy of the taken action's distribution against the projected target, windows that start
        at a LAST step masked."""
        del td_errors_loss_fn  # C51's loss is the cross-entropy
        time_steps, policy_steps, next_time_steps = self.n_step_transitions(experience)
        target = tf.stop_gradient(self._projected_target(next_time_steps, gamma, reward_scale_factor))
        logits, _ = self._q_network(time_steps.observation, step_type=time_steps.step_type, training=training)
        actions = tf.cast(policy_steps.action, tf.int32) - int(self.action_spec.minimum)
        chosen = tf.gather(logits, actions, axis=1, batch_dims=1)  # [B, atoms]
        cross_entropy = tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=chosen)
        per_example = valid_mask(time_steps) * cross_entropy
        losses = common.aggregate_losses(per_example_loss=per_example, sample_weight=weights,
                                         regularization_loss=self._q_network.losses)
        return tf_agent.LossInfo(losses.total_loss, dqn_agent.DqnLossInfo(td_loss=per_example, td_error=()))


class ExpectedQ:
    """states -> (expected Q-values [B, actions], state) of a categorical network: each action's atoms weighted by
    their probabilities (what the greedy policy maximises)."""

    def __init__(self, network: categorical_q_network.CategoricalQNetwork, support: tf.Tensor):
        self.network, self.support = network, support

    def __call__(self, observation, step_type=None, network_state=(), training=False):
        logits, state = self.network(observation, step_type=step_type, network_state=network_state, training=training)
        return common.convert_q_logits_to_values(logits, self.support), state


class C51ValueAgent(TfAgentAdapter):
    """The `ValueAgent` of C51: the Q-values are the expected returns; the NumPy twin computes them from the atoms."""

    def __init__(self, agent: C51Agent):
        network = agent._q_network  # pylint: disable=protected-access
        support = agent._support  # pylint: disable=protected-access
        q_values = ExpectedQ(network, support)
        num_actions = int(agent.action_spec.maximum - agent.action_spec.minimum + 1)
        super().__init__(agent, q_values, numpy_twin(network, q_values, support.numpy(), num_actions))
        self.support = support.numpy()

    @staticmethod
    def item_priorities(loss_info: Any) -> tf.Tensor:
        """Each item's cross-entropy against its projected target (`protocol.PrioritizedAgent`), as Rainbow
        prioritizes C51 (0 for a window that starts at a LAST step)."""
        return loss_info.extra.td_loss

    def return_distribution(self, states) -> ReturnDistribution:
        """The online network's probabilities over the atoms, per action: the softmax of its atom logits."""
        with mean_weights():  # noisy layers (network.noisy): the mean network's, as the greedy policy's
            logits, _ = self.q_network(tf.constant(states, dtype=tf.float32), training=False)
        return ReturnDistribution(self.support.copy(), tf.nn.softmax(logits, axis=-1).numpy())


def numpy_twin(network: Any, q_values: ExpectedQ, support: np.ndarray, num_actions: int) -> Optional[NumpyQNetwork]:
    """The network's expected Q-values in NumPy: its Dense (or noisy, on their mean weights) layers and its
    atom-logit layer or distributional dueling head, then the expectation over `support`. None unless the network is
    such a stack and the twin agrees with it."""
    stack = _logit_stack(network)
    twin = NumpyQNetwork.categorical(stack, support, num_actions) if stack else None
    observation_spec = network.input_tensor_spec
    if twin is None or tf.nest.is_nested(observation_spec) or len(observation_spec.shape) != 1:
        return None
    probe = np.random.default_rng(0).normal(size=(8,) + tuple(observation_spec.shape)).astype(np.float32)
    with mean_weights():  # network.noisy: the twin is the mean network, as the greedy policy
        expected = q_values(probe)[0].numpy()
    if not np.allclose(twin.snapshot()(probe), expected, rtol=1e-4, atol=1e-4):
        return None  # a network this twin does not reproduce: the TF policy evaluates it
    return twin


def _logit_stack(network: Any) -> Optional[list]:
    """The layers from the observations to the [B, actions x atoms] logits, flat (a Reshape to [actions, atoms] and
    a Flatten of 1-D observations are identities there), or None for a network of another make."""
    if isinstance(network, CategoricalSequentialQNetwork):  # network.dueling or network.noisy
        return [layer for layer in network.layers if not isinstance(layer, tf.keras.layers.Reshape)]
    if not isinstance(network, categorical_q_network.CategoricalQNetwork):
        return None
    inner = network._q_network  # pylint: disable=protected-access  # a QNetwork with actions x atoms outputs
    encoder = inner._encoder  # pylint: disable=protected-access
    if encoder._flat_preprocessing_layers is not None:  # pylint: disable=protected-access
        return None
    hidden = [layer for layer in encoder._postprocessing_layers  # pylint: disable=protected-access
              if not isinstance(layer, tf.keras.layers.Flatten)]  # 1-D observations: Flatten is the identity
    return hidden + [inner._q_value_layer]  # pylint: disable=protected-access


def build_c51_agent(
    agent_config: AgentConfig,
    network_config: NetworkConfig,
    time_step_spec: ts.TimeStep,
    action_spec: tensor_spec.BoundedTensorSpec,
) -> C51ValueAgent:
    """Builds and initialises C51 (`kind: c51`) from the config, behind the `ValueAgent` interface."""
    num_atoms, min_q_value, max_q_value = c51_values(agent_config)
    args = agent_args(agent_config, network_config)
    if network_config.dueling or network_config.noisy:
        num_actions = int(action_spec.maximum - action_spec.minimum + 1)
        network = CategoricalSequentialQNetwork(tuple(network_config.fc_layer_params), num_actions, num_atoms,
                                                network_config.dueling, noisy_sigma0(network_config),
                                                input_spec=time_step_spec.observation)
    else:
        network = categorical_q_network.CategoricalQNetwork(
            time_step_spec.observation, action_spec, num_atoms=num_atoms,
            fc_layer_params=tuple(network_config.fc_layer_params))
    agent = C51Agent(
        time_step_spec,
        action_spec,
        categorical_q_network=network,
        min_q_value=min_q_value,
        max_q_value=max_q_value,
        **args,
    )
    agent.double_q = agent_config.double_q
    agent.initialize()
    adapter = C51ValueAgent(agent)
    return act_on_mean_weights(adapter) if network_config.noisy else adapter
