"""Dueling networks (`network.dueling`): the head's arithmetic on hand-set weights (Q = V + A - mean(A), and per atom
for C51), and the agents that train with it (the policy it exports loads with TensorFlow alone: test_resume)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from helpers import SMOKE

from dqn_cartpole.config import load_config
from dqn_cartpole.core.networks import DuelingHead
from dqn_cartpole.distributed import parts


def hand_set(head: DuelingHead, features: int, value: tuple, advantage: tuple) -> None:
    head(tf.zeros([1, features]))  # builds both streams
    head.value.set_weights([np.array(w, np.float32) for w in value])
    head.advantage.set_weights([np.array(w, np.float32) for w in advantage])


def test_the_dueling_head_is_value_plus_advantage_minus_its_mean():
    head = DuelingHead(3)
    hand_set(head, 2, value=([[1.0], [2.0]], [0.5]), advantage=([[1.0, 0.0, -1.0], [0.0, 1.0, 2.0]], [0.0, 0.0, 0.0]))
    # features (1, 2): V = 1 + 4 + 0.5 = 5.5; A = (1, 2, 3), mean 2; Q = 5.5 + (-1, 0, 1).
    np.testing.assert_array_equal(head(tf.constant([[1.0, 2.0]])).numpy(), [[4.5, 5.5, 6.5]])


def test_the_distributional_dueling_head_does_it_per_atom():
    head = DuelingHead(2, num_atoms=3)
    hand_set(head, 1, value=([[1.0, 2.0, 3.0]], [0.0, 0.0, 0.0]),
             advantage=([[1.0, 0.0, 0.0, 3.0, 0.0, 2.0]], [0.0] * 6))
    # feature 1: V = (1, 2, 3); A = ((1, 0, 0), (3, 0, 2)), its mean over actions (2, 0, 1) per atom.
    np.testing.assert_array_equal(head(tf.constant([[1.0]])).numpy(), [[[0.0, 2.0, 2.0], [2.0, 2.0, 4.0]]])


@pytest.mark.parametrize("kind", ["dqn", "double_dqn", "c51"])
def test_each_agent_trains_with_a_dueling_head_and_its_own_target_copy(kind):
    path, sets = (None, ["agent.kind=c51"]) if kind == "c51" else (SMOKE, [f"agent.kind={kind}"])
    config = load_config(path, sets + ["network.dueling=true"])
    with contextlib.ExitStack() as stack:
        _, _, agent = parts.agent_with_envs(config, 1, 0, stack)
        heads = [layer for layer in agent.q_network.layers if isinstance(layer, DuelingHead)]
        assert len(heads) == 1 and agent.q_network.layers[-1] is heads[0]
        target = agent.tf_agent._target_q_network  # pylint: disable=protected-access
        online_ids = {id(v) for v in agent.q_network.variables}
        assert target.variables and not online_ids & {id(v) for v in target.variables}
        q, _ = agent.q_values(tf.zeros([3, 4]))
        assert q.shape == (3, 2)
        assert agent.numpy_greedy() is not None  # the NumPy twin computes the head: test_numpy_twin
