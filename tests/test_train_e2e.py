"""An end-to-end train on configs/smoke.yaml, then every artifact checked on disk.

The train is a `python -m dqn_cartpole` process (conftest's `smoke_run`), as a user runs it; the commands that read
its folder afterwards (evaluate, record, plot) run in this process through the CLI's own `main`, which saves each
one TensorFlow's import in a new process (a saved policy loading in a fresh process is tests/test_resume.py's)."""

from __future__ import annotations

import csv
import json
import glob
import os
import re

import imageio.v2 as imageio
import matplotlib.image as mpimg
import numpy as np
import pytest

from helpers import CONFIGS, run_cli

from dqn_cartpole.cli.main import main
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS, TRAIN_COLUMNS


def rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_console_is_clean_and_summarises(smoke_run):
    run_dir, result = smoke_run
    noise = [l for l in result.stderr.splitlines() if any(w in l for w in
             ("tensorflow/", "ALSA", "absl", "WARNING", "Traceback", "unmaintained", "cuda"))]
    assert noise == []
    assert "best average return" in result.stdout and "final average return" in result.stdout
    assert "Done in" in result.stdout
    assert run_dir in result.stdout
    # policy/final and policy/best say what they are, with their scores: smoke trains on (no early stop), so its
    # final policy is the last step's, scored over evaluation.final_episodes fresh episodes
    assert re.search(r"policy/final +-?[0-9.]+ over 100 episodes, iteration 300: the weights at the last step",
                     result.stdout), result.stdout
    assert re.search(r"policy/best +-?[0-9.]+ over 3 episodes, iteration \d+: the weights of the best periodic "
                     r"evaluation", result.stdout), result.stdout
    with open(os.path.join(run_dir, "summary.json")) as handle:
        summary = json.load(handle)
    assert summary["final_policy_episodes"] == 100 and summary["policies"]["final"]["episodes"] == 100
    assert summary["policies"]["final"]["average_return"] == summary["final_policy_return"]


def test_config_is_fully_resolved(smoke_run):
    import yaml

    run_dir, _ = smoke_run
    with open(os.path.join(run_dir, "config.yaml")) as handle:
        saved = yaml.safe_load(handle)
    assert set(saved) == {"env", "network", "agent", "replay", "training", "collection", "distributed", "evaluation",
                         "video", "output", "tracking"}
    assert saved["tracking"]["backend"] is None  # nothing is tracked unless asked (--track)
    assert saved["training"]["num_iterations"] == 300
    assert saved["agent"]["td_loss"] == "squared"  # a default, written out


def test_metrics_csv_columns_and_rows(smoke_run):
    run_dir, _ = smoke_run
    train = rows(os.path.join(run_dir, "train_metrics.csv"))
    assert list(train[0].keys())[:len(TRAIN_COLUMNS)] == list(TRAIN_COLUMNS)
    assert [int(r["train_step"]) for r in train] == [50, 100, 150, 200, 250, 300]
    assert all(float(r["loss"]) >= 0 for r in train)
    env_steps = [int(r["env_steps"]) for r in train]
    assert env_steps == sorted(env_steps) and env_steps[0] >= 64
    evals = rows(os.path.join(run_dir, "eval_metrics.csv"))
    assert list(evals[0].keys())[:len(EVAL_COLUMNS)] == list(EVAL_COLUMNS)
    assert [int(r["train_step"]) for r in evals] == [0, 100, 200, 300]
    assert all(0 < float(r["average_return"]) <= 500 for r in evals)
    assert all(float(r["average_episode_length"]) > 0 for r in evals)
    assert all(float(r["min_return"]) <= float(r["average_return"]) <= float(r["max_return"]) for r in evals)
    assert all(float(r["std_return"]) >= 0 for r in evals)
    max_discounted = (1 - 0.99 ** 500) / (1 - 0.99)  # smoke.yaml's gamma, CartPole-v1's 500 steps
    assert all(0 < float(r["average_discounted_return"]) <= min(float(r["average_return"]), max_discounted)
               for r in evals)
    assert all(r["mean_max_q"] != "" for r in train)
    assert len({r["mean_max_q"] for r in train}) > 1  # the probe follows the network as it trains


def test_plots_open(smoke_run):
    run_dir, _ = smoke_run
    for name in ("returns.png", "loss.png", "epsilon.png", "q_values.png"):
        image = mpimg.imread(os.path.join(run_dir, "plots", name))
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    # DQN learns only the expected return: no atoms figure (C51's: test_replay.py), and the page says nothing of it.
    assert not os.path.exists(os.path.join(run_dir, "atoms.json"))
    assert not os.path.exists(os.path.join(run_dir, "plots", "atoms.png"))
    page = open(os.path.join(run_dir, "report.html"), encoding="utf-8").read()
    assert "atoms" not in page and "No plots yet" not in page


def test_videos_decode_with_rendered_frame_size(smoke_run):
    run_dir, _ = smoke_run
    for name in ("trained-agent.mp4", "random-agent.mp4"):
        reader = imageio.get_reader(os.path.join(run_dir, "videos", name))
        frames = [frame for frame in reader]
        reader.close()
        # smoke.yaml: 2 episodes of at least 9 steps each, and a 1 s title card (50 frames) after each
        assert len(frames) >= 2 * (9 + 50)
        assert frames[0].shape == (400, 600, 3)
        assert frames[0].dtype == np.uint8 and frames[0].std() > 0
        assert frames[0][:20].mean() < 80 < frames[0][200:].mean()  # the dark caption strip over the white scene
        assert frames[-1].mean() < 80  # ends on the title card of the last episode


def test_videos_are_browser_safe_h264(smoke_run):
    import subprocess

    import imageio_ffmpeg

    run_dir, _ = smoke_run
    for name in ("trained-agent.mp4", "random-agent.mp4"):
        probe = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i",
                                os.path.join(run_dir, "videos", name)], capture_output=True, text=True, timeout=60)
        stream = [line for line in probe.stderr.splitlines() if "Video:" in line]
        # x264's ultrafast preset writes Constrained Baseline (no CABAC, no B-frames): a subset of Main that
        # every browser decodes too. High, or 4:4:4 chroma, would not play everywhere.
        assert stream and ("h264 (Main)" in stream[0] or "h264 (Constrained Baseline)" in stream[0]), probe.stderr
        assert "yuv420p" in stream[0], probe.stderr


def test_summary_says_where_the_seconds_went(smoke_run):
    import json

    run_dir, _ = smoke_run
    with open(os.path.join(run_dir, "summary.json")) as handle:
        summary = json.load(handle)
    phases = summary["phases"]  # names as in dqn_cartpole.training.phases (not imported: it brings TensorFlow)
    assert list(phases)[:4] == ["start-up and imports", "build", "initial collect", "first evaluation"]
    assert {"tracing and XLA", "loop", "evaluations", "policy export", "checkpoints", "videos", "plots"} <= set(phases)
    assert all(seconds >= 0 for seconds in phases.values())
    # Each second counted once: a phase counted twice, or one left out, is seconds. The statements between phases
    # are charged to none: up to 0.15 s of a 19.6 s smoke run at load average 10 (within 0.1 s on a quiet machine).
    assert sum(phases.values()) == pytest.approx(summary["wall_s"], abs=max(0.1, 0.01 * summary["wall_s"]))
    assert summary["parallel"]["video encoder (another process)"] > 0
    assert 20 < summary["renderer_peak_rss_mb"] < 400 and 20 < summary["plotter_peak_rss_mb"] < 400  # own processes


def test_tensorboard_events_written(smoke_run):
    run_dir, _ = smoke_run
    assert glob.glob(os.path.join(run_dir, "tensorboard", "events.out.tfevents.*"))


def test_evaluate_command(smoke_run, capsys):
    run_dir, _ = smoke_run
    assert main(["evaluate", run_dir, "--episodes", "4"]) == 0
    out = capsys.readouterr().out
    for word in ("mean", "std", "min", "max", "4 greedy episodes"):
        assert word in out


def test_record_command_saved_and_random(smoke_run, tmp_path, capsys):
    run_dir, _ = smoke_run
    out = str(tmp_path / "agent.mp4")
    assert main(["record", run_dir, "--output", out, "--episodes", "1", "--fps", "30"]) == 0
    assert imageio.get_reader(out).get_meta_data()["fps"] == 30
    out_random = str(tmp_path / "random.mp4")
    assert main(["record", "--random", "--output", out_random]) == 0
    assert os.path.getsize(out_random) > 1000
    assert capsys.readouterr().out.startswith(f"wrote {out}: 1 episode(s), returns ")


def test_plot_command_redraws(smoke_run, capsys):
    run_dir, _ = smoke_run
    os.remove(os.path.join(run_dir, "plots", "returns.png"))
    assert main(["plot", run_dir]) == 0
    assert os.path.exists(os.path.join(run_dir, "plots", "returns.png"))
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"wrote {os.path.join(run_dir, 'report.html')}"


def test_existing_run_is_not_overwritten(smoke_run):
    run_dir, _ = smoke_run
    before = sorted(os.listdir(run_dir))
    result = run_cli("train", "--config", os.path.join(CONFIGS, "smoke.yaml"), "--output-dir", run_dir)
    assert result.returncode == 2
    assert "--overwrite" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert sorted(os.listdir(run_dir)) == before
