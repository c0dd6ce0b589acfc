"""CartPole in TF ops (`core.tf_cartpole`) and the written-out driver (`core.step_driver`): the same episodes, steps
and training as gymnasium through TFPyEnvironment and the library's DynamicStepDriver, bit for bit."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.drivers import dynamic_step_driver
from tf_agents.environments import tf_py_environment
from tf_agents.policies import fixed_policy
from tf_agents.replay_buffers import tf_uniform_replay_buffer
from tf_agents.trajectories import trajectory

from dqn_cartpole.config import apply_override, load_config
from dqn_cartpole.core import build
from dqn_cartpole.core.envs import make_batched_env
from dqn_cartpole.core.step_driver import UnrolledStepDriver
from dqn_cartpole.core.tf_cartpole import TFCartPole, is_plain_cartpole
from dqn_cartpole.core.vector_env import LAST

from helpers import SMOKE, run_cli

FIELDS = ("step_type", "reward", "discount", "observation")


def balancing_actions(observation: np.ndarray, rng: np.random.Generator, flips: float) -> np.ndarray:
    """Pushes toward the pole's fall, with a share `flips` of random pushes: 5% keeps it up to the time limit,
    40% lets it fall."""
    push = (observation[:, 2] + 0.5 * observation[:, 3]) > 0
    return np.where(push ^ (rng.random(len(observation)) < flips), 1, 0).astype(np.int64)


@pytest.mark.parametrize("env_id, copies", [("CartPole-v1", 1), ("CartPole-v1", 2), ("CartPole-v1", 4),
                                            ("CartPole-v0", 1), ("CartPole-v0", 3)])
def test_tf_cartpole_steps_gymnasiums_episodes_bit_for_bit(env_id, copies):
    """Stepped in a compiled loop, from its first step (before any reset) through falls and time limits, it
    returns the time steps gymnasium's env returns (sync copies and gymnasium's vectorised CartPole alike)."""
    steps, limit = 1500, 500 if env_id == "CartPole-v1" else 200
    gymnasium_env = tf_py_environment.TFPyEnvironment(make_batched_env(env_id, copies, seed=7))
    env = TFCartPole(make_batched_env(env_id, copies, seed=7), limit)
    rng, expected, actions = np.random.default_rng(1), [], []
    observation = gymnasium_env.reset().observation.numpy()
    actions.append(np.zeros(copies, np.int64))  # the first step starts the episodes, whatever its action
    expected.append(gymnasium_env.current_time_step())
    for t in range(steps):
        actions.append(balancing_actions(observation, rng, 0.4 if t < 300 else 0.05))
        expected.append(gymnasium_env.step(actions[-1]))
        observation = expected[-1].observation.numpy()

    @tf.function(autograph=False)
    def run(all_actions):
        def body(i, written):
            return i + 1, [w.write(i, t) for w, t in zip(written, env.step(all_actions[i]))]
        written = [tf.TensorArray(spec.dtype, size=steps + 1) for spec in env.time_step_spec()]
        return [w.stack() for w in tf.while_loop(lambda i, _: i <= steps, body, (0, written))[1]]

    got = run(tf.constant(np.stack(actions)))
    for name, values in zip(FIELDS, got):
        want = np.stack([getattr(t, name).numpy() for t in expected])
        np.testing.assert_array_equal(values.numpy(), want, err_msg=name)
    step_type, discount = got[0].numpy(), got[2].numpy()
    assert ((step_type == LAST) & (discount == 0)).any(), "no episode ended by a fall"
    assert ((step_type == LAST) & (discount == 1)).any(), f"no episode reached the time limit of {limit}"


def test_a_resumed_run_reseeds_the_tf_cartpole_as_it_reseeds_gymnasium():
    """The restore's sequence (`Checkpoints.restore`: reset, re-seed the gymnasium env, reset the TF env) gives the
    TF env the start states it gives gymnasium's."""
    envs = [make_batched_env("CartPole-v1", 1, seed=3) for _ in range(2)]
    tf_envs = [tf_py_environment.TFPyEnvironment(envs[0]), TFCartPole(envs[1], 500)]
    for env, tf_env in zip(envs, tf_envs):
        tf_env.reset()
        env.reset()
        env.gym_env.reset(seed=12345)
    first = [tf_env.reset().observation.numpy() for tf_env in tf_envs]
    np.testing.assert_array_equal(first[0], first[1])
    for _ in range(40):  # through the next start states too (a fixed push fails in about 10 steps)
        stepped = [tf_env.step(tf.ones([1], tf.int64)).observation.numpy() for tf_env in tf_envs]
        np.testing.assert_array_equal(stepped[0], stepped[1])


def record_driver(driver_class, copies: int, num_steps: int, runs: int) -> tuple:
    """Every trajectory `driver_class` writes in `runs` runs of `num_steps` steps (a policy that always pushes
    right: an episode every ~10 steps), and its last time step."""
    env = TFCartPole(make_batched_env("CartPole-v1", copies, seed=5), 500)
    policy = fixed_policy.FixedPolicy(np.int64(1), env.time_step_spec(), env.action_spec())
    spec = policy.trajectory_spec
    buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(spec, batch_size=copies, max_length=4 * runs * num_steps)
    driver = driver_class(env, policy, [buffer.add_batch], num_steps=num_steps)

    @tf.function(autograph=False)
    def run(time_step):
        return tf.while_loop(lambda i, _: i < runs, lambda i, t: (i + 1, driver.run(t, ())[0]), (0, time_step))[1]

    last = run(env.reset())
    return buffer.gather_all(), last


@pytest.mark.parametrize("copies, num_steps", [(1, 1), (1, 3), (2, 1), (2, 3), (3, 8)])
def test_the_written_out_driver_takes_the_librarys_steps(copies, num_steps):
    """`UnrolledStepDriver` writes the trajectories `DynamicStepDriver` writes, boundaries (which do not count as
    steps) included, and ends on the same time step."""
    ours, ours_last = record_driver(UnrolledStepDriver, copies, num_steps, runs=60)
    theirs, theirs_last = record_driver(dynamic_step_driver.DynamicStepDriver, copies, num_steps, runs=60)
    assert ours.observation.shape == theirs.observation.shape
    for a, b in zip(tf.nest.flatten(ours) + list(ours_last), tf.nest.flatten(theirs) + list(theirs_last)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert trajectory.Trajectory(*ours).is_boundary().numpy().any(), "no episode boundary was crossed"


def test_the_compiled_driver_steps_cartpole_in_the_graph_and_other_envs_through_gymnasium():
    config = load_config(SMOKE)
    assert build.uses_graph_env(config)
    assert not build.uses_graph_env(apply_override(config, "collection.graph_env=false"))
    assert not build.uses_graph_env(apply_override(config, "collection.driver=py"))
    assert not build.uses_graph_env(apply_override(config, "env.id=Acrobot-v1"))
    assert is_plain_cartpole("CartPole-v0") and not is_plain_cartpole("MountainCar-v0")


def test_training_with_the_tf_cartpole_is_bit_for_bit_trainings_with_gymnasium(tmp_path):
    """The smoke run with `collection.graph_env` true and false: the same losses, Q-values, epsilon, replay counts,
    collect returns and greedy evaluations, row for row."""
    tables = {}
    for graph_env in ("true", "false"):
        out = os.path.join(tmp_path, graph_env)
        result = run_cli("train", "--config", SMOKE, "--output-dir", out, "--quiet", "--set", "video.enabled=false",
                         "--set", f"collection.graph_env={graph_env}", "--set", "output.tensorboard=false")
        assert result.returncode == 0, result.stderr[-2000:]
        tables[graph_env] = {name: list(csv.DictReader(open(os.path.join(out, name), encoding="utf-8")))
                             for name in ("train_metrics.csv", "eval_metrics.csv")}
    for name, rows in tables["true"].items():
        others = tables["false"][name]
        assert len(rows) == len(others) > 1
        for row, other in zip(rows, others):
            timed = {key for key in row if key.endswith("_s") or key.endswith("_per_s")}
            assert {k: v for k, v in row.items() if k not in timed} == \
                {k: v for k, v in other.items() if k not in timed}
