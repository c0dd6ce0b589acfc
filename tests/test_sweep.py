"""`sweep` and `compare` end to end, as a user runs them: 2 seeds x 2 learning rates of C51 on the smoke config, two
runs at a time, stopped by Ctrl-C while the first two train, then continued by the same command with `--ray` on a Ray
instance it starts here (the stopped runs resume on Ray's workers, the others start there; their folders come back
into the sweep's). One sweep serves every test; then the same command again, locally (nothing re-runs: the folder
is a local sweep's), compare's table and plot, and the sweep's page.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from browser import find_chromium, probe_page
from helpers import CONFIGS, REPO, cli_command, cli_env, run_cli

from dqn_cartpole.run_folder import read_run

SMOKE = os.path.join(CONFIGS, "smoke.yaml")
LRS = (0.001, 0.002)


def sweep_args(root, name="s", seeds="0-1", extra=()):
    """The sweep trains C51 (smoke's settings otherwise; its td_loss is DQN's squared): sweep, its Ray continuation
    and compare carry C51's runs as they do DQN's (test_experiments_ray.py's and test_experiments_reuse.py's)."""
    return ["sweep", "--config", SMOKE, "--seeds", seeds, "--grid", "agent.learning_rate=[1e-3,2e-3]",
            "--jobs", "2", "--name", name, "--set", f"output.root={root}", "--set", "video.enabled=false",
            "--set", "agent.kind=c51", "--set", "agent.td_loss=huber", "--quiet", *extra]


FIRST = ("learning_rate=1e-3__s0", "learning_rate=1e-3__s1")  # the two runs --jobs 2 starts first
ITERATIONS = 3000  # long enough that the Ctrl-C lands while both first runs train


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def _training(folder) -> bool:
    return all((folder / n / "train_metrics.csv").exists() and
               len((folder / n / "train_metrics.csv").read_text().splitlines()) > 1 for n in FIRST)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The sweep, stopped by Ctrl-C while its first two runs train, then run to its end by the same command (one
    sweep serves every test here): (folder, what the Ctrl-C left, the continuing command)."""
    root = tmp_path_factory.mktemp("sweeps")
    args = sweep_args(root, extra=("--set", f"training.num_iterations={ITERATIONS}"))
    env = dict(os.environ, PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy")
    parent = subprocess.Popen([sys.executable, "-m", "dqn_cartpole", *args], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = root / "sweeps" / "s"
    try:
        started = _wait_for(lambda: _training(folder), 240)
        children = psutil.Process(parent.pid).children(recursive=True) if started else []
        parent.send_signal(signal.SIGINT)
        out, err = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    # The training children are gone when the parent exits; multiprocessing's resource tracker (from the
    # config check) reads EOF when the parent exits and follows within moments.
    _, alive = psutil.wait_procs(children, timeout=15)
    stopped = {"started": started, "status": parent.returncode, "out": out, "err": err, "children": children,
               "alive": [(c.pid, c.cmdline()) for c in alive if c.status() != psutil.STATUS_ZOMBIE],
               "runs": {name: read_run(str(folder / name)) for name in FIRST if (folder / name).is_dir()},
               "others": [n for n in os.listdir(folder) if n.startswith("learning_rate=2e-3")]}
    return folder, stopped, continue_on_ray(args, root / "home")


def continue_on_ray(args: list, home) -> SimpleNamespace:
    """The same command with --ray, on a Ray instance it starts on this machine, with `home` as HOME: the finished
    process, the processes of that instance left after it (they name its session folder, which ends with the
    driver's pid), and what it left in `home`."""
    os.makedirs(home, exist_ok=True)
    env = cli_env(HOME=str(home))  # RAY_ADDRESS=local (conftest): a private instance, whatever runs on the machine
    driver = subprocess.Popen(cli_command(*args, "--ray"), cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        out, err = driver.communicate(timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    session = f"_{driver.pid}/"
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if session in " ".join(p.info["cmdline"] or [])]
    in_home = [os.path.relpath(os.path.join(d, f), home) for d, _, files in os.walk(home) for f in files]
    return SimpleNamespace(returncode=driver.returncode, stdout=out, stderr=err, left=left, in_home=in_home)


def test_ctrl_c_stops_every_run_with_a_checkpoint(sweep):
    _, stopped, _ = sweep
    assert stopped["started"], "the runs never started training"
    assert stopped["status"] == 130, stopped["err"][-2000:]
    assert "Continue the sweep" in stopped["out"] and "--name s" in stopped["out"]
    assert len(stopped["children"]) >= 2 and not stopped["alive"]
    assert sorted(stopped["runs"]) == sorted(FIRST) and not stopped["others"]  # the queued runs never started
    for run in stopped["runs"].values():
        assert run.get("exit_status") == 130 and run.get("iterations") < ITERATIONS
        assert os.listdir(os.path.join(run.root, "checkpoints"))


def test_the_same_command_on_ray_resumes_the_stopped_runs_on_its_workers_and_runs_the_rest(sweep):
    folder, _, proc = sweep
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "started a local Ray instance" in proc.stdout and "on Ray" in proc.stdout
    assert "0 already done, 4 finished now, 0 failed" in proc.stdout
    assert not proc.left, f"the local Ray instance outlived its command: {proc.left}"
    # Its token was the command's own (a 0600 file, removed): nothing under HOME, no ~/.ray/auth_token.
    assert not any(path.startswith(".ray") for path in proc.in_home), proc.in_home
    for name in FIRST:  # each travelled to a Ray worker with its checkpoints and resumed there
        run = read_run(str(folder / name))
        assert str(run.get("resumed_from")).startswith(str(folder / name) + os.sep) and run.get("run_dir") == str(
            folder / name)
        log = (folder / "logs" / f"{name}.log").read_text()
        assert "--resume" in log.split("# attempt 1 on ", 1)[1]  # after the local run's own log
    for name in os.listdir(folder):
        if name.startswith("learning_rate=2e-3"):
            assert not read_run(str(folder / name)).get("resumed_from")


def test_every_grid_point_and_seed_is_a_finished_run_folder(sweep):
    folder, _, _ = sweep
    folder = str(folder)
    runs = {name: read_run(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
            if name not in ("sweep.yaml", "logs", "members.csv", "report.html")}
    assert sorted(runs) == ["learning_rate=1e-3__s0", "learning_rate=1e-3__s1", "learning_rate=2e-3__s0",
                            "learning_rate=2e-3__s1"]
    for name, run in runs.items():
        assert run.get("exit_status") == 0 and run.eval_rows and run.get("iterations") == ITERATIONS
        assert run.config["agent"]["learning_rate"] == (0.001 if "1e-3" in name else 0.002)
        assert run.config["training"]["seed"] == int(name[-1])
    assert os.path.isfile(os.path.join(folder, "sweep.yaml"))


def test_running_it_again_skips_the_finished_runs(sweep):
    folder, _, _ = sweep
    folder = str(folder)
    summaries = [os.path.join(folder, n, "summary.json") for n in os.listdir(folder) if n.startswith("learning")]
    before = [os.path.getmtime(p) for p in summaries]
    root = os.path.dirname(os.path.dirname(folder))
    proc = run_cli(*sweep_args(root, extra=("--set", f"training.num_iterations={ITERATIONS}")), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "4 already done, 0 finished now" in proc.stdout
    assert [os.path.getmtime(p) for p in summaries] == before


def test_compare_groups_by_learning_rate_with_confidence_intervals(sweep, tmp_path):
    folder, _, _ = sweep
    folder = str(folder)
    out = tmp_path / "cmp"
    code = ("import sys; from dqn_cartpole.cli import main; status = main(sys.argv[1:]); "
            "assert 'tensorflow' not in sys.modules, 'compare imported TensorFlow'; sys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", code, "compare", os.path.join(folder, "*"), "--output", str(out)],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(os.listdir(out)) == ["profile.png", "report.html", "returns.png", "solved.png", "table.csv",
                                       "table.md"]
    rows = [line for line in (out / "table.md").read_text().splitlines() if line.startswith("| agent.")]
    assert [r.split(" | ")[0] for r in rows] == ["| agent.learning_rate=0.001", "| agent.learning_rate=0.002"]
    for name in [n for n in os.listdir(folder) if n.startswith("learning_rate=")]:  # C51 runs, with their atoms
        assert read_run(os.path.join(folder, name)).config["agent"]["kind"] == "c51"
        assert os.path.getsize(os.path.join(folder, name, "plots", "atoms.png")) > 0, name
    for row in rows:
        cells = row.strip("| ").split(" | ")
        # the smoke config checks for no solve (stop_when_solved: false): no "0/2 solved" for runs that never checked
        assert cells[1] == "2" and cells[2] == "no solve check (stop_when_solved: false)"
        assert "[" in cells[6] or cells[6].count(".") == 1  # IQM [low, high] unless both seeds agree exactly
    header = (out / "table.csv").read_text().splitlines()[0]
    assert "best evaluation (IQM) ci_low" in header and "solve checked,solved fraction" in header
    assert "agent.learning_rate=0.001" in proc.stdout and f"page: {out / 'report.html'}" in proc.stdout
    verdicts = " ".join(proc.stdout.split())  # (the verdict lines wrap where their words end)
    assert "- agent.learning_rate=0.002 vs agent.learning_rate=0.001: final policy score: " in verdicts
    assert_page_links_resolve(str(out / "report.html"), expected_links=4)
    browser = find_chromium()
    if browser:  # CI always has one (.ci/run installs it)
        result = probe_page(browser, str(out / "report.html"), str(tmp_path / "profile"))
        assert [i["naturalWidth"] > 0 for i in result["images"]] == [True] * 3, result["images"]
        assert result["errors"] == [] and result["console"] == [], result


def assert_page_links_resolve(page: str, expected_links: int) -> None:
    """Every relative href/src of a page points at a file next to it; there are `expected_links` run links."""
    text = open(page, encoding="utf-8").read()
    targets = re.findall(r'(?:href|src)="([^"#:]+)"', text)
    assert targets and all(os.path.exists(os.path.join(os.path.dirname(page), t)) for t in targets), targets
    assert len([t for t in targets if t.endswith("report.html")]) == expected_links


def test_the_sweep_has_a_page_of_its_members(sweep):
    folder, _, _ = sweep
    folder = str(folder)
    rows = (open(os.path.join(folder, "members.csv")).read().splitlines())
    assert rows[0].startswith("run,state,") and len(rows) == 5 and all(",done," in r for r in rows[1:])
    assert_page_links_resolve(os.path.join(folder, "report.html"), expected_links=4)
