"""Copies of a gymnasium env stepped together, as batched time steps, without TensorFlow.

`VectorSteps` is what a batched step means in this project: gymnasium's vector env in its NEXT_STEP
autoreset mode, observations cast to float32, a copy that gymnasium just reset (ignoring the action)
comes back FIRST with reward 0, a real termination cuts the bootstrap (discount 0) and a time limit
does not (discount 1). The TF-Agents adapter (`core.envs.BatchedGymnasiumEnvironment`) steps through
it, and so does the evaluator process (`core.snapshot_evaluation`), which never imports TensorFlow:
both see the same episodes from the same seed.
"""

from __future__ import annotations

import os

os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # before gymnasium's renderers import pygame
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

from typing import Any, NamedTuple, Optional  # noqa: E402

import gymnasium  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium.vector import AutoresetMode, VectorEnv  # noqa: E402

from dqn_cartpole.env_ids import EnvSpecError, check_env_id, check_spaces, registered_spec  # noqa: E402

# TF-Agents' StepType values (tf_agents.trajectories.time_step.StepType), which a test checks.
FIRST, MID, LAST = 0, 1, 2
# Numpy-vectorised envs pay ~40 us of array overhead per step, which only pays off for
# several copies; one or two plain envs step ~4x faster in a SyncVectorEnv.
SYNC_UP_TO = 2


class VectorStep(NamedTuple):
    """A batched time step, field for field TF-Agents' `TimeStep` (so either converts to the other)."""

    step_type: np.ndarray  # int32
    reward: np.ndarray  # float32
    discount: np.ndarray  # float32
    observation: np.ndarray


def make_vector_env(env_id: str, num_envs: int, max_episode_steps: Optional[int] = None,
                    seed_per_copy: bool = False) -> VectorEnv:
    """`num_envs` copies of `env_id` as one gymnasium vector env: the env's numpy-vectorised
    `vector_entry_point` when it has one and there are more than SYNC_UP_TO copies (CartPole: much
    faster), else a `SyncVectorEnv`. `seed_per_copy` always makes a `SyncVectorEnv`, whose copy i is
    seeded with seed + i: each copy's first episode can then be replayed alone in one env reset with
    that seed (a vectorised env shares one RNG). Raises EnvSpecError (unknown id) or ValueError."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    check_env_id(env_id)
    spec = registered_spec(env_id)
    kwargs: dict[str, Any] = {}
    if spec.vector_entry_point is not None and num_envs > SYNC_UP_TO and not seed_per_copy:
        mode = "vector_entry_point"
        # Vector entry points implement the time limit themselves; pass it
        # explicitly so it never silently falls back to the class default.
        steps = max_episode_steps if max_episode_steps is not None else spec.max_episode_steps
        if steps is not None:
            kwargs["max_episode_steps"] = steps
    else:
        mode = "sync"
        # These kwargs go to gymnasium.make for each sub-env (TimeLimit there).
        kwargs["disable_env_checker"] = True
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
    return gymnasium.make_vec(spec, num_envs=num_envs, vectorization_mode=mode, **kwargs)


def observation_dtype(box: gymnasium.spaces.Box) -> np.dtype:
    """Float boxes become float32 (what TF networks use); others keep their dtype."""
    return np.dtype(np.float32) if np.issubdtype(box.dtype, np.floating) else box.dtype


class VectorSteps:
    """A gymnasium vector env's reset and step as `VectorStep`s; see the module docstring."""

    def __init__(self, vector_env: VectorEnv, seed: Optional[int] = None):
        """`seed` seeds the first reset only (how it maps to copies is up to the vector env: a
        `SyncVectorEnv` seeds copy i with seed + i, `CartPoleVectorEnv` draws from one RNG), so later
        episodes continue the env's RNG. Raises EnvSpecError for unsupported spaces or autoreset mode."""
        name = check_spaces(vector_env, vector_env.single_observation_space, vector_env.single_action_space)
        mode = AutoresetMode(vector_env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        if mode != AutoresetMode.NEXT_STEP:
            raise EnvSpecError(f"vector env {name!r} has autoreset mode {mode.value!r}; "
                               f"only {AutoresetMode.NEXT_STEP.value!r} is supported")
        self.env = vector_env
        self.batch_size = int(vector_env.num_envs)
        self.seed = seed
        self.seeded = False
        self.dtype = observation_dtype(vector_env.single_observation_space)
        self.resetting = np.zeros(self.batch_size, dtype=bool)  # copies gymnasium resets on the next step

    def reset(self) -> VectorStep:
        """Resets every copy (seeding only the first time)."""
        if self.seeded:
            observation, _ = self.env.reset()
        else:
            observation, _ = self.env.reset(seed=self.seed)
            self.seeded = True
        self.resetting[:] = False
        n = self.batch_size
        return VectorStep(np.full(n, FIRST, np.int32), np.zeros(n, np.float32), np.ones(n, np.float32),
                          np.asarray(observation, dtype=self.dtype))

    def step(self, action: Any) -> VectorStep:
        """Steps every copy; those gymnasium just reset come back FIRST."""
        actions = np.asarray(action, dtype=np.int64).reshape(self.batch_size)
        observation, reward, terminated, truncated, _ = self.env.step(actions)
        first = self.resetting
        terminated = np.asarray(terminated, dtype=bool) & ~first
        last = (terminated | np.asarray(truncated, dtype=bool)) & ~first
        self.resetting = last
        step_type = np.where(first, FIRST, np.where(last, LAST, MID)).astype(np.int32)
        # FIRST steps get reward 0 (gymnasium already does, but be explicit);
        # only true terminations cut the bootstrap, truncations keep discount 1.
        reward = np.where(first, 0.0, reward).astype(np.float32)
        discount = np.where(terminated, 0.0, 1.0).astype(np.float32)
        return VectorStep(step_type, reward, discount, np.asarray(observation, dtype=self.dtype))

    def close(self) -> None:
        self.env.close()


def make_vector_steps(env_id: str, num_envs: int, seed: Optional[int] = None,
                      max_episode_steps: Optional[int] = None, seed_per_copy: bool = False) -> VectorSteps:
    """`VectorSteps` over `make_vector_env(...)`."""
    return VectorSteps(make_vector_env(env_id, num_envs, max_episode_steps, seed_per_copy), seed=seed)
