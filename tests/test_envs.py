"""Tests for the gymnasium -> TF-Agents environment adapters."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import gymnasium
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode
from tf_agents.environments import utils as env_utils
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.core import envs

FIRST, MID, LAST = int(ts.StepType.FIRST), int(ts.StepType.MID), int(ts.StepType.LAST)


def _alternating(t: int) -> int:
    """Action 0,1,0,1,...: keeps CartPole up for well over 20 steps."""
    return t % 2


@pytest.fixture
def make_env() -> Iterator[Callable[..., envs.GymnasiumEnvironment]]:
    """envs.make_env that closes everything it created."""
    created: list[envs.GymnasiumEnvironment] = []

    def factory(*args, **kwargs) -> envs.GymnasiumEnvironment:
        created.append(envs.make_env(*args, **kwargs))
        return created[-1]

    yield factory
    for env in created:
        env.close()


@pytest.fixture
def make_batched() -> Iterator[Callable[..., envs.BatchedGymnasiumEnvironment]]:
    """envs.make_batched_env that closes everything it created."""
    created: list[envs.BatchedGymnasiumEnvironment] = []

    def factory(*args, **kwargs) -> envs.BatchedGymnasiumEnvironment:
        created.append(envs.make_batched_env(*args, **kwargs))
        return created[-1]

    yield factory
    for env in created:
        env.close()


# ----------------------------------------------------------------- single env


def test_specs(make_env) -> None:
    env = make_env("CartPole-v1")
    obs_spec, act_spec = env.observation_spec(), env.action_spec()
    assert (obs_spec.shape, obs_spec.dtype) == ((4,), np.float32)
    assert (act_spec.shape, act_spec.dtype) == ((), np.int64)
    assert (obs_spec.name, act_spec.name) == ("observation", "action")
    assert (act_spec.minimum, act_spec.maximum) == (0, 1)
    assert not env.batched and env.batch_size is None
    assert isinstance(env.gym_env, gymnasium.Env)


def test_terminated_is_last_with_discount_zero_then_first(make_env) -> None:
    env = make_env("CartPole-v1", seed=0)
    time_step = env.reset()
    assert int(time_step.step_type) == FIRST
    for _ in range(100):  # A constant push topples the pole in ~10 steps.
        time_step = env.step(np.int64(1))
        if time_step.is_last():
            break
    assert int(time_step.step_type) == LAST
    assert float(time_step.discount) == 0.0
    assert float(time_step.reward) == 1.0
    assert time_step.reward.dtype == np.float32
    after = env.step(np.int64(1))
    assert int(after.step_type) == FIRST
    assert (float(after.reward), float(after.discount)) == (0.0, 1.0)


def test_truncated_is_last_with_discount_one_then_first(make_env) -> None:
    env = make_env("CartPole-v1", seed=0, max_episode_steps=5)
    env.reset()
    step_types = [int(env.step(np.int64(_alternating(t))).step_type) for t in range(4)]
    assert step_types == [MID] * 4
    time_step = env.step(np.int64(0))
    assert int(time_step.step_type) == LAST
    assert float(time_step.discount) == 1.0
    assert int(env.step(np.int64(0)).step_type) == FIRST
    assert int(env.step(np.int64(0)).step_type) == MID


def test_validate_py_environment(make_env) -> None:
    env_utils.validate_py_environment(make_env("CartPole-v1", seed=0), episodes=3)


def _rollout(env: envs.GymnasiumEnvironment, actions: list[int]) -> np.ndarray:
    """Observations from reset() then step(a) for each a (across resets)."""
    observations = [env.reset().observation]
    observations += [env.step(np.int64(a)).observation for a in actions]
    return np.stack(observations)


def test_seeded_reproducibility(make_env) -> None:
    # 60 constant-ish actions span several episodes, so later (unseeded)
    # resets are covered too.
    actions = [1] * 30 + [0] * 30
    first = _rollout(make_env("CartPole-v1", seed=7), actions)
    again = _rollout(make_env("CartPole-v1", seed=7), actions)
    other = _rollout(make_env("CartPole-v1", seed=8), actions)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)


def test_later_resets_continue_rng(make_env) -> None:
    env = make_env("CartPole-v1", seed=3)
    starts = [env.reset().observation for _ in range(3)]
    assert not np.allclose(starts[0], starts[1])
    assert not np.allclose(starts[1], starts[2])


def test_render_rgb_array(make_env) -> None:
    env = make_env("CartPole-v1", seed=0, render_mode="rgb_array")
    env.reset()
    frame = env.render()
    assert frame.dtype == np.uint8
    assert frame.ndim == 3 and frame.shape[2] == 3
    assert frame.shape[0] > 0 and frame.shape[1] > 0


def test_render_without_rgb_mode_raises(make_env) -> None:
    env = make_env("CartPole-v1")
    env.reset()
    with pytest.raises(ValueError, match="render_mode"):
        env.render()


# ---------------------------------------------------------------- batched env


def test_batched_specs_and_reset(make_batched) -> None:
    env = make_batched("CartPole-v1", num_envs=3, seed=0)
    assert env.batched and env.batch_size == 3
    assert env.observation_spec().shape == (4,)
    assert env.action_spec().shape == ()
    time_step = env.reset()
    assert time_step.observation.shape == (3, 4)
    assert time_step.observation.dtype == np.float32
    np.testing.assert_array_equal(time_step.step_type, [FIRST] * 3)
    time_step = env.step(np.zeros(3, dtype=np.int64))
    np.testing.assert_array_equal(time_step.step_type, [MID] * 3)
    assert time_step.reward.shape == (3,) and time_step.reward.dtype == np.float32
    assert time_step.discount.shape == (3,) and time_step.discount.dtype == np.float32


def test_batched_validate_py_environment(make_batched) -> None:
    env = make_batched("CartPole-v1", 4, seed=0)
    env_utils.validate_py_environment(env, episodes=3)


def test_batched_terminated_vs_truncated_per_element(make_batched) -> None:
    # Element 0 pushes constantly (terminates ~step 10, then again ~step 20);
    # element 1 alternates and survives until the 20-step time limit.
    env = make_batched("CartPole-v1", num_envs=2, seed=0, max_episode_steps=20)
    previous = env.reset()
    seen_terminated = seen_truncated = False
    for t in range(30):
        time_step = env.step(np.array([1, _alternating(t)]))
        for i in range(2):
            if previous.step_type[i] == LAST:
                # Gymnasium reset this element and ignored its action.
                assert time_step.step_type[i] == FIRST
                assert (time_step.reward[i], time_step.discount[i]) == (0.0, 1.0)
            elif time_step.step_type[i] == LAST:
                assert time_step.reward[i] == 1.0
                if i == 0:
                    assert time_step.discount[i] == 0.0
                    seen_terminated = True
                else:
                    assert time_step.discount[i] == 1.0
                    seen_truncated = True
            else:
                assert time_step.step_type[i] == MID
                assert time_step.discount[i] == 1.0
        previous = time_step
    assert seen_terminated and seen_truncated


def test_batched_all_last_is_not_reset_by_base_class(make_batched, monkeypatch) -> None:
    env = make_batched("CartPole-v1", num_envs=3, seed=0, max_episode_steps=5)
    env.reset()
    resets = []
    original_reset = env.gym_env.reset
    monkeypatch.setattr(
        env.gym_env, "reset", lambda **kw: resets.append(kw) or original_reset(**kw)
    )
    step_types = []
    for t in range(7):
        time_step = env.step(np.full(3, _alternating(t)))
        step_types.append(time_step.step_type.tolist())
        if time_step.is_last().all():
            np.testing.assert_array_equal(time_step.discount, [1.0] * 3)
    assert step_types == [[MID] * 3] * 4 + [[LAST] * 3, [FIRST] * 3, [MID] * 3]
    assert resets == []  # Gymnasium's NEXT_STEP autoreset did it, not reset().


def _batched_rollout(
    env: envs.BatchedGymnasiumEnvironment, actions: np.ndarray
) -> np.ndarray:
    """Observations [T+1, N, 4] from reset() then step(actions[t])."""
    observations = [env.reset().observation]
    observations += [env.step(a).observation for a in actions]
    return np.stack(observations)


def test_batched_seeded_reproducibility(make_batched) -> None:
    actions = np.ones((40, 4), dtype=np.int64)  # Crosses episode boundaries.
    first = _batched_rollout(make_batched("CartPole-v1", 4, seed=5), actions)
    again = _batched_rollout(make_batched("CartPole-v1", 4, seed=5), actions)
    other = _batched_rollout(make_batched("CartPole-v1", 4, seed=6), actions)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)


def test_vectorised_cartpole_n1_matches_single_env(make_env, make_batched) -> None:
    # CartPoleVectorEnv draws all sub-env states from ONE RNG (a (4, N)
    # uniform draw), so element i is NOT the single env seeded with seed+i;
    # only N=1 lines up with the single env (same RNG draws, same dynamics).
    actions = [1] * 15 + [_alternating(t) for t in range(15)]
    single = _rollout(make_env("CartPole-v1", seed=11), actions)
    batched = _batched_rollout(
        make_batched("CartPole-v1", 1, seed=11), np.array(actions)[:, None]
    )
    np.testing.assert_allclose(batched[:, 0], single, rtol=1e-5, atol=1e-6)


def test_sync_vector_env_element_i_matches_single_env_seed_plus_i(make_env) -> None:
    # SyncVectorEnv seeds sub-env i with seed+i, so elements line up exactly.
    vector_env = gymnasium.make_vec(
        "CartPole-v1", num_envs=3, vectorization_mode="sync", disable_env_checker=True
    )
    batched = envs.BatchedGymnasiumEnvironment(vector_env, seed=20)
    try:
        actions = [1] * 15 + [_alternating(t) for t in range(15)]
        batch_actions = np.tile(np.array(actions)[:, None], (1, 3))
        observations = _batched_rollout(batched, batch_actions)
        for i in range(3):
            single = _rollout(make_env("CartPole-v1", seed=20 + i), actions)
            np.testing.assert_allclose(observations[:, i], single, rtol=1e-5, atol=1e-6)
    finally:
        batched.close()


def test_batched_uses_vector_entry_point_with_right_time_limit(make_batched) -> None:
    for env_id, steps in [("CartPole-v0", 200), ("CartPole-v1", 500)]:
        env = make_batched(env_id, num_envs=4)
        assert isinstance(env.gym_env, CartPoleVectorEnv)
        assert env.gym_env.max_episode_steps == steps
    env = make_batched("CartPole-v1", 4, max_episode_steps=7)
    assert env.gym_env.max_episode_steps == 7


def test_one_env_uses_a_plain_sync_vector_env_with_the_time_limit(make_batched) -> None:
    # One copy steps faster without numpy vectorisation; the time limit must still hold.
    env = make_batched("CartPole-v0", num_envs=1, seed=0)
    assert isinstance(env.gym_env, gymnasium.vector.SyncVectorEnv)
    env.reset()
    lengths, length = [], 0
    for t in range(2000):
        step = env.step(np.array([_alternating(t)], dtype=np.int64))
        length += 1
        if step.is_last()[0]:
            lengths.append(length)
            length = -1  # the next step is the FIRST of a new episode
    assert lengths and max(lengths) <= 200


def test_batched_sync_fallback_honours_time_limit(make_batched) -> None:
    # MountainCar has no vector_entry_point, so this goes through SyncVectorEnv.
    env = make_batched("MountainCar-v0", num_envs=2, seed=0, max_episode_steps=4)
    assert isinstance(env.gym_env, gymnasium.vector.SyncVectorEnv)
    env.reset()
    actions = np.ones(2, dtype=np.int64)
    step_types = [env.step(actions).step_type.tolist() for _ in range(5)]
    assert step_types == [[MID] * 2] * 3 + [[LAST] * 2, [FIRST] * 2]
    assert env.current_time_step().discount.tolist() == [1.0, 1.0]


def test_batched_rejects_non_next_step_autoreset() -> None:
    vector_env = gymnasium.make_vec(
        "CartPole-v1",
        num_envs=2,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        disable_env_checker=True,
    )
    try:
        with pytest.raises(envs.EnvSpecError, match="autoreset"):
            envs.BatchedGymnasiumEnvironment(vector_env)
    finally:
        vector_env.close()


# ------------------------------------------------------- ids, warnings, misc


def test_check_env_id_accepts_cartpole() -> None:
    envs.check_env_id("CartPole-v1")
    envs.check_env_id("CartPole-v0")


def test_check_env_id_unknown_suggests() -> None:
    suggestion = r"did you mean 'CartPole-v1'\?"
    with pytest.raises(envs.EnvSpecError, match=suggestion) as info:
        envs.check_env_id("CartPole-v9")
    assert "unknown gymnasium env id 'CartPole-v9'" in str(info.value)
    assert "\n" not in str(info.value)


def test_check_env_id_rejects_continuous_actions() -> None:
    with pytest.raises(envs.EnvSpecError, match="Pendulum-v1.*action space") as info:
        envs.check_env_id("Pendulum-v1")
    assert "\n" not in str(info.value)


def test_make_env_checks_id() -> None:
    with pytest.raises(envs.EnvSpecError):
        envs.make_env("NoSuchEnv-v0")
    with pytest.raises(envs.EnvSpecError):
        envs.make_batched_env("Pendulum-v1", num_envs=2)


def test_no_gymnasium_warnings(make_env, make_batched) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs.check_env_id("CartPole-v0")  # v0 is "out of date" for gymnasium.
        single, batched = make_env("CartPole-v0", 0), make_batched("CartPole-v0", 2, 0)
        for env in (single, batched):
            env.reset()
            for _ in range(30):  # Crosses an episode end (auto reset path).
                env.step(np.ones(env.batch_size or (), dtype=np.int64))
    messages = [str(w.message) for w in caught if "gymnasium" in w.filename]
    assert messages == []


def test_max_return() -> None:
    assert envs.max_return("CartPole-v1") == 500.0
    assert envs.max_return("CartPole-v0") == 200.0
    assert envs.max_return("Pendulum-v1") is None
    assert envs.max_return("NoSuchEnv-v0") is None
