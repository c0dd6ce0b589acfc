"""Gymnasium -> TF-Agents ``PyEnvironment`` adapters.

tf-agents 0.19 only ships ``suite_gym`` for the legacy ``gym`` API, so this
module adapts gymnasium environments (single and vectorised) to TF-Agents.
"""

from __future__ import annotations

# vector_env first: it sets SDL_AUDIODRIVER / PYGAME_HIDE_SUPPORT_PROMPT before anything imports pygame.
from dqn_cartpole.core.vector_env import VectorSteps, make_vector_env, observation_dtype
from dqn_cartpole.env_ids import (  # noqa: F401  (EnvSpecError, check_env_id, max_return: re-exported)
    EnvSpecError, check_env_id, check_spaces, make_gymnasium, max_return)

from typing import Any, Optional

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import VectorEnv
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.typing import types

__all__ = ["EnvSpecError", "check_env_id", "GymnasiumEnvironment", "BatchedGymnasiumEnvironment", "make_env",
           "make_batched_env", "max_return"]


def _specs(box: spaces.Box, discrete: spaces.Discrete) -> tuple[array_spec.BoundedArraySpec, ...]:
    """(observation, action) specs: float boxes become float32 (`observation_dtype`), actions a
    scalar int64."""
    dtype = observation_dtype(box)
    start = int(discrete.start)
    return (array_spec.BoundedArraySpec(shape=box.shape, dtype=dtype, minimum=np.asarray(box.low, dtype=dtype),
                                        maximum=np.asarray(box.high, dtype=dtype), name="observation"),
            array_spec.BoundedArraySpec(shape=(), dtype=np.int64, minimum=start,
                                        maximum=start + int(discrete.n) - 1, name="action"))


class _Specs:
    """The specs of both adapters, which their ``__init__`` sets as ``_observation_spec`` and ``_action_spec``."""

    def observation_spec(self) -> array_spec.BoundedArraySpec:
        return self._observation_spec

    def action_spec(self) -> array_spec.BoundedArraySpec:
        return self._action_spec


class GymnasiumEnvironment(_Specs, py_environment.PyEnvironment):
    """Single (unbatched) gymnasium env as a PyEnvironment."""

    def __init__(self, env: gymnasium.Env, seed: Optional[int] = None):
        """`seed` seeds the first reset only (later episodes continue the env's RNG); EnvSpecError unless the
        env has a Box observation and a Discrete action space."""
        # The base class resets on the step() after a LAST time step.
        super().__init__(handle_auto_reset=True)
        check_spaces(env, env.observation_space, env.action_space)
        self._env = env
        self._seed = seed
        self._seeded = False
        self._observation_spec, self._action_spec = _specs(env.observation_space, env.action_space)

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
        """The current frame as a uint8 HxWx3 array (ValueError unless `mode` and the env's are 'rgb_array')."""
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


class BatchedGymnasiumEnvironment(_Specs, py_environment.PyEnvironment):
    """N copies of an env stepped together as one batched PyEnvironment (`vector_env.VectorSteps`' steps)."""

    def __init__(self, vector_env: VectorEnv, seed: Optional[int] = None):
        """`vector_env` in NEXT_STEP autoreset mode; `seed` as in `vector_env.VectorSteps`."""
        # Gymnasium resets finished sub-envs itself; the base class must not
        # reset the whole batch when all elements happen to be LAST.
        super().__init__(handle_auto_reset=False)
        self._steps = VectorSteps(vector_env, seed=seed)
        self._observation_spec, self._action_spec = _specs(vector_env.single_observation_space,
                                                           vector_env.single_action_space)

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
        return True

    @property
    def batch_size(self) -> int:
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


def make_env(env_id: str, seed: Optional[int] = None, render_mode: Optional[str] = None,
             max_episode_steps: Optional[int] = None) -> GymnasiumEnvironment:
    """One gymnasium env as a PyEnvironment (render_mode 'rgb_array' enables `render()`); EnvSpecError."""
    check_env_id(env_id)
    env = make_gymnasium(env_id, render_mode, max_episode_steps)
    return GymnasiumEnvironment(env, seed=seed)


def make_batched_env(env_id: str, num_envs: int, seed: Optional[int] = None, max_episode_steps: Optional[int] = None,
                     seed_per_copy: bool = False) -> BatchedGymnasiumEnvironment:
    """`num_envs` copies as one batched PyEnvironment over `vector_env.make_vector_env` (see it)."""
    return BatchedGymnasiumEnvironment(make_vector_env(env_id, num_envs, max_episode_steps, seed_per_copy), seed=seed)
