"""C51 behind the agent interface, in process: the expected Q-values are what every reader of Q sees (the greedy
action, its NumPy twin that the evaluations and the evaluator process play, the max-Q estimates), and no
categorical head is ever argmaxed as if its atom logits were Q-values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.networks import sequential
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.config import load_config
from dqn_cartpole.core import agents
from dqn_cartpole.core.numpy_episodes import greedy_act, mean_max_q
from dqn_cartpole.core.policies import NumpyGreedy, NumpyQNetwork, compiled_act_fn, greedy_policy
from dqn_cartpole.core.q_probe import MaxQ, QProbe

OBSERVATION_SPEC = tensor_spec.TensorSpec([4], tf.float32, "observation")
ACTION_SPEC = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1, "action")
STATES = np.random.default_rng(0).normal(scale=0.8, size=(64, 4)).astype(np.float32)


def build(**agent_fields) -> agents.C51ValueAgent:
    config = load_config(None, ["agent.kind=c51", "agent.num_atoms=11", "agent.min_q_value=-3",
                                "agent.max_q_value=3"])
    agent_config = dataclasses.replace(config.agent, epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_steps=10,
                                       **agent_fields)
    return agents.build_agent(agent_config, dataclasses.replace(config.network, fc_layer_params=(16,)),
                              ts.time_step_spec(OBSERVATION_SPEC), ACTION_SPEC)


def windows(agent, batch: int = 8):
    """A [batch, n + 1] batch of mid-episode windows of small observations."""
    sample = tensor_spec.sample_spec_nest(agent.collect_data_spec, outer_dims=(batch, agent.window_length), seed=0)
    shape = sample.observation.shape
    return sample._replace(step_type=tf.ones_like(sample.step_type), next_step_type=tf.ones_like(sample.step_type),
                           discount=tf.ones_like(sample.discount), reward=tf.ones_like(sample.reward),
                           observation=tf.random.stateless_normal(shape, seed=(1, 2)))


def expected_q_by_hand(agent, states: np.ndarray) -> np.ndarray:
    logits = agent.q_network(states)[0].numpy()  # the categorical network: [B, actions, atoms]
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (z / z.sum(axis=-1, keepdims=True)) @ np.linspace(-3, 3, 11)


def spread_out(agent) -> None:
    """Weights whose expected Q-values differ between actions and across states (the fresh head is near uniform)."""
    rng = np.random.default_rng(1)
    for variable in agent.q_network.trainable_variables:
        variable.assign(rng.normal(scale=0.6, size=variable.shape).astype(np.float32))


def test_c51_holds_the_interface_and_trains_through_it():
    agent = build()
    assert isinstance(agent, agents.ValueAgent) and isinstance(agent.tf_agent, agents.C51Agent)
    assert agent.window_length == load_config().agent.n_step + 1
    assert agent.epsilon() == pytest.approx(1.0)
    before = [v.numpy() for v in agent.q_network.trainable_variables]
    loss = agent.train(windows(agent)).loss
    assert np.isfinite(float(loss)) and int(agent.train_step_counter.numpy()) == 1
    assert agent.epsilon() == pytest.approx(1.0 - 0.09)  # the schedule follows the train step
    assert any(not np.allclose(a, v.numpy()) for a, v in zip(before, agent.q_network.trainable_variables))


def test_every_reader_of_q_sees_the_expected_q_values_and_the_same_greedy_action():
    agent = build()
    spread_out(agent)
    by_hand = expected_q_by_hand(agent, STATES)
    assert len(set(by_hand.argmax(axis=1))) == 2  # both actions are greedy somewhere: an argmax can be wrong
    np.testing.assert_allclose(agent.q_values(STATES)[0].numpy(), by_hand, rtol=1e-5, atol=1e-5)
    greedy = greedy_policy(agent)
    assert isinstance(greedy, NumpyGreedy)  # the NumPy twin of the atoms: the evaluations' fast path
    np.testing.assert_allclose(greedy.q_network.snapshot()(STATES), by_hand, rtol=1e-5, atol=1e-5)
    tf_actions = compiled_act_fn(agent.policy)(ts.restart(tf.constant(STATES), batch_size=len(STATES)))
    np.testing.assert_array_equal(tf_actions, by_hand.argmax(axis=1))
    np.testing.assert_array_equal(greedy.snapshot()(STATES), by_hand.argmax(axis=1))
    # The evaluator process gets the layers as arrays (no TensorFlow there): the head travels with them.
    layers = greedy.q_network.layers()
    np.testing.assert_array_equal(greedy_act(layers, 0)(STATES), by_hand.argmax(axis=1))
    assert mean_max_q(layers, STATES) == pytest.approx(by_hand.max(axis=1).mean(), rel=1e-5)
    assert MaxQ.of_agent(agent)(STATES) == pytest.approx(by_hand.max(axis=1).mean(), rel=1e-5)
    assert MaxQ(agent.q_values, None)(STATES) == pytest.approx(by_hand.max(axis=1).mean(), rel=1e-5)  # compiled
    probe = QProbe.for_agent(agent, "CartPole-v1", seed=0)
    assert probe() == pytest.approx(expected_q_by_hand(agent, probe.states).max(axis=1).mean(), rel=1e-5)


def test_the_return_distribution_is_the_networks_softmax_over_the_atoms():
    agent = build()
    spread_out(agent)
    distribution = agent.return_distribution(STATES)
    logits = agent.q_network(STATES)[0].numpy()  # [B, actions, atoms]
    by_hand = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(distribution.support, np.linspace(-3, 3, 11), rtol=1e-6)
    np.testing.assert_allclose(distribution.probabilities, by_hand, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(distribution.probabilities.sum(axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(distribution.expected_q(), agent.q_values(STATES)[0].numpy(), rtol=1e-5, atol=1e-5)


def test_a_categorical_head_is_never_argmaxed_as_q_values():
    agent = build()
    assert NumpyQNetwork.of(agent.q_network, 2) is None and NumpyGreedy.of(agent.q_network, ACTION_SPEC) is None
    head = sequential.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(2 * 11)])
    head.create_variables(OBSERVATION_SPEC)
    assert NumpyQNetwork.of(head, num_actions=2) is None  # 22 outputs for 2 actions: refused
    assert NumpyGreedy.of(head, ACTION_SPEC) is None
    plain = sequential.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(2)])
    plain.create_variables(OBSERVATION_SPEC)
    assert NumpyQNetwork.of(plain, num_actions=2) is not None


def test_a_c51_checkpoint_restores_into_a_fresh_agent_at_once(tmp_path):
    trained = build(learning_rate=0.01)
    trained.train(windows(trained))
    path = tf.train.Checkpoint(**trained.checkpoint_objects()).write(str(tmp_path / "ckpt"))
    fresh = build(learning_rate=0.01)
    tf.train.Checkpoint(**fresh.checkpoint_objects()).read(path).assert_existing_objects_matched().assert_consumed()
    np.testing.assert_allclose(fresh.q_values(STATES)[0].numpy(), trained.q_values(STATES)[0].numpy())
