"""The NumPy twin of the Q-network (`core.policies.NumpyQNetwork`: what the in-process evaluation, the snapshot
evaluator and the Q probe compute with) against the TF network, with a dueling head and noisy layers (their mean
weights, as the greedy policy): the same Q-values and greedy actions on random states, also from the pickled arrays a
snapshot hands the evaluator's process."""

from __future__ import annotations

import contextlib
import pickle

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from helpers import SMOKE

from dqn_cartpole.config import load_config
from dqn_cartpole.core.numpy_episodes import greedy_act, q_values_of
from dqn_cartpole.distributed import parts

SWITCHES = {"dueling": ["network.dueling=true"], "noisy": ["network.noisy=true"],
            "noisy dueling": ["network.dueling=true", "network.noisy=true"]}


def scramble(network: tf.keras.Model, seed: int) -> None:
    """Weights far from their initial near-equal outputs, so every stream and every mean counts."""
    rng = np.random.default_rng(seed)
    for variable in network.variables:
        variable.assign(rng.normal(scale=0.5, size=variable.shape).astype(np.float32))


@pytest.mark.parametrize("kind", ["dqn", "c51"])
@pytest.mark.parametrize("switches", list(SWITCHES))
def test_the_numpy_greedy_q_values_are_the_tf_networks(kind, switches):
    path, sets = (None, ["agent.kind=c51"]) if kind == "c51" else (SMOKE, ["agent.kind=dqn"])
    config = load_config(path, sets + SWITCHES[switches])
    states = np.random.default_rng(1).normal(scale=2.0, size=(64, 4)).astype(np.float32)
    with contextlib.ExitStack() as stack:
        _, _, agent = parts.agent_with_envs(config, 1, 0, stack)
        greedy = agent.numpy_greedy()
        assert greedy is not None
        scramble(agent.q_network, seed=2)  # the twin reads the live weights at each snapshot
        expected = agent.q_values(tf.constant(states))[0].numpy()  # noisy: on the mean weights
        layers = pickle.loads(pickle.dumps(greedy.layers()))  # as a snapshot reaches the evaluator's process
        np.testing.assert_allclose(q_values_of(layers)(states), expected, rtol=1e-4, atol=1e-4)
        assert np.ptp(expected, axis=-1).mean() > 1e-2  # the actions differ, so the argmax below means something
        step = ts.restart(tf.constant(states), batch_size=len(states))
        actions = agent.policy.action(step).action.numpy()
        np.testing.assert_array_equal(greedy_act(layers, greedy.minimum_action)(states), actions)
        np.testing.assert_array_equal(greedy.snapshot()(states), actions)
