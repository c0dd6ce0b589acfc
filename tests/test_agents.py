"""The agent interface (`core.agents.ValueAgent`), in process: what a run relies on, held by DQN and Double DQN."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.config import load_config
from dqn_cartpole.core import agents
from dqn_cartpole.core.policies import NumpyGreedy, greedy_policy

OBSERVATION_SPEC = tensor_spec.TensorSpec([4], tf.float32, "observation")
ACTION_SPEC = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1, "action")


def build(double: bool = False, **agent_fields) -> agents.DqnFamilyAgent:
    config = load_config()
    agent_config = dataclasses.replace(config.agent, kind="double_dqn" if double else "dqn", epsilon_start=1.0, epsilon_end=0.1,
                                       epsilon_decay_steps=10, **agent_fields)
    return agents.build_agent(agent_config, dataclasses.replace(config.network, fc_layer_params=(8,)),
                              ts.time_step_spec(OBSERVATION_SPEC), ACTION_SPEC)


def windows(batch: int = 4, n: int = 1):
    """A [batch, n + 1] batch of mid-episode windows of the agent's collect data spec."""
    spec = build().collect_data_spec
    sample = tensor_spec.sample_spec_nest(spec, outer_dims=(batch, n + 1), seed=0)
    return sample._replace(step_type=tf.ones_like(sample.step_type), next_step_type=tf.ones_like(sample.step_type),
                           discount=tf.ones_like(sample.discount))


@pytest.mark.parametrize("double", [False, True], ids=["dqn", "double_dqn"])
def test_dqn_and_double_dqn_hold_the_interface(double):
    agent = build(double)
    assert isinstance(agent, agents.ValueAgent)
    assert isinstance(agent.tf_agent, agents.DdqnAgent if double else agents.DqnAgent)
    assert agent.epsilon() == pytest.approx(1.0)
    agent.train(windows())
    assert int(agent.train_step_counter.numpy()) == 1
    assert agent.epsilon() == pytest.approx(1.0 - 0.09)  # the schedule follows the train step
    q_values, _ = agent.q_values(np.zeros([3, 4], np.float32))
    assert q_values.shape == (3, 2)
    assert agent.window_length == load_config().agent.n_step + 1
    greedy = greedy_policy(agent)  # the agent's own NumPy greedy policy: the same Q-values as q_values
    assert isinstance(greedy, NumpyGreedy)
    states = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_allclose(greedy.q_network.snapshot()(states), agent.q_values(states)[0].numpy(), rtol=1e-5)
    assert agent.return_distribution(states) is None  # the expectation only: no atoms to draw


def test_a_checkpoint_restores_into_a_fresh_agent_at_once_and_a_new_learning_rate_stays(tmp_path):
    trained = build(learning_rate=0.01)
    trained.train(windows())
    path = tf.train.Checkpoint(**trained.checkpoint_objects()).write(str(tmp_path / "ckpt"))
    fresh = build(learning_rate=0.01)
    # Every saved value, optimizer slots included, has its variable already: nothing waits for a train step.
    tf.train.Checkpoint(**fresh.checkpoint_objects()).read(path).assert_existing_objects_matched().assert_consumed()
    for a, b in zip(trained.q_network.trainable_variables, fresh.q_network.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    fresh.set_learning_rate(0.5)
    fresh.train(windows())  # a slot restored late would bring the checkpoint's 0.01 back here
    assert float(tf.keras.backend.get_value(fresh.tf_agent._optimizer.learning_rate)) == pytest.approx(0.5)


def test_the_target_updates_copy_as_the_library_does_until_a_run_changes_their_period_and_tau():
    """`TargetUpdates` in the place of TF-Agents' updater: every `target_update_period`-th train step a copy (tau 1),
    and after `set_target_updates` (a run's solve) the new period and a soft update."""
    from dqn_cartpole.core.agents.common import TargetUpdates

    agent = build(target_update_period=3, target_update_tau=1.0)
    updates = agent.tf_agent._update_target  # pylint: disable=protected-access
    assert isinstance(updates, TargetUpdates)
    online, target = agent.tf_agent._q_network.variables, agent.tf_agent._target_q_network.variables

    def differ() -> bool:
        return any(not np.array_equal(o.numpy(), t.numpy()) for o, t in zip(online, target))

    def finite_windows():  # (the spec's random sample holds values near 1e37, which make the loss NaN)
        sample = windows()
        return sample._replace(observation=tf.random.normal(tf.shape(sample.observation), seed=1),
                               reward=tf.ones_like(sample.reward))

    agent.train(finite_windows())
    agent.train(finite_windows())
    assert differ()  # two steps: no copy yet
    agent.train(finite_windows())
    assert not differ()  # the third: the online weights exactly
    agent.set_target_updates(period=1, tau=0.5)
    before = [t.numpy() for t in target]
    agent.train(finite_windows())
    for o, t, old in zip(online, target, before):
        np.testing.assert_allclose(t.numpy(), 0.5 * old + 0.5 * o.numpy(), rtol=1e-6, atol=1e-7)
