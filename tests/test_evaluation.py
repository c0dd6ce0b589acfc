"""Greedy evaluation, in one compiled loop or in NumPy (the agent's own greedy policy): a solve check that can no
longer pass stops early; videos get actions; both loops play the same episodes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.networks import sequential
from tf_agents.policies import fixed_policy
from tf_agents.specs import tensor_spec

from dqn_cartpole.config import load_config
from dqn_cartpole.core import build
from dqn_cartpole.core.envs import make_batched_env
from dqn_cartpole.core.evaluation import make_episode_runner
from dqn_cartpole.core.policies import NumpyGreedy, greedy_policy


def fixed_greedy(action: int, action_spec) -> NumpyGreedy:
    """A NumPy greedy policy that always picks `action`: one linear layer whose bias favours it."""
    network = sequential.Sequential([tf.keras.layers.Dense(2, kernel_initializer="zeros",
                                                           bias_initializer=tf.keras.initializers.Constant(
                                                               [1.0 - action, float(action)]))])
    network.create_variables(tf.TensorSpec([4], tf.float32))
    return NumpyGreedy.of(network, action_spec)


def run(policy_action: int, copies: int, loop: str = "compiled", **kwargs):
    env = make_batched_env("CartPole-v1", copies, seed=11, seed_per_copy=True)
    try:
        action_spec = tensor_spec.from_spec(env.action_spec())
        if loop == "numpy":
            policy = fixed_greedy(policy_action, action_spec)
        else:
            policy = fixed_policy.FixedPolicy(np.int64(policy_action), tensor_spec.from_spec(env.time_step_spec()),
                                              action_spec)
        return make_episode_runner(policy, env, **kwargs)()
    finally:
        env.close()


@pytest.mark.parametrize("loop", ["compiled", "numpy"])
def test_a_check_that_cannot_reach_its_target_stops_early_and_fails(loop):
    full = run(0, 20, loop)  # pushing left always: every episode fails within ~10 steps
    early = run(0, 20, loop, give_up_below=400.0, max_return=500.0)
    # 20 episodes average >= 400 only if they lose < 2,000 of the 10,000 possible: 5 failed ones already do
    assert early.lengths.sum() < full.lengths.sum()
    assert (early.lengths <= full.lengths).all() and early.average_return < 400
    reachable = run(0, 20, loop, give_up_below=5.0, max_return=500.0)  # a target it meets: nothing is cut
    np.testing.assert_array_equal(reachable.lengths, full.lengths)


@pytest.mark.parametrize("loop", ["compiled", "numpy"])
def test_kept_actions_are_each_episodes_own(loop):
    result = run(1, 3, loop, keep_actions=True)
    assert result.actions.shape[0] == 3 and result.terminated.all()  # pushing right fails too
    for i in range(3):
        assert (result.actions[i, :result.lengths[i]] == 1).all()


def balancing_agent(seed: int):
    """A DQN agent for CartPole whose Q-network pushes towards the side the pole falls to (Q(right) - Q(left) grows
    with angle + angular velocity), plus noise: episodes of hundreds of steps, where an untrained network's last
    about ten, and both actions taken."""
    config = load_config(None, ["network.fc_layer_params=[2, 2]"])
    agent = build.make_agent(config, tf_py_environment.TFPyEnvironment(make_batched_env("CartPole-v1", 1, seed=0)))
    rng = np.random.default_rng(seed)
    lean = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, -1.0], [1.0, -1.0]])
    designed = [lean, np.zeros(2), np.eye(2), np.zeros(2), np.array([[0.0, 1.0], [1.0, 0.0]]), np.zeros(2)]
    for variable, weights in zip(agent.q_network.trainable_variables, designed):
        variable.assign((weights + rng.normal(0.0, 0.05, variable.shape)).astype(np.float32))
    return agent


def test_the_numpy_greedy_policy_picks_the_tf_greedy_policys_actions():
    from tf_agents.trajectories import time_step as ts

    agent = balancing_agent(3)
    greedy = greedy_policy(agent)
    assert isinstance(greedy, NumpyGreedy)
    observations = np.random.default_rng(0).normal(0.0, 1.0, (5000, 4)).astype(np.float32)
    expected = agent.policy.action(ts.restart(tf.constant(observations), batch_size=5000)).action.numpy()
    actions = greedy.snapshot()(observations)
    assert 0.2 < expected.mean() < 0.8  # both actions occur
    np.testing.assert_array_equal(actions, expected)
    snapshot = greedy.snapshot()
    last = agent.q_network.layers[-1]  # swapping the two actions' output units swaps every choice
    last.kernel.assign(last.kernel[:, ::-1])
    last.bias.assign(last.bias[::-1])
    np.testing.assert_array_equal(snapshot(observations), expected)  # a snapshot keeps the weights it read
    np.testing.assert_array_equal(greedy.snapshot()(observations), 1 - expected)


def test_both_loops_play_the_same_episodes_of_the_agents_greedy_policy():
    agent = balancing_agent(5)

    def play(policy):
        env = make_batched_env("CartPole-v1", 6, seed=21, seed_per_copy=True)
        try:
            return make_episode_runner(policy, env, gamma=0.9, keep_actions=True)()
        finally:
            env.close()

    compiled, numpy = play(agent.policy), play(greedy_policy(agent))
    assert compiled.lengths.min() > 50  # long enough to be a real comparison
    np.testing.assert_array_equal(numpy.lengths, compiled.lengths)
    np.testing.assert_array_equal(numpy.returns, compiled.returns)
    np.testing.assert_allclose(numpy.discounted_returns, compiled.discounted_returns, rtol=1e-5)
    np.testing.assert_array_equal(numpy.first_observations, compiled.first_observations)
    np.testing.assert_array_equal(numpy.terminated, compiled.terminated)
    for i in range(6):
        np.testing.assert_array_equal(numpy.actions[i, :numpy.lengths[i]], compiled.actions[i, :compiled.lengths[i]])


def test_a_network_numpy_cannot_reproduce_is_evaluated_with_the_tf_policy():
    spec = tensor_spec.BoundedTensorSpec((), tf.int64, 0, 1)
    network = sequential.Sequential([tf.keras.layers.Dense(8, activation="tanh"), tf.keras.layers.Dense(2)])
    network.create_variables(tf.TensorSpec([4], tf.float32))
    assert NumpyGreedy.of(network, spec) is None
    normalized = sequential.Sequential([tf.keras.layers.LayerNormalization(), tf.keras.layers.Dense(2)])
    normalized.create_variables(tf.TensorSpec([4], tf.float32))
    assert NumpyGreedy.of(normalized, spec) is None
    assert NumpyGreedy.of(sequential.Sequential([tf.keras.layers.Dense(2)]), spec) is None  # no input spec yet
