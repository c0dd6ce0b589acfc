"""The videos: which steps become frames, replaying played episodes exactly, and the renderer process.

No TensorFlow here: episodes are played with gymnasium directly, as the renderer replays them.
"""

from __future__ import annotations

import os
import sys

import imageio.v2 as imageio
import numpy as np
import pytest

from dqn_cartpole.env_ids import make_gymnasium
from dqn_cartpole.report import video
from dqn_cartpole.report.video import Episode, VideoJob, VideoSpec

FPS = 50  # CartPole's own rate: one frame per step
TIMING = video.Timing(FPS, FPS)
CLIP = int(video.CLIP_S * FPS)
CARD = TIMING.card_frames


def played(seed: int, policy, max_steps=None) -> Episode:
    """An episode of `policy(observation) -> action` in CartPole-v1, as `play_side_by_side` records one."""
    env = make_gymnasium("CartPole-v1", None, max_steps)
    observation, _ = env.reset(seed=seed)
    actions, total, terminated, truncated = [], 0.0, False, False
    while not (terminated or truncated):
        actions.append(int(policy(observation)))
        observation, reward, terminated, truncated, _ = env.step(actions[-1])
        total += float(reward)
    env.close()
    return Episode(seed, tuple(actions), total, bool(terminated))


def balance(observation) -> int:
    return int(observation[2] + observation[3] > 0)  # push towards the pole's lean: survives the time limit


def test_which_steps_become_frames():
    long_ok = Episode(1, (0,) * 499, 499.0, False)
    long_failed = Episode(2, (0,) * 300, 300.0, True)
    short = Episode(3, (0,) * 20, 20.0, True)
    spec = VideoSpec("x.mp4", "a", (long_ok, long_ok, long_failed, short), full_episodes=1)
    assert video.shown_steps(spec, 0, FPS) == range(500)  # the first episode whole (the reset frame too)
    assert video.shown_steps(spec, 1, FPS) == range(CLIP)  # a time-limit episode: its start
    assert video.shown_steps(spec, 2, FPS) == range(301 - CLIP, 301)  # a failure: its end
    assert video.shown_steps(spec, 3, FPS) == range(21)  # shorter than a clip: whole
    job = VideoJob("CartPole-v1", None, FPS, (spec,), FPS)
    assert job.frames() == 500 + CLIP + CLIP + 21 + 4 * CARD


def test_videos_play_in_real_time_at_any_frame_rate():
    half = video.Timing(25, 50)  # every other step of a 50 Hz env
    assert [half.frames_of(step) for step in range(6)] == [1, 0, 1, 0, 1, 0] and half.card_frames == 25
    three_fifths = video.Timing(30, 50)
    assert sum(three_fifths.frames_of(step) for step in range(500)) == 300 and three_fifths.frames_of(0) == 1
    double = video.Timing(100, 50)
    assert [double.frames_of(step) for step in range(3)] == [2, 2, 2]
    assert video.env_fps("CartPole-v1") == 50
    spec = VideoSpec("x.mp4", "a", (Episode(1, (0,) * 499, 499.0, False),), full_episodes=1)
    assert VideoJob("CartPole-v1", None, 25, (spec,), 50).frames() == 250 + 25  # 10 s, and a 1 s card


def test_replayed_episodes_match_the_played_ones_and_clips_are_captioned(tmp_path):
    episodes = (played(7, balance, max_steps=150), played(8, balance, max_steps=150), played(9, lambda o: 0))
    assert [e.total for e in episodes][:2] == [150.0, 150.0] and episodes[2].terminated
    spec = VideoSpec(str(tmp_path / "v.mp4"), "trained agent", episodes, full_episodes=1)
    returns = video.render_video(spec, "CartPole-v1", 150, TIMING)
    assert returns == [e.total for e in episodes]  # the same actions in the same seeded env
    reader = imageio.get_reader(spec.path)
    count, second = 0, None
    for count, frame in enumerate(reader, start=1):
        if count == 151 + CARD + 1:  # the first frame of the second episode: a clip of its start
            second = frame
    reader.close()
    assert count == VideoJob("CartPole-v1", 150, FPS, (spec,), FPS).frames()
    assert second.shape == (400, 600, 3)
    assert second[:video.CAPTION_HEIGHT].mean() < 80 < second[200:].mean()


def test_a_replay_that_differs_is_reported(tmp_path, capsys):
    episode = played(7, balance, max_steps=60)
    wrong = Episode(episode.seed, episode.actions, episode.total + 1, False)
    spec = VideoSpec(str(tmp_path / "v.mp4"), "", (wrong,), 1)
    assert video.render_video(spec, "CartPole-v1", 60, TIMING) == [episode.total]
    assert "replayed to return 60, not the 61" in capsys.readouterr().err


def test_the_renderer_process_writes_every_video_and_reports_its_frames(tmp_path):
    job = VideoJob("CartPole-v1", 40, 25, (
        VideoSpec(str(tmp_path / "a.mp4"), "trained agent", (played(1, balance, 40), played(2, balance, 40)), 1),
        VideoSpec(str(tmp_path / "b.mp4"), "random agent", (played(3, lambda o: 0),), 1)), 50)
    seen = []
    process = video.start_job(job, lambda done, total: seen.append((done, total)))
    assert process.wait() is None
    assert os.path.getsize(tmp_path / "a.mp4") > 1000 and os.path.getsize(tmp_path / "b.mp4") > 1000
    assert seen and seen[-1] == (job.frames(), job.frames()) and process.seconds > 0
    assert 20 < process.peak_rss_mb < 400  # its own memory, not the pages a fork shares with its parent
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_a_failing_renderer_says_why_in_one_line(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    job = VideoJob("CartPole-v1", 40, FPS, (VideoSpec(str(blocked / "v.mp4"), "", (played(1, balance, 40),), 1),))
    problem = video.start_job(job).wait()
    assert problem is not None and problem.startswith("error: ") and "\n" not in problem


@pytest.mark.skipif(sys.platform != "linux", reason="the renderer's imports are checked on Linux")
def test_the_renderer_never_imports_tensorflow():
    import subprocess

    code = "import sys, dqn_cartpole.report.video; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
           "('tensorflow', 'tf_agents')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_the_plotter_process_says_why_it_failed(tmp_path):
    from dqn_cartpole.report.plotter import start_plotter

    lines = []
    problem = start_plotter(str(tmp_path / "no-run"), lines.append).wait()
    assert problem is not None and problem.startswith("error: ") and lines == []


def test_children_given_no_work_exit_at_the_end_of_their_stdin():
    from dqn_cartpole.report.plotter import start_plotter

    for child in (start_plotter(), video.VideoProcess()):
        child.close(timeout_s=60)
        assert child.process.returncode == 0 and child.wait() is None


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_the_frames_taken_from_the_surface_are_gymnasiums_own(env_id):
    """`surface_frames` takes each frame from the renderer's surface (BGRX, as ffmpeg gets it) instead of
    gymnasium's slow copy: the same pixels, and gymnasium's own rendering is untouched outside the block."""
    def frames(take) -> list:
        env = make_gymnasium(env_id, "rgb_array", None)
        try:
            env.reset(seed=4)
            return [take(env) for step in range(3) if env.step(step % 2) is not None]
        finally:
            env.close()

    expected = frames(lambda env: env.render())
    with video.surface_frames() as grab:
        taken = frames(grab)
    for frame, own in zip(taken, expected):
        assert frame.shape == own.shape[:2] + (4,) and frame.flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(frame[..., 2::-1], own)
    assert frames(lambda env: env.render())[0].shape == expected[0].shape  # gymnasium's own again after the block


def test_a_caption_set_glyph_by_glyph_is_the_caption_drawn_whole():
    frame = np.zeros((400, 600, 4), np.uint8)
    head, tail = "trained agent - episode 2/3   return ", "487   (first 2 s)"
    drawn = video.caption(frame, head, tail)[:video.CAPTION_HEIGHT, :, 2::-1]
    np.testing.assert_array_equal(drawn, video.caption_strip(600, head + tail))
