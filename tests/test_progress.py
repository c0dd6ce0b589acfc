"""The progress line: tqdm on a terminal; one plain line per state elsewhere, through training and the artifacts."""

from __future__ import annotations

import io

from dqn_cartpole.console.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_output_has_one_line_per_state_and_follows_the_artifacts():
    out = io.StringIO()
    progress = Progress(1000, stream=out, plain_every_s=3600)
    progress.update(100, 0.5, None)  # the first line comes at once
    progress.update(200, 0.4, None)  # within plain_every_s, nothing new to say
    progress.evaluated(500, 0.3, 92.5, 400)  # the evaluation beside the training (of iteration 400's weights)
    progress.evaluated(500, 0.3, 212.5, 500)  # then, before a checkpoint, the one of these weights
    progress.update(500, 0.3, 212.5)  # the loop's line: once for iteration 500, with the newest evaluation
    progress.update(500, 0.3, 212.5)  # the same state again: no second line
    progress.message("Solved at iteration 500")
    progress.evaluated(600, 0.2, 250.0, 600)  # the final evaluation: said before the artifacts
    progress.stage("Drawing the plots")
    progress.artifact_progress(25, 200)  # the first frames line comes at once
    progress.artifact_progress(50, 200)  # within plain_every_s
    progress.evaluated(600, 0.2, 300.0, 600)  # training is over: no training line after the artifacts start
    progress.artifact_progress(200, 200)  # done: always said
    progress.stage("Waiting for the videos")
    progress.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [line.split(" [")[0] for line in lines] == [
        "100/1000 it", "500/1000 it", "Solved at iteration 500", "600/1000 it", "Drawing the plots",
        "  videos: 25/200 frames rendered", "  videos: 200/200 frames rendered", "Waiting for the videos"]
    assert lines[1].endswith("loss 0.3, avg return 212.5 (it 500)]") and "92.5" not in out.getvalue()
    assert lines[3].endswith("loss 0.2, avg return 250.0 (it 600)]")


def test_an_evaluation_names_the_iteration_it_evaluated():
    """An evaluation beside the training comes in an interval later: the line says whose return it is."""
    out = io.StringIO()
    progress = Progress(1000, stream=out, plain_every_s=3600)
    progress.evaluated(200, 0.5, 40.0, 100)
    progress.update(200, 0.5, 40.0)
    progress.update(300, 0.4, 40.0)  # not due: within plain_every_s
    progress.close()  # the newest state, said at the end
    lines = out.getvalue().splitlines()
    assert [line.split(" [")[0] for line in lines] == ["200/1000 it", "300/1000 it"]
    assert all(line.endswith("avg return 40.0 (it 100)]") for line in lines)


def test_a_terminal_gets_a_redrawn_bar_with_the_artifacts_on_it():
    out = Terminal()
    progress = Progress(1000, stream=out)
    progress.update(100, 0.5, None)
    progress.evaluated(300, 0.25, 42.0, 200)
    progress.message("a note above the bar")
    progress.stage("Drawing the plots")
    progress.artifact_progress(50, 200)
    progress.close()
    text = out.getvalue()
    assert "\r" in text and "300/1000" in text and "loss 0.25, avg return 42.0 (it 200)" in text
    assert "a note above the bar\n" in text
    assert "Drawing the plots | videos 50/200 frames" in text


def test_quiet_prints_messages_only():
    out = Terminal()
    progress = Progress(1000, stream=out, enabled=False)
    progress.update(100, 0.5, None)
    progress.stage("Drawing the plots")
    progress.artifact_progress(50, 200)
    progress.message("Solved")
    progress.close()
    assert out.getvalue() == "Solved\n"


def test_a_terminal_that_reports_no_width_still_gets_a_line(monkeypatch):
    import os as os_module

    out = Terminal()
    monkeypatch.setattr(Terminal, "fileno", lambda self: 2, raising=False)
    monkeypatch.setattr(os_module, "get_terminal_size", lambda fd: os_module.terminal_size((0, 0)))
    progress = Progress(1000, stream=out)
    progress.update(300, 0.25, 42.0)
    progress.close()
    assert "300/1000" in out.getvalue()


def test_a_run_says_what_it_starts_before_tensorflow_is_imported():
    # `train` prints its first line from training.run, then imports TensorFlow (about 3 s): that module and its
    # imports must stay light, or the user stares at a silent terminal.
    import subprocess
    import sys

    code = ("import sys, dqn_cartpole.training.run, dqn_cartpole.cli.main; "
            "assert 'tensorflow' not in sys.modules, 'TensorFlow imported before the first line'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
