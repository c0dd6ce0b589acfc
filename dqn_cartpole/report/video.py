"""Headless mp4s of a policy: gymnasium renders rgb arrays, imageio-ffmpeg encodes them."""

from __future__ import annotations

from typing import Optional

import imageio
import numpy as np

from dqn_cartpole.envs import make_env
from dqn_cartpole.policies import ActFn
from dqn_cartpole.run_folder.atomic import replacing
from tf_agents.trajectories import time_step as ts


def _batch(time_step: ts.TimeStep) -> ts.TimeStep:
    return ts.TimeStep(*[np.asarray(x)[np.newaxis] for x in time_step])


def record_frames(act: ActFn, env_id: str, num_episodes: int, seed: Optional[int],
                  max_episode_steps: Optional[int] = None) -> tuple[list[np.ndarray], list[float]]:
    """Plays `num_episodes` episodes and returns every rendered frame and each episode's return."""
    env = make_env(env_id, seed=seed, render_mode="rgb_array", max_episode_steps=max_episode_steps)
    frames, returns = [], []
    try:
        for _ in range(num_episodes):
            time_step = env.reset()
            frames.append(env.render())
            total = 0.0
            while not time_step.is_last():
                time_step = env.step(act(_batch(time_step))[0])
                total += float(time_step.reward)
                frames.append(env.render())
            returns.append(total)
    finally:
        env.close()
    return frames, returns


def write_mp4(frames: list[np.ndarray], path: str, fps: int) -> str:
    """Encodes frames as H.264; written under a temporary name, then renamed."""
    # macro_block_size 8 fits CartPole's 600x400 frames without resizing.
    with replacing(path, ".tmp.mp4") as tmp, imageio.get_writer(
            tmp, fps=fps, codec="libx264", quality=7, macro_block_size=8, ffmpeg_log_level="error") as writer:
        for frame in frames:
            writer.append_data(frame)
    return path


def record_video(act: ActFn, env_id: str, path: str, num_episodes: int, fps: int, seed: Optional[int],
                 max_episode_steps: Optional[int] = None) -> list[float]:
    """Records `num_episodes` episodes of a policy to `path`; returns the episode returns."""
    frames, returns = record_frames(act, env_id, num_episodes, seed, max_episode_steps)
    write_mp4(frames, path, fps)
    return returns
