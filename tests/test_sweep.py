"""`sweep` and `compare` end to end, as a user runs them: 2 seeds x 2 learning rates of the smoke config,
two runs at a time; then the same command again (nothing re-runs), compare's table and plot, and
Ctrl-C in the middle of a sweep followed by its continuation.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from browser import find_chromium, probe_page
from helpers import CONFIGS, REPO, run_cli

from dqn_cartpole.run_folder import read_run

SMOKE = os.path.join(CONFIGS, "smoke.yaml")
LRS = (0.001, 0.002)


def sweep_args(root, name="s", seeds="0-1", extra=()):
    return ["sweep", "--config", SMOKE, "--seeds", seeds, "--grid", "agent.learning_rate=[1e-3,2e-3]",
            "--jobs", "2", "--name", name, "--set", f"output.root={root}", "--set", "video.enabled=false",
            "--quiet", *extra]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    start = time.time()
    proc = run_cli(*sweep_args(root), timeout=240)
    return str(root / "sweeps" / "s"), proc, time.time() - start


def test_every_grid_point_and_seed_is_a_finished_run_folder(sweep):
    folder, proc, wall_s = sweep
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "4 finished now, 0 failed" in proc.stdout
    runs = {name: read_run(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
            if name not in ("sweep.yaml", "logs", "members.csv", "report.html")}
    assert sorted(runs) == ["learning_rate=1e-3__s0", "learning_rate=1e-3__s1", "learning_rate=2e-3__s0",
                            "learning_rate=2e-3__s1"]
    for name, run in runs.items():
        assert run.get("exit_status") == 0 and run.eval_rows
        assert run.config["agent"]["learning_rate"] == (0.001 if "1e-3" in name else 0.002)
        assert run.config["training"]["seed"] == int(name[-1])
    assert os.path.isfile(os.path.join(folder, "sweep.yaml"))
    assert wall_s < 200


def test_running_it_again_skips_the_finished_runs(sweep):
    folder, _, _ = sweep
    summaries = [os.path.join(folder, n, "summary.json") for n in os.listdir(folder) if n.startswith("learning")]
    before = [os.path.getmtime(p) for p in summaries]
    proc = run_cli(*sweep_args(os.path.dirname(os.path.dirname(folder))), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "4 already done, 0 finished now" in proc.stdout
    assert [os.path.getmtime(p) for p in summaries] == before


def test_compare_groups_by_learning_rate_with_confidence_intervals(sweep, tmp_path):
    folder, _, _ = sweep
    out = tmp_path / "cmp"
    code = ("import sys; from dqn_cartpole.cli import main; status = main(sys.argv[1:]); "
            "assert 'tensorflow' not in sys.modules, 'compare imported TensorFlow'; sys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", code, "compare", os.path.join(folder, "*"), "--output", str(out)],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(os.listdir(out)) == ["report.html", "returns.png", "table.csv", "table.md"]
    rows = [line for line in (out / "table.md").read_text().splitlines() if line.startswith("| agent.")]
    assert [r.split(" | ")[0] for r in rows] == ["| agent.learning_rate=0.001", "| agent.learning_rate=0.002"]
    for row in rows:
        cells = row.strip("| ").split(" | ")
        assert cells[1] == "2" and cells[2].endswith("/2 (" + cells[2].split("(")[1])
        assert "[" in cells[6] or cells[6].count(".") == 1  # IQM [low, high] unless both seeds agree exactly
    header = (out / "table.csv").read_text().splitlines()[0]
    assert "best return (IQM) ci_low" in header and "solved fraction" in header
    assert rows[0] in proc.stdout
    assert_page_links_resolve(str(out / "report.html"), expected_links=4)
    browser = find_chromium()
    if browser:  # CI always has one (.ci/run installs it)
        result = probe_page(browser, str(out / "report.html"), str(tmp_path / "profile"))
        assert [i["naturalWidth"] > 0 for i in result["images"]] == [True], result["images"]
        assert result["errors"] == [] and result["console"] == [], result


def assert_page_links_resolve(page: str, expected_links: int) -> None:
    """Every relative href/src of a page points at a file next to it; there are `expected_links` run links."""
    text = open(page, encoding="utf-8").read()
    targets = re.findall(r'(?:href|src)="([^"#:]+)"', text)
    assert targets and all(os.path.exists(os.path.join(os.path.dirname(page), t)) for t in targets), targets
    assert len([t for t in targets if t.endswith("report.html")]) == expected_links


def test_the_sweep_has_a_page_of_its_members(sweep):
    folder, _, _ = sweep
    rows = (open(os.path.join(folder, "members.csv")).read().splitlines())
    assert rows[0].startswith("run,state,") and len(rows) == 5 and all(",done," in r for r in rows[1:])
    assert_page_links_resolve(os.path.join(folder, "report.html"), expected_links=4)


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_ctrl_c_stops_every_run_with_a_checkpoint_and_the_sweep_continues(tmp_path):
    # Long enough (several seconds of training) that the Ctrl-C lands while both runs train.
    args = sweep_args(tmp_path, name="c", seeds="0", extra=("--set", "training.num_iterations=5000"))
    env = dict(os.environ, PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy")
    parent = subprocess.Popen([sys.executable, "-m", "dqn_cartpole", *args], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = tmp_path / "sweeps" / "c"
    try:
        started = _wait_for(lambda: all((folder / n / "train_metrics.csv").exists() and
                                        len((folder / n / "train_metrics.csv").read_text().splitlines()) > 1
                                        for n in ("learning_rate=1e-3__s0", "learning_rate=2e-3__s0")), 120)
        assert started, "the runs never started training"
        children = psutil.Process(parent.pid).children(recursive=True)
        assert len(children) >= 2
        parent.send_signal(signal.SIGINT)
        out, err = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert parent.returncode == 130, err[-2000:]
    assert "Continue the sweep" in out and "--name c" in out
    # The training children are gone when the parent exits; multiprocessing's resource tracker (from the
    # config check) reads EOF when the parent exits and follows within moments.
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not [(c.pid, c.cmdline()) for c in alive if c.status() != psutil.STATUS_ZOMBIE]
    for name in ("learning_rate=1e-3__s0", "learning_rate=2e-3__s0"):
        run = read_run(str(folder / name))
        assert run.get("exit_status") == 130 and run.get("iterations") < 5000
        assert os.listdir(folder / name / "checkpoints")

    proc = run_cli(*args, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for name in ("learning_rate=1e-3__s0", "learning_rate=2e-3__s0"):
        run = read_run(str(folder / name))
        assert run.get("exit_status") == 0 and run.get("resumed_from")
