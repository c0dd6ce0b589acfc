"""Noisy networks (`network.noisy`): the noise changes between train steps and between collect steps, epsilon is off
(and the config says so when epsilon keys are set), and the evaluation, the Q-values and the exported policy act
on the mean weights: the same across calls."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib

from helpers import SMOKE

from dqn_cartpole.config import load_config
from dqn_cartpole.core.networks import NoisyDense, mean_weights
from dqn_cartpole.distributed import parts

STATES = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)


def noisy_agent(stack: contextlib.ExitStack, kind: str):
    path, sets = (None, ["agent.kind=c51"]) if kind == "c51" else (SMOKE, [f"agent.kind={kind}"])
    config = load_config(path, sets + ["network.noisy=true"])
    _, _, agent = parts.agent_with_envs(config, 1, 0, stack)
    return agent


def batch_of(agent, size: int = 8):
    rng = np.random.default_rng(1)
    action_dtype = agent.collect_data_spec.action.dtype

    def steps(*shape):
        return tf.constant(rng.normal(size=shape).astype(np.float32))

    mid = tf.fill([size, 2], ts.StepType.MID)
    return trajectory_lib.Trajectory(
        step_type=mid, observation=steps(size, 2, 4), action=tf.cast(rng.integers(0, 2, size=(size, 2)), action_dtype),
        policy_info=(), next_step_type=mid, reward=tf.ones([size, 2]), discount=tf.ones([size, 2]))


def test_a_noisy_layer_draws_fresh_noise_each_call_and_none_on_its_mean_weights():
    layer = NoisyDense(3, sigma0=0.5)
    x = tf.constant(STATES)
    first, second = layer(x).numpy(), layer(x).numpy()
    assert not np.allclose(first, second)
    with mean_weights():
        mean = layer(x).numpy()
    np.testing.assert_allclose(mean, x.numpy() @ layer.kernel_mu.numpy() + layer.bias_mu.numpy(), rtol=1e-5)


@pytest.mark.parametrize("kind", ["dqn", "c51"])
def test_the_noise_changes_between_train_steps_and_the_evaluation_is_the_same_across_calls(kind):
    with contextlib.ExitStack() as stack:
        agent = noisy_agent(stack, kind)
        assert agent.epsilon() == 0.0  # the noisy layers explore
        experience = batch_of(agent)
        loss = agent.tf_agent.train_loss
        # The same weights, the same batch: only the noise differs between the two losses.
        assert float(loss(experience).loss) != float(loss(experience).loss)
        step = ts.restart(tf.constant(STATES), batch_size=len(STATES))
        q_first, q_second = agent.q_values(STATES)[0].numpy(), agent.q_values(STATES)[0].numpy()
        np.testing.assert_array_equal(q_first, q_second)
        np.testing.assert_array_equal(agent.policy.action(step).action.numpy(),
                                      agent.policy.action(step).action.numpy())
        act = tf.function(lambda s: agent.policy.action(s).action, autograph=False)  # compiled, as evaluated
        np.testing.assert_array_equal(act(step).numpy(), act(step).numpy())
        # The collect policy acts on noisy weights: across collect steps, its actions at these states vary.
        collected = np.stack([agent.collect_policy.action(step).action.numpy() for _ in range(20)])
        assert (collected != collected[0]).any()
        agent.train(experience)  # a train step still runs
        np.testing.assert_array_equal(agent.policy.action(step).action.numpy(),
                                      agent.policy.action(step).action.numpy())


def test_epsilon_keys_set_beside_noisy_layers_get_a_one_line_note(capfd):
    load_config(None, ["network.noisy=true", "agent.epsilon_start=0.5"])
    err = capfd.readouterr().err
    assert err.strip().splitlines() == ["note: network.noisy: the noisy layers explore, so the collect policy's "
                                        "epsilon is 0 and agent.epsilon_start is ignored"]
