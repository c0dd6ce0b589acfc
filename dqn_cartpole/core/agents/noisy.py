"""Noisy networks (`network.noisy`) behind the agent seam: exploration comes from the noisy layers (`core.networks.
NoisyDense`, fresh noise at every collect step and every train step), so the collect policy's epsilon is 0; the
greedy policy, the Q-values the evaluation and the probe read, and so the exported policy, act on the mean weights
(`networks.mean_weights`), so they are deterministic."""

from __future__ import annotations

from typing import Any, Callable, Optional

from tf_agents.policies import tf_policy

from dqn_cartpole.config import NetworkConfig
from dqn_cartpole.core.networks import mean_weights


def noisy_sigma0(network_config: NetworkConfig) -> Optional[float]:
    """The noisy layers' sigma0, or None for plain layers."""
    return network_config.noisy_sigma0 if network_config.noisy else None


class MeanWeightsPolicy(tf_policy.TFPolicy):
    """`policy`, with every noisy layer it runs on its mean weights: the greedy policy of a noisy network."""

    def __init__(self, policy: tf_policy.TFPolicy):
        super().__init__(policy.time_step_spec, policy.action_spec, policy.policy_state_spec, policy.info_spec,
                         clip=False, emit_log_probability=policy.emit_log_probability,
                         name=f"{policy.name}_mean_weights")
        self._wrapped = policy

    def _variables(self) -> list:
        return self._wrapped.variables()

    def _distribution(self, time_step, policy_state):
        with mean_weights():
            return self._wrapped.distribution(time_step, policy_state)

    def _action(self, time_step, policy_state, seed):
        with mean_weights():
            return self._wrapped.action(time_step, policy_state, seed)


def on_mean_weights(function: Callable) -> Callable:
    """`function` run with every noisy layer on its mean weights."""

    def mean(*args, **kwargs):
        with mean_weights():
            return function(*args, **kwargs)

    return mean


def act_on_mean_weights(adapter: Any) -> Any:
    """Makes a noisy agent's greedy policy and Q-values (a `TfAgentAdapter`'s) act on the mean weights; its collect
    policy keeps the noise. Returns the adapter."""
    adapter.policy = MeanWeightsPolicy(adapter.policy)
    adapter.q_values = on_mean_weights(adapter.q_values)
    return adapter
