"""The Q-value probe and the discounted returns it is compared with, against values worked out by hand."""

import numpy as np
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.policies import random_tf_policy

from dqn_cartpole.core.envs import make_batched_env
from dqn_cartpole.core.evaluation import make_episode_runner
from dqn_cartpole.core.networks import build_q_network
from dqn_cartpole.core.q_probe import QProbe, random_policy_states


def test_random_policy_states_are_seeded_and_span_episodes():
    states = random_policy_states("CartPole-v1", 200, seed=7)
    assert states.shape == (200, 4) and states.dtype == np.float32
    np.testing.assert_array_equal(states, random_policy_states("CartPole-v1", 200, seed=7))
    assert not np.array_equal(states, random_policy_states("CartPole-v1", 200, seed=8))
    # A random policy fails CartPole in ~20 steps, so 200 states cover several resets (near-zero states).
    assert (np.abs(states).max(axis=1) < 0.05).sum() >= 3


def test_probe_is_the_mean_of_the_max_q_value():
    network = build_q_network((8,), num_actions=2)
    states = random_policy_states("CartPole-v1", 50, seed=0)
    network.create_variables(tf.TensorSpec([4], tf.float32))
    hidden_kernel, hidden_bias, out_kernel, out_bias = network.trainable_variables
    out_kernel.assign(tf.zeros_like(out_kernel))
    out_bias.assign([1.5, -2.0])  # Q(s, .) = (1.5, -2.0) for every state
    assert QProbe(network, states)() == 1.5
    out_kernel.assign(tf.ones_like(out_kernel))  # now Q depends on the state: check against numpy
    q_values = network(tf.constant(states))[0].numpy()
    np.testing.assert_allclose(QProbe(network, states)(), q_values.max(axis=1).mean(), rtol=1e-6)


def test_eval_discounted_return_is_the_geometric_sum_of_cartpole_rewards():
    env = make_batched_env("CartPole-v1", 4, seed=3)
    try:
        tf_env = tf_py_environment.TFPyEnvironment(env)
        policy = random_tf_policy.RandomTFPolicy(tf_env.time_step_spec(), tf_env.action_spec())
        result = make_episode_runner(policy, env, gamma=0.9)()
    finally:
        env.close()
    gamma, lengths = 0.9, result.lengths.astype(np.float64)
    np.testing.assert_allclose(result.discounted_returns, (1 - gamma ** lengths) / (1 - gamma), rtol=1e-5)
    columns = result.spread_columns()
    assert columns["min_return"] == result.returns.min() and columns["max_return"] == result.returns.max()
    assert columns["std_return"] == np.std(result.returns)


def test_the_evaluation_reports_its_first_states_and_max_q_there_is_their_estimate():
    from dqn_cartpole.core.q_probe import MaxQ

    env = make_batched_env("CartPole-v1", 5, seed=11)
    try:
        tf_env = tf_py_environment.TFPyEnvironment(env)
        policy = random_tf_policy.RandomTFPolicy(tf_env.time_step_spec(), tf_env.action_spec())
        run = make_episode_runner(policy, env, gamma=0.99)
        result = run()
    finally:
        env.close()
    reference = make_batched_env("CartPole-v1", 5, seed=11)  # the same seed resets to the same first states
    try:
        np.testing.assert_allclose(result.first_observations, reference.reset().observation, rtol=1e-6)
    finally:
        reference.close()
    network = build_q_network((8,), num_actions=2)
    network.create_variables(tf.TensorSpec([4], tf.float32))
    q_values = network(tf.constant(result.first_observations))[0].numpy()
    np.testing.assert_allclose(MaxQ(network)(result.first_observations), q_values.max(axis=1).mean(), rtol=1e-6)


def test_max_q_of_a_network_numpy_cannot_reproduce_is_computed_by_tensorflow():
    from tf_agents.networks import sequential

    from dqn_cartpole.core.q_probe import MaxQ

    states = random_policy_states("CartPole-v1", 20, seed=1)
    for network in (build_q_network((8,), num_actions=2),  # NumPy
                    sequential.Sequential([tf.keras.layers.Dense(8, activation="tanh"), tf.keras.layers.Dense(2)])):
        network.create_variables(tf.TensorSpec([4], tf.float32))
        expected = network(tf.constant(states))[0].numpy().max(axis=1).mean()
        np.testing.assert_allclose(MaxQ(network)(states), expected, rtol=1e-6)
