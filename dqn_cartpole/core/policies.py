"""Fast batched action selection for TF policies, saved policies and the random policy.

A policy here is reduced to `act(time_step) -> actions`, numpy in and out, so evaluation and
video recording don't care whether it came from the agent, a SavedModel or a coin flip. An
agent's own greedy policy is also available as `NumpyGreedy`: the same argmax over the same
weights (over the expected Q-values, for a distributional agent), computed in NumPy (what the
in-process evaluations use). The agent says whether it has one (`ValueAgent.numpy_greedy`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np
import tensorflow as tf
from tf_agents.policies import random_py_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.core.networks import DuelingHead, NoisyDense
from dqn_cartpole.core.numpy_episodes import ACTIVATIONS, DUELING, EXPECTED_Q, DenseLayer, greedy_act, q_values_of

ActFn = Callable[[ts.TimeStep], np.ndarray]


def compiled_act_fn(policy, time_step_spec: Optional[ts.TimeStep] = None) -> ActFn:
    """Wraps `policy.action` in one compiled call per batched step.

    Works for an in-memory TFPolicy and for a policy loaded with `tf.saved_model.load`.
    """
    spec = time_step_spec if time_step_spec is not None else policy.time_step_spec
    signature = tensor_spec.add_outer_dim(spec)  # any batch size, one trace

    @tf.function(input_signature=[signature], autograph=False)
    def action(time_step):
        return policy.action(time_step).action

    def act(time_step: ts.TimeStep) -> np.ndarray:
        return action(time_step).numpy()

    return act


def random_act_fn(time_step_spec, action_spec, seed: Optional[int] = None) -> ActFn:
    """Uniformly random actions from TF-Agents' RandomPyPolicy."""
    policy = random_py_policy.RandomPyPolicy(
        tensor_spec.to_nest_array_spec(time_step_spec), tensor_spec.to_nest_array_spec(action_spec), seed=seed,
        outer_dims=None,
    )

    def act(time_step: ts.TimeStep) -> np.ndarray:
        batch = np.asarray(time_step.step_type).shape[0]
        return np.stack([policy.action(ts.TimeStep(*[np.asarray(x)[i] for x in time_step])).action
                         for i in range(batch)])

    return act


class NumpyQNetwork:
    """The Q-values of a Q-network that is a stack of Dense layers, computed in NumPy from the network's weights as
    they are when `snapshot` (or `layers`) is called (see `NumpyGreedy` for why). Noisy layers (`network.noisy`)
    count with their mean weights, as the greedy policy acts, and the last layer may be a dueling head
    (`network.dueling`). `of` says None for a network it cannot reproduce exactly (another layer, activation,
    observation shape, or an output that is not one Q-value per action). With a `support`, the last layer gives
    every action's atom logits and the Q-values are their expectations (C51: `categorical`)."""

    def __init__(self, dense_layers: list, support: Optional[np.ndarray] = None):
        self.dense_layers = dense_layers
        self.support = support

    @classmethod
    def of(cls, q_network: Any, num_actions: Optional[int] = None) -> Optional["NumpyQNetwork"]:
        """The NumPy twin of `q_network` (observations [B, d] -> (Q-values [B, actions], state)), or None if the
        network is not a stack of Dense layers with ReLU or linear activations on 1-D inputs, or (given
        `num_actions`) its last layer is not one unit per action: a categorical head's actions x atoms logits
        would be argmaxed as if they were Q-values."""
        layers = getattr(q_network, "layers", None)
        input_spec = getattr(q_network, "input_tensor_spec", None)
        if not layers or input_spec is None or len(getattr(input_spec, "shape", ())) != 1:
            return None
        if not _dense_stack(layers) or _atoms(layers[-1]) != 1:
            return None
        if num_actions is not None and _outputs(layers[-1]) != num_actions:
            return None
        return cls(list(layers))

    @classmethod
    def categorical(cls, dense_layers: list, support: np.ndarray, num_actions: int) -> Optional["NumpyQNetwork"]:
        """The expected Q-values of `dense_layers` whose last one gives [B, num_actions x atoms] logits over
        `support` (the atoms' values), or None if they are not such a stack."""
        support = np.asarray(support, np.float32)
        if not dense_layers or not _dense_stack(dense_layers):
            return None
        last = dense_layers[-1]
        if _outputs(last) != num_actions * len(support) or _atoms(last) not in (1, len(support)):
            return None
        return cls(list(dense_layers), support)

    def layers(self) -> list[DenseLayer]:
        """The weights as they are now, as arrays (copies): [(kernel, bias or None, activation name)] per layer (a
        dueling head: see `numpy_episodes.DUELING`), and the expected-Q head (see `numpy_episodes.EXPECTED_Q`) if
        any, which `numpy_episodes` computes with, in this process or another."""
        layers = [_arrays(layer) for layer in self.dense_layers]
        return layers + ([(self.support.copy(), None, EXPECTED_Q)] if self.support is not None else [])

    def snapshot(self) -> Callable[[np.ndarray], np.ndarray]:
        """q_values(observations [B, d]) -> [B, actions], with the weights as they are now."""
        return q_values_of(self.layers())


def _linear_arrays(layer: Any) -> tuple:
    """(kernel, bias or None) of a Dense layer, or of a noisy layer's mean weights (the greedy policy's)."""
    if isinstance(layer, NoisyDense):
        return layer.kernel_mu.numpy(), layer.bias_mu.numpy()
    return layer.kernel.numpy(), layer.bias.numpy() if layer.use_bias else None


def _arrays(layer: Any) -> DenseLayer:
    if isinstance(layer, DuelingHead):
        return _linear_arrays(layer.value), _linear_arrays(layer.advantage), DUELING
    return _linear_arrays(layer) + (layer.activation.__name__,)


def _outputs(layer: Any) -> int:
    """The layer's output units (a dueling head's: actions x atoms)."""
    return layer.num_actions * (layer.num_atoms or 1) if isinstance(layer, DuelingHead) else layer.units


def _atoms(layer: Any) -> int:
    """The atoms a dueling head computes per action (1: Q-values; a plain layer: 1, its units are the caller's)."""
    return (layer.num_atoms or 1) if isinstance(layer, DuelingHead) else 1


def _computable(layer: Any, activations: Any = ACTIVATIONS) -> bool:
    """A Keras Dense or a noisy layer with an activation NumPy computes."""
    return type(layer) in (tf.keras.layers.Dense, NoisyDense) and \
        getattr(layer.activation, "__name__", None) in activations


def _dense_stack(layers: list) -> bool:
    """Whether every layer is a Dense (or noisy) layer with an activation NumPy computes, the last maybe a dueling
    head of linear streams."""
    last = layers[-1]
    if isinstance(last, DuelingHead):
        return all(_computable(stream, ("linear",)) for stream in (last.value, last.advantage)) and \
            all(_computable(layer) for layer in layers[:-1])
    return all(_computable(layer) for layer in layers)


class NumpyGreedy:
    """The greedy action, argmax over actions of Q(s, a), of a `NumpyQNetwork`.

    It is the agent's greedy policy (`agent.policy`: TF-Agents' GreedyPolicy over a QPolicy) without the
    graph: a batched step of the compiled evaluation loop pays about 150 us of TensorFlow overhead (the
    loop's function calls and the env's `numpy_function`) around 70 us of env and 10 us of network, so
    evaluating in NumPy takes about a third of the time, and nothing has to be traced. `of` says None for
    a network `NumpyQNetwork` cannot reproduce or a non-scalar action: the caller then runs the TF policy.
    """

    def __init__(self, q_network: NumpyQNetwork, minimum_action: int):
        self.q_network, self.minimum_action = q_network, minimum_action

    @classmethod
    def of(cls, q_network: Any, action_spec: Any) -> Optional["NumpyGreedy"]:
        """The NumPy greedy policy of `q_network` for actions `action_spec`, or None (see the class)."""
        if tf.nest.is_nested(action_spec) or action_spec.shape.rank != 0:
            return None
        num_actions = int(np.asarray(action_spec.maximum)) - int(np.asarray(action_spec.minimum)) + 1
        numpy_q = NumpyQNetwork.of(q_network, num_actions)
        return None if numpy_q is None else cls(numpy_q, int(np.asarray(action_spec.minimum)))

    def layers(self) -> list[DenseLayer]:
        """The weights as they are now, as arrays (what a snapshot of this policy hands a worker)."""
        return self.q_network.layers()

    def snapshot(self) -> Callable[[np.ndarray], np.ndarray]:
        """act(observations [B, d]) -> actions [B] (int64), with the weights as they are now."""
        return greedy_act(self.q_network.layers(), self.minimum_action)

    @classmethod
    def of_layers(cls, layers: list[DenseLayer], minimum_action: int) -> "NumpyGreedy":
        """The greedy policy of fixed weights (arrays: a snapshot's `layers`), whatever the network does later."""
        return cls(FixedLayers(layers), minimum_action)


class FixedLayers:
    """A `NumpyQNetwork` stand-in whose weights are given arrays."""

    def __init__(self, layers: list[DenseLayer]):
        self._layers = layers

    def layers(self) -> list[DenseLayer]:
        return self._layers


def greedy_policy(agent: Any) -> Union[NumpyGreedy, Any]:
    """What evaluates `agent`'s greedy policy fastest, as the agent gives it (`ValueAgent`): its NumPy greedy
    policy, or its TF policy."""
    return agent.numpy_greedy() or agent.policy
