"""Gymnasium env ids: is an id registered and usable here, what return solves it, what return is the most.

Only gymnasium is imported here (no TensorFlow, no TF-Agents), so the command line can check
`env.id` before any heavy import, whatever TF_CPP_MIN_LOG_LEVEL the user exported.
"""

from __future__ import annotations

import os

os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # before gymnasium's renderers import pygame

import difflib  # noqa: E402
import functools  # noqa: E402
from typing import Any, Optional  # noqa: E402

import gymnasium  # noqa: E402
from gymnasium import spaces  # noqa: E402
from gymnasium.envs.registration import EnvSpec  # noqa: E402

# Maximum reward per step for env families whose max return is
# max_episode_steps * per-step reward (CartPole pays +1 for every step alive).
_MAX_REWARD_PER_STEP: dict[str, float] = {"CartPole": 1.0}
# Minimum reward per step for env families whose worst return is max_episode_steps * it: Acrobot and
# MountainCar pay -1 for every step until the goal, so an agent that never reaches it scores -500 / -200.
_MIN_REWARD_PER_STEP: dict[str, float] = {"Acrobot": -1.0, "MountainCar": -1.0}
BOX2D_EXTRA = "dqn_cartpole[box2d]"  # LunarLander's physics engine, an optional extra (see pyproject.toml)


class EnvSpecError(ValueError):
    """Raised when an env id is unknown or its spaces are unsupported; the message is always one clear line."""


def suggest_env_id(env_id: str) -> Optional[str]:
    """Returns the registered env id closest to ``env_id``, if any is close."""
    # Match case-insensitively so 'cartpole-v1' suggests 'CartPole-v1'.
    by_lower = {key.lower(): key for key in gymnasium.registry}
    matches = difflib.get_close_matches(env_id.lower(), list(by_lower), n=1)
    return by_lower[matches[0]] if matches else None


def registered_spec(env_id: str) -> EnvSpec:
    """Returns the registry spec of ``env_id`` or raises ``EnvSpecError``."""
    spec = gymnasium.registry.get(env_id)
    if spec is None:
        suggestion = suggest_env_id(env_id)
        hint = f" (did you mean {suggestion!r}?)" if suggestion else ""
        raise EnvSpecError(f"unknown gymnasium env id {env_id!r}{hint}")
    return spec


def spaces_problem(name: str, observation_space: spaces.Space, action_space: spaces.Space) -> Optional[str]:
    """Describes why the spaces are unsupported, or None if they are fine."""
    if not isinstance(observation_space, spaces.Box):
        return f"env {name!r} has unsupported observation space {observation_space} (need gymnasium.spaces.Box)"
    if not isinstance(action_space, spaces.Discrete):
        return f"env {name!r} has unsupported action space {action_space} (need gymnasium.spaces.Discrete)"
    return None


def check_spaces(env: Any, observation_space: spaces.Space, action_space: spaces.Space) -> str:
    """The (vector) env's name; EnvSpecError (`spaces_problem`'s line) if its spaces are unsupported."""
    name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    problem = spaces_problem(name, observation_space, action_space)
    if problem is not None:
        raise EnvSpecError(problem)
    return name


@functools.lru_cache(maxsize=None)
def _env_id_spaces_problem(env_id: str) -> Optional[str]:
    """Builds ``env_id`` once to inspect its spaces (cached: spaces are static)."""
    try:
        env = make_gymnasium(env_id, render_mode=None, max_episode_steps=None)
    except gymnasium.error.DependencyNotInstalled as e:
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        if first_line.startswith("Box2D is not installed"):
            # gymnasium[box2d] would bring pygame-ce, which replaces the pinned pygame: the extra installs Box2D alone.
            first_line = f"Box2D is not installed; install it with: pip install {BOX2D_EXTRA!r}"
        return f"cannot construct env {env_id!r}: {first_line}"
    try:
        return spaces_problem(env_id, env.observation_space, env.action_space)
    finally:
        env.close()


def space_sizes(env_id: str, max_episode_steps: Optional[int] = None) -> tuple[tuple, int]:
    """(observation shape, number of actions) of a supported env id (checked with `check_env_id` first)."""
    env = make_gymnasium(env_id, render_mode=None, max_episode_steps=max_episode_steps)
    try:
        return tuple(env.observation_space.shape), int(env.action_space.n)
    finally:
        env.close()


def check_env_id(env_id: str) -> None:
    """Checks that ``env_id`` (e.g. 'CartPole-v1') is registered and has Box obs / Discrete actions; EnvSpecError
    (an unknown id with a suggestion) if not."""
    registered_spec(env_id)
    problem = _env_id_spaces_problem(env_id)
    if problem is not None:
        raise EnvSpecError(problem)


def make_gymnasium(env_id: str, render_mode: Optional[str], max_episode_steps: Optional[int]) -> gymnasium.Env:
    """``gymnasium.make`` without the env checker or the 'out of date' warning."""
    kwargs: dict[str, Any] = {"disable_env_checker": True}
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
        if render_mode == "rgb_array":  # drawn off-screen: pygame needs no display (a headless notebook, CI)
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    # Passing the EnvSpec (not the id string) skips gymnasium's version lookup,
    # which warns for deliberately chosen older versions such as CartPole-v0.
    return gymnasium.make(registered_spec(env_id), **kwargs)


def reward_threshold(env_id: str) -> Optional[float]:
    """The env's registered "solved" return (475 for CartPole-v1, 195 for v0), if it has one."""
    spec = gymnasium.registry.get(env_id)
    return None if spec is None or spec.reward_threshold is None else float(spec.reward_threshold)


def max_return(env_id: str, max_episode_steps: Optional[int] = None) -> Optional[float]:
    """The largest episode return, where known: the time limit times the per-step reward.

    For CartPole-vX that is 500 (v1) or 200 (v0) with the registered time limit, or
    `max_episode_steps` when a run overrides it. None for envs whose reward varies.
    """
    return _bound(env_id, max_episode_steps, _MAX_REWARD_PER_STEP)


def min_return(env_id: str, max_episode_steps: Optional[int] = None) -> Optional[float]:
    """The lowest episode return, where known: -500 for Acrobot-v1 and -200 for MountainCar-v0 (the time limit
    times -1, an agent that never reaches the goal); None for other envs."""
    return _bound(env_id, max_episode_steps, _MIN_REWARD_PER_STEP)


def _bound(env_id: str, max_episode_steps: Optional[int], per_step_rewards: dict[str, float]) -> Optional[float]:
    spec = gymnasium.registry.get(env_id)
    if spec is None or spec.namespace is not None:
        return None
    steps = max_episode_steps or spec.max_episode_steps
    per_step = per_step_rewards.get(spec.name)
    return None if per_step is None or steps is None else steps * per_step
