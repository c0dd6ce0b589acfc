"""report.html: built from the run folder alone, self-contained, and working in a real browser."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from browser import find_chromium, probe_page, screenshot
from helpers import REPO

from dqn_cartpole.report.html import Section, render_collection_page, write_page

ARTIFACTS = os.path.join(tempfile.gettempdir(), "dqn_cartpole-test-artifacts")
LINKS = re.compile(r'(?:src|href)="([^"]+)"')


def report_of(run_dir: str) -> str:
    with open(os.path.join(run_dir, "report.html"), encoding="utf-8") as handle:
        return handle.read()


def test_train_writes_a_self_contained_report(smoke_run, tmp_path):
    run_dir, result = smoke_run
    page = report_of(run_dir)
    assert "report.html" in result.stdout
    targets = LINKS.findall(page)
    assert not [t for t in targets if "://" in t or t.startswith("/")], "absolute or network links"
    assert "<link" not in page and "<script" not in page  # inline CSS only, nothing fetched
    for name in ("plots/returns.png", "plots/loss.png", "plots/epsilon.png", "plots/q_values.png",
                 "videos/trained-agent.mp4", "videos/random-agent.mp4", "policy/best", "policy/final",
                 "checkpoints", "config.yaml"):
        assert name in targets, name
    moved = str(tmp_path / "copied-run")  # a copied (or unzipped) run folder keeps every link
    shutil.copytree(run_dir, moved, ignore=shutil.ignore_patterns("tensorboard"))
    assert all(os.path.exists(os.path.join(moved, t)) for t in targets)


def test_report_shows_outcome_evaluations_and_changed_config(smoke_run):
    run_dir, _ = smoke_run
    page = report_of(run_dir)
    outcome = re.search(r'<p class="outcome (solved|unsolved|unchecked)">([^<]+)</p>', page)
    assert outcome and outcome.group(2).startswith(("Solved at iteration", "Not solved", "No solve check ran"))
    for words in ("best average return", "final average return", "wall time", "tensorboard --logdir tensorboard",
                  "<video controls", "Trained agent (greedy), 2 episodes", "Random agent, 2 episodes"):
        assert words in page, words
    with open(os.path.join(run_dir, "eval_metrics.csv"), newline="") as handle:
        evaluations = list(csv.DictReader(handle))
    table = page.split("<h2>Evaluations</h2>", 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == len(evaluations) + 1  # the header, then one row per evaluation
    changed = re.findall(r'<tr class="changed"><td class="key">([^<]+)</td>', page)
    # smoke.yaml differs from configs/default.yaml in these (among others); the env id does not
    assert {"training.num_iterations", "network.fc_layer_params", "video.num_episodes"} <= set(changed)
    assert "env.id" not in changed


def test_report_command_never_imports_tensorflow(smoke_run):
    """What keeps `report` quick (a second or two, not TensorFlow's import): no TensorFlow, TF-Agents or Reverb. (No
    timing here: speed targets live in scripts/benchmark.py, and a timed test failed at load 20.)"""
    run_dir, _ = smoke_run
    before = os.path.getmtime(os.path.join(run_dir, "report.html"))
    code = (f"import sys\nfrom dqn_cartpole import cli\n"
            f"status = cli.main(['report', {run_dir!r}])\n"
            f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_agents', 'reverb'))\n"
            f"print(status, heavy)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""
    wrote, status_and_time = proc.stdout.splitlines()[0], proc.stdout.splitlines()[-1]
    assert wrote == f"wrote {os.path.join(run_dir, 'report.html')}"
    status, heavy = status_and_time.split(" ", 1)
    assert status == "0" and heavy == "[]", proc.stdout
    assert os.path.getmtime(os.path.join(run_dir, "report.html")) > before


def test_collection_page_for_other_commands(tmp_path):
    folder = tmp_path / "sweep"
    (folder / "runs" / "a").mkdir(parents=True)
    (folder / "returns.png").write_bytes(b"\x89PNG not really")
    (folder / "table.csv").write_text("run,best_return\nruns/a,500\n")
    page = render_collection_page(str(folder / "index.html"), "Sweep <lr>", [str(folder / "returns.png")],
                                  str(folder / "table.csv"), [("run a", str(folder / "runs" / "a"))])
    text = open(page, encoding="utf-8").read()
    assert "<title>Sweep &lt;lr&gt;</title>" in text
    assert '<img src="returns.png"' in text and '<a href="runs/a">run a</a>' in text
    assert "<tr><td>runs/a</td><td>500</td></tr>" in text
    write_page(str(folder / "plain.html"), "Plain", [Section("Notes", "<p>hello</p>")])
    assert "<h2>Notes</h2><p>hello</p>" in open(folder / "plain.html", encoding="utf-8").read()


@pytest.mark.skipif(find_chromium() is None, reason="no chromium or chromium-browser on PATH")
def test_report_in_a_real_browser(smoke_run, tmp_path, capsys):
    browser = find_chromium()
    run_dir, _ = smoke_run
    page = os.path.join(run_dir, "report.html")
    result = probe_page(browser, page, str(tmp_path / "profile"))
    assert len(result["images"]) == 4 and all(i["naturalWidth"] > 0 for i in result["images"]), result["images"]
    assert len(result["videos"]) == 2, result["videos"]
    for video in result["videos"]:
        assert video["readyState"] >= 2 and video["duration"] > 0 and video["width"] == 600, video
    assert result["errors"] == [] and result["console"] == [], result

    # The probe itself must notice a broken image, a missing video and a script error.
    broken = os.path.join(run_dir, "broken.html")
    with open(broken, "w", encoding="utf-8") as handle:
        handle.write(report_of(run_dir).replace("plots/loss.png", "plots/missing.png")
                     .replace("videos/random-agent.mp4", "videos/missing.mp4")
                     .replace("</body>", "<script>notAFunction()</script></body>"))
    try:
        bad = probe_page(browser, broken, str(tmp_path / "profile"))
    finally:
        os.remove(broken)
    assert sorted(i["naturalWidth"] > 0 for i in bad["images"]) == [False, True, True, True]
    assert [v["readyState"] for v in bad["videos"]][1] < 2
    assert any("notAFunction" in e for e in bad["errors"]) and bad["console"]

    shot = screenshot(browser, page, os.path.join(run_dir, "report-screenshot.png"), str(tmp_path / "profile"))
    os.makedirs(ARTIFACTS, exist_ok=True)
    kept = shutil.copy(shot, os.path.join(ARTIFACTS, "report-screenshot.png"))
    with capsys.disabled():
        print(f"\nreport.html screenshot: {kept}")
