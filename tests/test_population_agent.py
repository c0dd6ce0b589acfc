"""The population's agent: seed k of a batched population trains exactly as a single run of seed k (weights, Adam
moments, loss) when fed the same batch, with its gradients clipped on their own; a held seed stays put."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib

from dqn_cartpole.config import load_config
from dqn_cartpole.core import ensemble
from dqn_cartpole.core.agents import build_agent
from dqn_cartpole.core.agents import population as population_agents
from dqn_cartpole.core.agents.population import build_population_agent

SEEDS, BATCH, STEPS = 4, 64, 30


def specs():
    observation = tensor_spec.BoundedTensorSpec([4], tf.float32, -5, 5, name="observation")
    action = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1, name="action")
    return ts.time_step_spec(observation), action


def batch(seed: int, reward_scale: float, window: int) -> trajectory_lib.Trajectory:
    """BATCH windows of `window` steps of random CartPole-like data, with rewards times `reward_scale`."""
    rng = np.random.default_rng(seed)
    shape = [BATCH, window]
    step_type = rng.choice([0, 1, 1, 1, 2], size=shape).astype(np.int32)
    next_step_type = np.roll(step_type, -1, axis=1)
    return trajectory_lib.Trajectory(
        step_type=tf.constant(step_type), observation=tf.constant(rng.normal(size=shape + [4]).astype(np.float32)),
        action=tf.constant(rng.integers(0, 2, size=shape)), policy_info=(),
        next_step_type=tf.constant(next_step_type),
        reward=tf.constant((rng.random(shape) * reward_scale).astype(np.float32)),
        discount=tf.constant(np.where(step_type == 2, 0.0, 1.0).astype(np.float32)))


def concat(trajectories):
    return tf.nest.map_structure(lambda *xs: tf.concat(xs, axis=0), *trajectories)


def adam_slots(agent, variables):
    optimizer = agent._optimizer  # pylint: disable=protected-access
    return [optimizer.get_slot(v, name).numpy() for v in variables for name in ("m", "v")]


def train_both(config, seed_index: int, only=None):
    """A population of SEEDS and a single agent holding seed `seed_index`'s initial weights, each trained STEPS
    steps on the same batches (seed 3's rewards 1000x larger: its gradients are clipped hard); `only`: the
    population trains only those seeds (`ensemble.only_seeds`), on their batches alone."""
    time_step_spec, action_spec = specs()
    population = build_population_agent(config.agent, config.network, time_step_spec, action_spec, SEEDS)
    single = build_agent(config.agent, config.network, time_step_spec, action_spec)
    ensemble.assign_seed(single.q_network.variables, population.online_variables(), seed_index)
    target_pop = population.tf_agent._target_q_network.variables  # pylint: disable=protected-access
    ensemble.assign_seed(single.tf_agent._target_q_network.variables, target_pop, seed_index)  # pylint: disable=protected-access
    window = population.window_length
    def pop_train(x):
        if only is None:
            return population.train(x).loss
        with ensemble.only_seeds(tf.constant(only, tf.int32)):
            return population.train(x).loss

    pop_step = tf.function(pop_train, autograph=False)
    single_step = tf.function(lambda x: single.train(x).loss, autograph=False)
    pop_losses, single_losses = [], []
    for step in range(STEPS):
        per_seed = [batch(1000 * step + k, 1000.0 if k == 3 else 1.0, window) for k in range(SEEDS)]
        pop_losses.append(pop_step(concat([per_seed[k] for k in (only or range(SEEDS))])).numpy())
        single_losses.append(single_step(per_seed[seed_index]).numpy())
    return population, single, np.array(pop_losses), np.array(single_losses)


@pytest.fixture(scope="module")
def config():
    return load_config(None)


@pytest.mark.parametrize("seed_index, only", [(0, None), (2, None), (2, [0, 2, 3])])
def test_seed_k_of_a_population_trains_as_its_single_run(config, seed_index, only):
    """Also when the train step computes only some seeds (a held seed's share of the batch dropped)."""
    population, single, pop_losses, single_losses = train_both(config, seed_index, only)
    np.testing.assert_allclose(pop_losses[:, seed_index], single_losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(ensemble.seed_values(population.online_variables(), seed_index),
                         [v.numpy() for v in single.q_network.variables]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    pop_slots = adam_slots(population.tf_agent, population.online_variables())
    for got, want in zip([s[seed_index] for s in pop_slots], adam_slots(single.tf_agent, single.q_network.variables)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-9)
    assert population.seed_train_steps() == [STEPS] * SEEDS
    if only is not None:
        assert (pop_losses[:, 1] == 0).all()  # seed 1 was not in the batch


def test_one_norm_across_seeds_couples_them(config, monkeypatch):
    """With one global norm across the seeds (seed 3's huge gradients shrinking everyone's step), seed 0 no longer
    trains as its single run: the per-seed clipping is what the first test holds."""
    def global_clip(grads, clip_norm):
        return tf.clip_by_global_norm(grads, clip_norm)[0]

    monkeypatch.setattr(population_agents, "clip_per_seed", global_clip)
    population, single, _, _ = train_both(config, 0)
    got = ensemble.seed_values(population.online_variables(), 0)[0]
    assert not np.allclose(got, single.q_network.variables[0].numpy(), rtol=1e-5, atol=1e-6)


def test_a_held_seed_keeps_its_weights_and_its_step_count(config):
    time_step_spec, action_spec = specs()
    population = build_population_agent(config.agent, config.network, time_step_spec, action_spec, SEEDS)
    population.hold_seed(1)
    held = ensemble.seed_values(population.online_variables(), 1)
    moving = ensemble.seed_values(population.online_variables(), 2)
    step = tf.function(lambda x: population.train(x).loss, autograph=False)
    for i in range(3):
        step(concat([batch(10 * i + k, 1.0, population.window_length) for k in range(SEEDS)]))
    for before, after in zip(held, ensemble.seed_values(population.online_variables(), 1)):
        np.testing.assert_array_equal(before, after)
    assert not np.allclose(moving[0], ensemble.seed_values(population.online_variables(), 2)[0])
    assert population.seed_train_steps() == [3, 0, 3, 3]


def test_every_seed_starts_from_its_own_weights(config):
    time_step_spec, action_spec = specs()
    population = build_population_agent(config.agent, config.network, time_step_spec, action_spec, SEEDS)
    kernels = population.online_variables()[0].numpy()
    assert all(not np.allclose(kernels[0], kernels[k]) for k in range(1, SEEDS))
    # each seed's scale is a single network's (fan-in of [in, out], not of [K, in, out])
    single = build_agent(config.agent, config.network, time_step_spec, action_spec)
    assert np.std(kernels) == pytest.approx(np.std(single.q_network.variables[0].numpy()), rel=0.35)
