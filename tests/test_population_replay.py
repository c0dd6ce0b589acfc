"""The population's replay, both backends: each seed's windows come from its own stream only (never another seed's),
for every seed or a subset, and a checkpoint holds every seed's buffer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib

from dqn_cartpole.config import load_config
from dqn_cartpole.replay.population import make_population_replay

SEEDS, BATCH, STEPS = 3, 16, 4


def data_spec():
    return trajectory_lib.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([2], tf.float32),
        action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))


def step(t: int) -> trajectory_lib.Trajectory:
    """One batched step of SEEDS envs: seed k's observation is (k, t)."""
    k = np.arange(SEEDS, dtype=np.float32)
    return trajectory_lib.Trajectory(
        step_type=tf.ones([SEEDS], tf.int32), observation=tf.constant(np.stack([k, np.full(SEEDS, t, np.float32)], 1)),
        action=tf.zeros([SEEDS], tf.int64), policy_info=(), next_step_type=tf.ones([SEEDS], tf.int32),
        reward=tf.ones([SEEDS]), discount=tf.ones([SEEDS]))


@pytest.fixture(params=["tf_uniform", "py_uniform"])
def replay(request):
    config = dataclasses.replace(load_config(None).replay, backend=request.param, capacity=50)
    replay = make_population_replay(data_spec(), SEEDS, config)
    add = tf.function(lambda items: replay.add_batch(items) and None, autograph=False)
    for t in range(80):  # past the capacity: the oldest steps are gone
        add(step(t))
    yield replay
    replay.close()


@pytest.mark.parametrize("seeds", [[0, 1, 2], [0, 2], [1]])
def test_each_seed_samples_its_own_stream_only(replay, seeds):
    windows = tf.function(replay.seeds_sampler(BATCH, STEPS), autograph=False)(tf.constant(seeds, tf.int32))
    observation = windows.observation.numpy()  # [len(seeds) * BATCH, STEPS, 2], seed-major
    assert observation.shape == (len(seeds) * BATCH, STEPS, 2)
    owners = observation[:, :, 0].reshape(len(seeds), BATCH * STEPS)
    for row, seed in zip(owners, seeds):
        assert (row == seed).all()
    times = observation[:, :, 1]
    assert (np.diff(times, axis=1) == 1).all() and times.min() >= 30  # consecutive steps, the newest 50 only
    assert replay.seed_size() == 50 and replay.seed_inserts() == 80


def test_a_checkpoint_holds_every_seed_buffer(replay, tmp_path):
    checkpoint = tf.train.Checkpoint(replay=replay.buffer)
    path = checkpoint.write(str(tmp_path / "ckpt"))
    config = dataclasses.replace(load_config(None).replay, backend=replay.backend, capacity=50)
    fresh = make_population_replay(data_spec(), SEEDS, config)
    tf.train.Checkpoint(replay=fresh.buffer).read(path).assert_consumed()
    assert fresh.seed_size() == 50 and fresh.seed_inserts() == 80
    windows = fresh.seeds_sampler(BATCH, STEPS)(tf.constant([2], tf.int32))
    assert (windows.observation.numpy()[:, :, 0] == 2).all()
    fresh.close()
