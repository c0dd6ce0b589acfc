"""Headless videos of a policy: play the episodes first, then render and encode them (in another process).

Playing needs the policy (TensorFlow) but no pixels: `play` runs the episodes and keeps their
actions and returns. Rendering needs pixels but no policy: `render_video` replays those actions
in the same seeded gymnasium env (its dynamics depend only on the seed and the actions; the
replayed returns are checked), draws each frame with gymnasium's rgb_array renderer, captions
it with the episode and the return so far, and streams it into ffmpeg's H.264 encoder. After a
training run the rendering runs in a child process that imports no TensorFlow
(a `processes.child.WorkerChild` sent each `VideoJob`; see `start_job`), while the trainer draws its plots.

Each episode ends on a one-second title card with its return, which also keeps a random agent's
short episodes on screen long enough to see. A video may show only its first `full_episodes`
episodes whole: the later ones become a clip of CLIP_S seconds (their start, or their end when
they fail), and their card still gives the whole return. Videos play in real time at any frame
rate: at 25 fps a 50 Hz env (CartPole steps 0.02 s) shows every other step.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import numpy as np

from dqn_cartpole.env_ids import make_gymnasium
from dqn_cartpole.processes.child import WorkerChild, serve
from dqn_cartpole.report.plotter import NICENESS
from dqn_cartpole.run_folder.atomic import replacing

CAPTION_HEIGHT = 30  # pixels of the strip drawn over the top of each frame
TITLE_CARD_S = 1.0  # seconds the card after each episode stays on screen
CLIP_S = 2.0  # seconds shown of an episode after a video's `full_episodes`
FONT_SIZE = 18
# H.264 in a profile and pixel format every browser decodes: `main` caps the profile, and with the
# `ultrafast` preset (no B-frames, no CABAC) x264 writes Constrained Baseline, the simplest (ffprobe says
# so). +faststart puts the index first, so a browser can start playing before the whole file has loaded.
BROWSER_SAFE = ["-profile:v", "main", "-movflags", "+faststart"]
# CartPole's flat frames compress trivially: at the same quality (CRF), `ultrafast` takes ~40% less
# encoder time per frame than the default preset, for files of a few hundred kB.
PRESET = ["-preset", "ultrafast"]
PROGRESS_EVERY = 25  # frames between the renderer's progress lines

Sink = Callable[[np.ndarray], None]


@dataclass(frozen=True)
class Episode:
    """One played episode, enough to replay it: the seed of the reset before it (None: the env's RNG
    continues from the previous episode), its actions, its return and whether it failed."""

    seed: Optional[int]
    actions: tuple
    total: float
    terminated: bool

    @property
    def steps(self) -> int:
        return len(self.actions)


@dataclass(frozen=True)
class VideoSpec:
    """One mp4: its episodes in order; the ones after `full_episodes` are shown as clips."""

    path: str
    label: str
    episodes: tuple
    full_episodes: int


@dataclass(frozen=True)
class VideoJob:
    """What a renderer needs: the env, the frame rate and the videos (a pickle between processes)."""

    env_id: str
    max_episode_steps: Optional[int]
    fps: int
    videos: tuple
    env_fps: int = 0  # the env's steps per second (its render_fps); 0: one frame per step

    @property
    def timing(self) -> "Timing":
        return Timing(self.fps, self.env_fps or self.fps)

    def frames(self) -> int:
        """The frames of every video: the shown steps and the title cards."""
        timing = self.timing
        return sum(sum(timing.frames_of(step) for step in shown_steps(v, i, timing.env_fps)) + timing.card_frames
                   for v in self.videos for i in range(len(v.episodes)))


@dataclass(frozen=True)
class Timing:
    """Real-time playback: the video's frames per second against the env's steps per second."""

    fps: int
    env_fps: int

    def frames_of(self, step: int) -> int:
        """Frames showing `step` (0, 1 or more): frame k shows the step at k / fps seconds."""
        def frames_before(s: int) -> int:  # ceil(s * fps / env_fps), in integers
            return -(-s * self.fps // self.env_fps)

        return frames_before(step + 1) - frames_before(step)

    @property
    def card_frames(self) -> int:
        return max(1, round(TITLE_CARD_S * self.fps))


def env_fps(env_id: str) -> int:
    """The env's steps per second as its renderer declares them (`render_fps`; CartPole: 50), else 0."""
    env = make_gymnasium(env_id, None, None)
    try:
        return int(env.metadata.get("render_fps") or 0)
    finally:
        env.close()


def shown_steps(video: VideoSpec, index: int, steps_per_s: int) -> range:
    """The steps of episode `index` on screen (0: the state after the reset; k: after action k)."""
    episode = video.episodes[index]
    clip = max(1, int(round(CLIP_S * steps_per_s)))
    if index < video.full_episodes or episode.steps + 1 <= clip:
        return range(episode.steps + 1)
    if episode.terminated:  # how it fails is what there is to see
        return range(episode.steps + 1 - clip, episode.steps + 1)
    return range(clip)


# ---------------------------------------------------------------------------- playing (needs the policy)


def play(act: Callable, env_id: str, num_episodes: int, seed: Optional[int],
         max_episode_steps: Optional[int] = None) -> tuple:
    """Plays `num_episodes` episodes of `act` (batched time step -> actions), one after another in one env
    seeded once, without rendering."""
    from tf_agents.trajectories import time_step as ts  # the trainer and `record` play; the renderer does not

    from dqn_cartpole.core.envs import make_env

    env = make_env(env_id, seed=seed, max_episode_steps=max_episode_steps)
    episodes = []
    try:
        for index in range(num_episodes):
            time_step, actions, total = env.reset(), [], 0.0
            while not time_step.is_last():
                action = int(np.asarray(act(ts.TimeStep(*[np.asarray(x)[np.newaxis] for x in time_step])))[0])
                actions.append(action)
                time_step = env.step(np.asarray(action))
                total += float(time_step.reward)
            episodes.append(Episode(seed if index == 0 else None, tuple(actions), total,
                                    terminated=float(time_step.discount) == 0.0))
    finally:
        env.close()
    return tuple(episodes)


def play_side_by_side(policy: Any, env_id: str, num_episodes: int, seed: int,
                      max_episode_steps: Optional[int] = None) -> tuple:
    """Plays `num_episodes` episodes of a policy at once (episode i in a copy seeded `seed + i`): the agent's
    `NumpyGreedy` in NumPy, a TF policy in one compiled call (see `make_episode_runner`), ~10x faster than
    `play` for a trained agent's long episodes."""
    from dqn_cartpole.core.envs import make_batched_env
    from dqn_cartpole.core.evaluation import make_episode_runner

    env = make_batched_env(env_id, num_episodes, seed=seed, max_episode_steps=max_episode_steps, seed_per_copy=True)
    try:
        result = make_episode_runner(policy, env, keep_actions=True)()
    finally:
        env.close()
    return tuple(Episode(seed + i, tuple(int(a) for a in result.actions[i, :result.lengths[i]]),
                         float(result.returns[i]), bool(result.terminated[i])) for i in range(num_episodes))


# ---------------------------------------------------------------------------- frames


@functools.lru_cache(maxsize=None)
def _font(size: int = FONT_SIZE) -> "ImageFont.ImageFont":
    from PIL import ImageFont  # Pillow and imageio only where frames are drawn (the trainer only plays)

    try:  # Pillow >= 10.1 ships a scalable default font; no system fonts needed
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):
        return ImageFont.load_default()


def caption(frame: np.ndarray, head: str, tail: str = "") -> np.ndarray:
    """`frame` (BGRX, see `surface_frames`) with `head` + `tail` in white on a dark strip across its top, drawn in
    place (each frame is a fresh array, and the encoder's one copy into the pipe is the only copy of it). The strip
    with `head` is drawn once (`caption_strip`); `tail`, which changes from frame to frame (the return so far), is
    set from each character's glyph, drawn once (`glyph`): drawing the whole text each frame cost ~1.3 ms."""
    strip = caption_strip(frame.shape[1], head)
    if tail:
        strip = strip.copy()
        font, x = _font(), CAPTION_X + _font().getlength(head)
        for char in tail:
            tile = glyph(char)
            left = int(round(x)) - GLYPH_PAD
            width = min(tile.shape[1], strip.shape[1] - left)
            if width > 0:
                np.maximum(strip[:, left:left + width], tile[:, :width], out=strip[:, left:left + width])
            x += font.getlength(char)
    frame[:CAPTION_HEIGHT, :, :3] = strip[..., ::-1]
    return frame


CAPTION_X = 10  # where the caption's text starts
GLYPH_PAD = 2  # pixels a glyph may reach left of its origin


def _text_strip(width: int, x: int, text: str) -> np.ndarray:
    """A dark strip `width` pixels wide with `text` in white, its origin `x` pixels from the left."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, CAPTION_HEIGHT), (32, 32, 32))
    ImageDraw.Draw(image).text((x, CAPTION_HEIGHT // 2), text, fill=(255, 255, 255), font=_font(), anchor="lm")
    return np.asarray(image)


@functools.lru_cache(maxsize=None)
def glyph(char: str) -> np.ndarray:
    """One character in white on the strip's dark background, its origin GLYPH_PAD pixels from the left."""
    return _text_strip(int(_font().getlength(char)) + 2 * GLYPH_PAD + 2, GLYPH_PAD, char)


@functools.lru_cache(maxsize=64)
def caption_strip(width: int, text: str) -> np.ndarray:
    """The strip alone (drawing only it is ~10x cheaper than drawing on the whole frame)."""
    return _text_strip(width, CAPTION_X, text)


def title_card(shape: tuple, lines: list[str]) -> np.ndarray:
    """A dark frame of `shape` with `lines` centred on it."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (shape[1], shape[0]), (32, 32, 32))
    draw = ImageDraw.Draw(image)
    font = _font(FONT_SIZE + 10)
    for i, line in enumerate(lines):
        y = image.height // 2 + (i - (len(lines) - 1) / 2) * (FONT_SIZE + 20)
        draw.text((image.width // 2, y), line, fill=(255, 255, 255), font=font, anchor="mm")
    return np.asarray(image)


@contextlib.contextmanager
def mp4_writer(path: str, fps: int) -> Iterator[Sink]:
    """Yields append(frame) for an H.264 mp4 (yuv420p, Constrained Baseline) of BGRX frames (`surface_frames`),
    the encoder started at the first one (which gives the size); written under a temporary name, then renamed, so
    `path` is never half-written. The encoder's settings are imageio's `get_writer(quality=7)`'s, which calls the
    same `imageio_ffmpeg.write_frames` for RGB frames."""
    import imageio_ffmpeg

    with replacing(path, ".tmp.mp4") as tmp:
        writer = None

        def append(frame: np.ndarray) -> None:
            nonlocal writer
            if writer is None:
                # macro_block_size 8 fits CartPole's 600x400 frames without resizing.
                writer = imageio_ffmpeg.write_frames(
                    tmp, (frame.shape[1], frame.shape[0]), pix_fmt_in="bgr0", pix_fmt_out="yuv420p", fps=fps,
                    codec="libx264", quality=7, macro_block_size=8, output_params=BROWSER_SAFE + PRESET,
                    ffmpeg_log_level="error")
                writer.send(None)  # the generator starts ffmpeg
            writer.send(frame)

        try:
            yield append
        finally:
            if writer is not None:
                writer.close()


def render_episode(env: Any, video: VideoSpec, index: int, timing: Timing, sink: Sink,
                   grab: Callable[[Any], np.ndarray]) -> float:
    """Replays episode `index` of `video` in `env`, handing `sink` its shown frames, then its title card.

    Returns the replayed return (the played one, in a deterministic env).
    """
    episode, count = video.episodes[index], len(video.episodes)
    shown = shown_steps(video, index, timing.env_fps)
    where = f"{video.label} - episode {index + 1}/{count}" if video.label else f"episode {index + 1}/{count}"
    part = "" if len(shown) == episode.steps + 1 else f"   ({'last' if shown.start else 'first'} {CLIP_S:g} s)"
    env.reset(seed=episode.seed)  # None: no seed, as gymnasium's default
    total, shape = 0.0, None
    for step in range(episode.steps + 1):
        if step:
            total += float(env.step(episode.actions[step - 1])[1])
        frames = timing.frames_of(step) if step in shown else 0
        if frames or (shape is None and step == shown[-1]):  # the title card takes its size from a frame
            frame = caption(grab(env), f"{where}   return ", f"{total:.0f}{part}")
            shape = frame.shape
            for _ in range(frames):
                sink(frame)
    lines = [f"{where.replace('/', ' of ')}", f"return {total:.0f} in {episode.steps} steps"]
    if part:
        lines.append(f"({len(shown) / timing.env_fps:.0f} s of {(episode.steps + 1) / timing.env_fps:.0f} s shown)")
    card = bgrx(title_card(shape, lines))
    for _ in range(timing.card_frames):
        sink(card)
    return total


@contextlib.contextmanager
def surface_frames() -> Iterator[Callable[[Any], np.ndarray]]:
    """Yields grab(env) -> the env's next frame as BGRX pixels [H, W, 4] (uint8, X unused), what the encoder takes.

    gymnasium's pygame renderers (CartPole, Acrobot, MountainCar, LunarLander) end with
    `np.transpose(np.array(pygame.surfarray.pixels3d(screen)), (1, 0, 2))`: a pixel-by-pixel copy of the
    surface's 4-byte pixels, 3.3 ms of CartPole's 3.9 ms per frame. Inside this block `pixels3d` hands the surface
    over instead (and an empty array to gymnasium), and the frame is the surface's own memory, copied in one go
    (0.04 ms), which is already BGRX on a little-endian machine: ffmpeg takes it as `bgr0` and converts it to YUV as
    it converted RGB. A surface of another layout, or an env that renders otherwise, gives its RGB frame, converted.
    A test checks the frames against gymnasium's own."""
    import pygame

    original, captured = pygame.surfarray.pixels3d, []
    empty = np.zeros((0, 0, 3), np.uint8)

    def pixels3d(surface: Any) -> np.ndarray:
        width = surface.get_width()
        if sys.byteorder == "little" and surface.get_bitsize() == 32 and surface.get_shifts()[:3] == (16, 8, 0) \
                and surface.get_pitch() == 4 * width:
            captured.append(surface)
            return empty
        return original(surface)

    def grab(env: Any) -> np.ndarray:
        captured.clear()
        rgb = env.render()
        if captured:
            surface = captured[0]
            raw = bytearray(surface.get_buffer().raw)
            return np.frombuffer(raw, np.uint8).reshape(surface.get_height(), surface.get_width(), 4)
        return bgrx(np.asarray(rgb, np.uint8))

    pygame.surfarray.pixels3d = pixels3d
    try:
        yield grab
    finally:
        pygame.surfarray.pixels3d = original


def bgrx(rgb: np.ndarray) -> np.ndarray:
    """An RGB image [H, W, 3] as BGRX [H, W, 4]."""
    out = np.zeros(rgb.shape[:2] + (4,), np.uint8)
    out[..., :3] = rgb[..., ::-1]
    return out


def render_video(video: VideoSpec, env_id: str, max_episode_steps: Optional[int], timing: Timing,
                 on_frame: Callable[[], None] = lambda: None) -> list[float]:
    """Writes `video`'s mp4; returns the replayed returns. `on_frame` is called after each frame."""
    env = make_gymnasium(env_id, "rgb_array", max_episode_steps)
    returns = []
    try:
        with mp4_writer(video.path, timing.fps) as append, surface_frames() as grab:
            def sink(frame: np.ndarray) -> None:
                append(frame)
                on_frame()

            for index, episode in enumerate(video.episodes):
                total = render_episode(env, video, index, timing, sink, grab)
                if not math.isclose(total, episode.total, rel_tol=1e-6, abs_tol=1e-6):
                    print(f"warning: {video.path}: episode {index + 1} replayed to return {total:g}, not the "
                          f"{episode.total:g} it was played to (is {env_id} deterministic given its seed?)",
                          file=sys.stderr)
                returns.append(total)
    finally:
        env.close()
    return returns


def record_video(act: Callable, env_id: str, path: str, num_episodes: int, fps: int, seed: Optional[int],
                 max_episode_steps: Optional[int] = None, label: str = "") -> list[float]:
    """Records `num_episodes` whole episodes of a policy to the mp4 `path`, in this process; returns their returns."""
    episodes = play(act, env_id, num_episodes, seed, max_episode_steps)
    job = VideoJob(env_id, max_episode_steps, fps, (VideoSpec(path, label, episodes, num_episodes),), env_fps(env_id))
    return render_video(job.videos[0], env_id, max_episode_steps, job.timing)


# ---------------------------------------------------------------------------- the renderer process


class VideoProcess(WorkerChild):
    """A child process rendering `VideoJob`s (see `serve_child`): `send_job` them now or later; `frames_done`
    follows its progress."""

    def __init__(self, job: Optional[VideoJob] = None):
        self.total, self.frames_done = 0, 0
        self.on_progress: Callable[[int, int], None] = lambda done, total: None
        super().__init__(__name__, on_message=self._follow_frames, what="the renderer", niceness=NICENESS)
        if job is not None:
            self.send_job(job)

    def _follow_frames(self, message: tuple) -> None:
        self.frames_done = message[1]  # ("frames", N)
        self.on_progress(self.frames_done, self.total)

    def send_job(self, job: VideoJob, on_progress: Callable[[int, int], None] = lambda done, total: None,
                 more: bool = False) -> None:
        """Renders `job` (after any sent before it); `on_progress(frames done, frames in all)` follows it. With
        `more`, another job may follow; otherwise this is the last."""
        self.total, self.on_progress = job.frames(), on_progress
        self.send(job, end=not more)


def start_job(job: VideoJob, on_progress: Callable[[int, int], None] = lambda done, total: None) -> VideoProcess:
    """Starts rendering `job` in a child process; `on_progress(frames done, frames in all)` follows it."""
    process = VideoProcess()
    process.send_job(job, on_progress)
    return process


def prepare_to_render() -> None:
    """Imports what rendering and encoding need (imageio, Pillow and its fonts, pygame: ~0.5 s) before the job
    comes, so a renderer started with the run has them by the time the trainer is done."""
    import imageio  # noqa: F401
    import pygame  # noqa: F401  (gymnasium draws CartPole with it)

    _font()
    _font(FONT_SIZE + 10)


def serve_child() -> int:
    """The renderer's process: each `VideoJob` rendered as it comes, answering `("frames", N)` as it goes."""
    return serve(render_job, prepare_to_render)


def render_job(job: VideoJob, reply: Callable[[tuple], None] = lambda message: None) -> None:
    """Renders every video of `job`, replying `("frames", N)` every PROGRESS_EVERY frames and at its end."""
    done = 0

    def count() -> None:
        nonlocal done
        done += 1
        if done % PROGRESS_EVERY == 0:
            reply(("frames", done))

    for video in job.videos:
        render_video(video, job.env_id, job.max_episode_steps, job.timing, count)
    reply(("frames", done))
