"""Headless videos of a policy: gymnasium renders rgb arrays, imageio-ffmpeg encodes them as they come.

Frames are streamed into the encoder one at a time (a 500-step CartPole episode would otherwise
hold ~360 MB of frames). Each frame gets a caption strip with the episode number and the return
so far; after each episode a one-second title card shows its final return, which also keeps a
random agent's short episodes on screen long enough to see.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, Optional

import imageio
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from dqn_cartpole.core.envs import make_env
from dqn_cartpole.core.policies import ActFn
from dqn_cartpole.run_folder.atomic import replacing
from tf_agents.trajectories import time_step as ts

CAPTION_HEIGHT = 30  # pixels of the strip drawn over the top of each frame
TITLE_CARD_S = 1.0  # seconds the card after each episode stays on screen
FONT_SIZE = 18
# H.264 in the profile and pixel format every browser decodes; +faststart puts the index first,
# so a browser can start playing before the whole file has loaded.
BROWSER_SAFE = ["-profile:v", "main", "-movflags", "+faststart"]

Sink = Callable[[np.ndarray], None]


def _batch(time_step: ts.TimeStep) -> ts.TimeStep:
    return ts.TimeStep(*[np.asarray(x)[np.newaxis] for x in time_step])


@functools.lru_cache(maxsize=None)
def _font(size: int = FONT_SIZE) -> ImageFont.ImageFont:
    try:  # Pillow >= 10.1 ships a scalable default font; no system fonts needed
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):
        return ImageFont.load_default()


def caption(frame: np.ndarray, text: str) -> np.ndarray:
    """A copy of `frame` with `text` in white on a dark strip across its top."""
    out = np.array(frame)  # contiguous, and the caller's frame stays as it was
    out[:CAPTION_HEIGHT] = caption_strip(out.shape[1], text)
    return out


@functools.lru_cache(maxsize=64)
def caption_strip(width: int, text: str) -> np.ndarray:
    """The strip alone (drawing only it is ~10x cheaper than drawing on the whole frame)."""
    image = Image.new("RGB", (width, CAPTION_HEIGHT), (32, 32, 32))
    ImageDraw.Draw(image).text((10, CAPTION_HEIGHT // 2), text, fill=(255, 255, 255), font=_font(), anchor="lm")
    return np.asarray(image)


def title_card(shape: tuple, lines: list[str]) -> np.ndarray:
    """A dark frame of `shape` with `lines` centred on it."""
    image = Image.new("RGB", (shape[1], shape[0]), (32, 32, 32))
    draw = ImageDraw.Draw(image)
    font = _font(FONT_SIZE + 10)
    for i, line in enumerate(lines):
        y = image.height // 2 + (i - (len(lines) - 1) / 2) * (FONT_SIZE + 20)
        draw.text((image.width // 2, y), line, fill=(255, 255, 255), font=font, anchor="mm")
    return np.asarray(image)


def play_episodes(act: ActFn, env_id: str, num_episodes: int, seed: Optional[int], sink: Sink, fps: int,
                  label: str = "", max_episode_steps: Optional[int] = None) -> list[float]:
    """Plays `num_episodes` episodes, handing each captioned frame to `sink` as it is rendered.

    After each episode `sink` gets TITLE_CARD_S seconds of a card with its return. Returns each
    episode's return.
    """
    env = make_env(env_id, seed=seed, render_mode="rgb_array", max_episode_steps=max_episode_steps)
    prefix = f"{label} - " if label else ""
    returns = []
    try:
        for episode in range(1, num_episodes + 1):
            where = f"{prefix}episode {episode}/{num_episodes}"
            time_step, total, steps = env.reset(), 0.0, 0
            frame = env.render()
            sink(caption(frame, f"{where}   return {total:.0f}"))
            while not time_step.is_last():
                time_step = env.step(act(_batch(time_step))[0])
                total += float(time_step.reward)
                steps += 1
                sink(caption(env.render(), f"{where}   return {total:.0f}"))
            returns.append(total)
            card = title_card(frame.shape, [f"{prefix}episode {episode} of {num_episodes}",
                                            f"return {total:.0f} in {steps} steps"])
            for _ in range(max(1, round(TITLE_CARD_S * fps))):
                sink(card)
    finally:
        env.close()
    return returns


@contextlib.contextmanager
def mp4_writer(path: str, fps: int) -> Iterator[Sink]:
    """Yields append(frame) for an H.264 mp4 (yuv420p, main profile); written under a temporary name, then
    renamed, so `path` is never half-written."""
    # macro_block_size 8 fits CartPole's 600x400 frames without resizing.
    with replacing(path, ".tmp.mp4") as tmp, imageio.get_writer(
            tmp, fps=fps, codec="libx264", quality=7, pixelformat="yuv420p", macro_block_size=8,
            output_params=BROWSER_SAFE, ffmpeg_log_level="error") as writer:
        yield writer.append_data


def record_video(act: ActFn, env_id: str, path: str, num_episodes: int, fps: int, seed: Optional[int],
                 max_episode_steps: Optional[int] = None, label: str = "") -> list[float]:
    """Records `num_episodes` episodes of a policy to the mp4 `path`; returns the episode returns."""
    with mp4_writer(path, fps) as append:
        return play_episodes(act, env_id, num_episodes, seed, append, fps, label, max_episode_steps)
