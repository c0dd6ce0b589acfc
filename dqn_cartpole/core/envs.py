"""Gymnasium -> TF-Agents ``PyEnvironment`` adapters.

tf-agents 0.19 only ships ``suite_gym`` for the legacy ``gym`` API, so this
module adapts gymnasium environments (single and vectorised) to TF-Agents.
"""

from __future__ import annotations

import os

# Must happen before anything imports pygame (gymnasium's renderers do), so
# rendering never tries to open an audio device and stays quiet on import.
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

from typing import Any, Optional  # noqa: E402

import gymnasium  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium import spaces  # noqa: E402
from gymnasium.vector import VectorEnv  # noqa: E402
from tf_agents.environments import py_environment  # noqa: E402
from tf_agents.specs import array_spec  # noqa: E402
from tf_agents.trajectories import time_step as ts  # noqa: E402
from tf_agents.typing import types  # noqa: E402

from dqn_cartpole.env_ids import (  # noqa: E402,F401  (EnvSpecError, check_env_id, max_return: re-exported)
    EnvSpecError, check_env_id, make_gymnasium, max_return, spaces_problem)
from dqn_cartpole.core.vector_env import VectorSteps, make_vector_env  # noqa: E402

__all__ = [
    "EnvSpecError",
    "check_env_id",
    "GymnasiumEnvironment",
    "BatchedGymnasiumEnvironment",
    "make_env",
    "make_batched_env",
    "max_return",
]

# --------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------


def _observation_spec(box: spaces.Box) -> array_spec.BoundedArraySpec:
    """Converts a Box to a spec; float boxes become float32 (what TF nets use)."""
    dtype = np.float32 if np.issubdtype(box.dtype, np.floating) else box.dtype
    return array_spec.BoundedArraySpec(
        shape=box.shape,
        dtype=dtype,
        minimum=np.asarray(box.low, dtype=dtype),
        maximum=np.asarray(box.high, dtype=dtype),
        name="observation",
    )


def _action_spec(discrete: spaces.Discrete) -> array_spec.BoundedArraySpec:
    """Converts a Discrete space to a scalar int64 spec."""
    start = int(discrete.start)
    return array_spec.BoundedArraySpec(
        shape=(),
        dtype=np.int64,
        minimum=start,
        maximum=start + int(discrete.n) - 1,
        name="action",
    )


class _Specs:
    """The specs of both adapters, which their ``__init__`` sets as ``_observation_spec`` and ``_action_spec``."""

    def observation_spec(self) -> array_spec.BoundedArraySpec:
        """See base class."""
        return self._observation_spec

    def action_spec(self) -> array_spec.BoundedArraySpec:
        """See base class."""
        return self._action_spec


# --------------------------------------------------------------------------
# Single environment
# --------------------------------------------------------------------------


class GymnasiumEnvironment(_Specs, py_environment.PyEnvironment):
    """Single (unbatched) gymnasium env as a PyEnvironment."""

    def __init__(self, env: gymnasium.Env, seed: Optional[int] = None):
        """Wraps ``env``.

        Args:
          env: A gymnasium env with a Box observation and Discrete action space.
          seed: Seed for the first reset only; later resets continue the env's
            RNG so successive episodes differ but stay reproducible.

        Raises:
          EnvSpecError: If the env's spaces are unsupported.
        """
        # The base class resets on the step() after a LAST time step.
        super().__init__(handle_auto_reset=True)
        name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        problem = spaces_problem(name, env.observation_space, env.action_space)
        if problem is not None:
            raise EnvSpecError(problem)
        self._env = env
        self._seed = seed
        self._seeded = False
        self._observation_spec = _observation_spec(env.observation_space)
        self._action_spec = _action_spec(env.action_space)

    @property
    def gym_env(self) -> Any:
        """The wrapped gymnasium env."""
        return self._env

    def _observation(self, observation: Any) -> np.ndarray:
        """Casts a gymnasium observation to the spec dtype."""
        return np.asarray(observation, dtype=self._observation_spec.dtype)

    def _reset(self) -> ts.TimeStep:
        """Resets the gymnasium env, seeding it only the first time so later episodes continue its RNG."""
        observation, _ = self._env.reset() if self._seeded else self._env.reset(seed=self._seed)
        self._seeded = True
        return ts.restart(self._observation(observation))

    def _step(self, action: types.NestedArray) -> ts.TimeStep:
        """Steps the gymnasium env and maps terminated/truncated to LAST."""
        observation, reward, terminated, truncated, _ = self._env.step(
            int(np.asarray(action).item())
        )
        observation = self._observation(observation)
        reward = np.asarray(reward, dtype=np.float32)
        # A real terminal state has no future value; a time limit does.
        if terminated:
            return ts.termination(observation, reward)
        if truncated:
            return ts.truncation(observation, reward)
        return ts.transition(observation, reward)

    def render(self, mode: str = "rgb_array") -> np.ndarray:
        """Returns the current frame as a uint8 HxWx3 array.

        Args:
          mode: Only ``'rgb_array'`` is supported.

        Raises:
          ValueError: If ``mode`` is not ``'rgb_array'`` or the env was not
            created with ``render_mode='rgb_array'``.
        """
        if mode != "rgb_array":
            raise ValueError(f"unsupported render mode {mode!r} (only 'rgb_array')")
        if self._env.render_mode != "rgb_array":
            raise ValueError(
                "env was created with render_mode="
                f"{self._env.render_mode!r}; use render_mode='rgb_array'"
            )
        return np.asarray(self._env.render(), dtype=np.uint8)

    def close(self) -> None:
        """Closes the gymnasium env."""
        self._env.close()

# --------------------------------------------------------------------------
# Batched environment
# --------------------------------------------------------------------------


class BatchedGymnasiumEnvironment(_Specs, py_environment.PyEnvironment):
    """N copies of an env stepped together as one batched PyEnvironment (`vector_env.VectorSteps`' steps)."""

    def __init__(self, vector_env: VectorEnv, seed: Optional[int] = None):
        """Wraps ``vector_env``.

        Args:
          vector_env: A gymnasium vector env in NEXT_STEP autoreset mode.
          seed: Seed for the first reset only (how it maps to sub-envs is up to
            the vector env: ``SyncVectorEnv`` seeds sub-env i with seed + i,
            ``CartPoleVectorEnv`` uses one RNG for the whole batch).

        Raises:
          EnvSpecError: If the spaces or the autoreset mode are unsupported.
        """
        # Gymnasium resets finished sub-envs itself; the base class must not
        # reset the whole batch when all elements happen to be LAST.
        super().__init__(handle_auto_reset=False)
        self._steps = VectorSteps(vector_env, seed=seed)
        self._observation_spec = _observation_spec(vector_env.single_observation_space)
        self._action_spec = _action_spec(vector_env.single_action_space)

    @property
    def gym_env(self) -> Any:
        """The wrapped gymnasium vector env."""
        return self._steps.env

    @property
    def steps(self) -> VectorSteps:
        """The same copies, stepped without TF-Agents' wrapping (what the NumPy evaluation steps)."""
        return self._steps

    @property
    def batched(self) -> bool:
        """See base class."""
        return True

    @property
    def batch_size(self) -> int:
        """See base class."""
        return self._steps.batch_size

    def _reset(self) -> ts.TimeStep:
        """Resets all sub-envs; seeds them only the first time."""
        return ts.TimeStep(*self._steps.reset())

    def _step(self, action: types.NestedArray) -> ts.TimeStep:
        """Steps all sub-envs; ones gymnasium just reset come back as FIRST."""
        return ts.TimeStep(*self._steps.step(action))

    def close(self) -> None:
        """Closes the gymnasium vector env."""
        self._steps.close()


# --------------------------------------------------------------------------
# Factories
# --------------------------------------------------------------------------


def make_env(
    env_id: str,
    seed: Optional[int] = None,
    render_mode: Optional[str] = None,
    max_episode_steps: Optional[int] = None,
) -> GymnasiumEnvironment:
    """Creates a single gymnasium env wrapped as a PyEnvironment.

    Args:
      env_id: Gymnasium env id.
      seed: Seed for the first reset.
      render_mode: e.g. ``'rgb_array'`` to enable ``render()``.
      max_episode_steps: Overrides the registered time limit when given.

    Raises:
      EnvSpecError: If the env id or its spaces are unsupported.
    """
    check_env_id(env_id)
    env = make_gymnasium(env_id, render_mode, max_episode_steps)
    return GymnasiumEnvironment(env, seed=seed)


def make_batched_env(
    env_id: str,
    num_envs: int,
    seed: Optional[int] = None,
    max_episode_steps: Optional[int] = None,
    seed_per_copy: bool = False,
) -> BatchedGymnasiumEnvironment:
    """Creates ``num_envs`` copies of an env as one batched PyEnvironment.

    Uses the env's numpy-vectorised ``vector_entry_point`` when it has one
    (CartPole does; much faster), else a ``SyncVectorEnv``: see
    ``vector_env.make_vector_env``.

    Args:
      env_id: Gymnasium env id.
      num_envs: Batch size.
      seed: Seed for the first reset.
      max_episode_steps: Overrides the registered time limit when given.
      seed_per_copy: Always a ``SyncVectorEnv``, whose copy i is seeded with
        ``seed + i``: each copy's first episode can then be replayed alone in
        one env reset with that seed (a vectorised env shares one RNG).

    Raises:
      EnvSpecError: If the env id or its spaces are unsupported.
      ValueError: If ``num_envs`` < 1.
    """
    vector_env = make_vector_env(env_id, num_envs, max_episode_steps, seed_per_copy)
    return BatchedGymnasiumEnvironment(vector_env, seed=seed)


