"""Small things a new user trips on in the first hour (issue 30), each checked in-process: a misspelled command, the
sweep's progress in a log, record's frame rate, and what the docs say of the videos."""

import io
import os
import re
import subprocess
from types import SimpleNamespace

import pytest

from helpers import REPO

from dqn_cartpole.cli.main import build_parser, main
from dqn_cartpole.cli.single_process import record_fps
from dqn_cartpole.config import Config
from dqn_cartpole.console.progress import PlainCounter, counter


@pytest.mark.parametrize("args, needle", [
    (["trian"], "invalid choice: 'trian': did you mean 'train'? (choose from 'train', 'evaluate'"),
    (["train", "--topology", "locl"], "invalid choice: 'locl': did you mean 'local'? (choose from 'single', 'local', 'ray')"),
    (["xyzzy"], "invalid choice: 'xyzzy' (choose from 'train'"),  # nothing near: no guess
])
def test_a_misspelled_choice_gets_the_nearest_one(capsys, args, needle):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1, err


def test_the_sweep_progress_in_a_log_is_lines_not_carriage_returns(monkeypatch):
    from dqn_cartpole.experiments import sweep

    log = io.StringIO()  # not a terminal, as a log file or a pipe
    monkeypatch.setattr("sys.stderr", log)
    bar = sweep._progress_bar(SimpleNamespace(name="s", members=[SimpleNamespace(num_iterations=100)] * 2), True)
    assert isinstance(bar, PlainCounter)
    for done in (0, 0, 50, 200):
        bar.n = done
        bar.set_postfix_str(f"{done // 100}/2 runs done, 0 failed", refresh=False)
        bar.refresh()
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("sweep s: 0/200 it [") and lines[-1].startswith("sweep s: 200/200 it [")
    assert lines[-1].endswith(", 2/2 runs done, 0 failed]") and len(lines) == 2  # 50 came within 5 s: no line
    quiet = io.StringIO()
    counter(10, "x", enabled=False, stream=quiet).close()
    assert quiet.getvalue() == ""


def test_record_uses_the_frame_rate_of_the_training_videos(tmp_path, monkeypatch, capsys):
    from dqn_cartpole.report import video

    asked = []
    monkeypatch.setattr(video, "record_video", lambda act, env_id, path, episodes, fps, *_: asked.append(fps) or [9.0])
    assert main(["record", "--random", "-o", str(tmp_path / "r.mp4")]) == 0 and asked == [25]
    assert build_parser().parse_args(["record", "--random"]).fps is None
    assert record_fps(None) == Config().video.fps == 25  # as train's videos: CartPole's 50 steps/s, every other one
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("video:\n  fps: 50\n")
    assert record_fps(str(run)) == 50  # a run's own rate


def test_the_docs_name_the_profile_ffmpeg_reports(smoke_run):
    """docs/report.md says which H.264 profile the videos are: what ffmpeg reads in the smoke run's video."""
    import imageio_ffmpeg

    video = os.path.join(smoke_run[0], "videos", "trained-agent.mp4")
    probe = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", video], capture_output=True,
                           text=True, timeout=60)
    profile = re.search(r"Video: h264 \(([^)]+)\)", probe.stderr).group(1)
    with open(os.path.join(REPO, "docs", "report.md"), encoding="utf-8") as handle:
        docs = handle.read()
    assert profile == "Constrained Baseline" and f"H.264 {profile} profile" in docs
