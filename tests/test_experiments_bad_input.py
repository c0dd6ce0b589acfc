"""Bad input to sweep, compare and tune: exit status 2, one `error:` line, no files created, no hang.

In-process through the CLI's `main` (none of these commands imports TensorFlow; tests/test_bad_input.py runs
the single-process commands' table as subprocesses).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import sys
import time
from types import SimpleNamespace

import pytest

from helpers import CONFIGS

from dqn_cartpole.cli.main import main

SMOKE = os.path.join(CONFIGS, "smoke.yaml")


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sweep(*extra):
    return ("sweep", "--config", SMOKE, "--set", "output.root={dir}/out", "--name", "x", *extra)


def tune(space_text, *extra):
    return ("tune", "--config", SMOKE, "--space", "{dir}/space.yaml", "--trials", "2", "--set",
            "output.root={dir}/out", *extra), space_text


GOOD_SPACE = "agent.learning_rate: {low: 1e-4, high: 1e-2, log: true}\n"
CASES = {
    "grid-not-a-list": (sweep("--grid", "agent.learning_rate=1e-3"), None, "expected a list of values"),
    "grid-no-equals": (sweep("--grid", "agent.learning_rate"), None, "expected section.key=[value"),
    "grid-unknown-key": (sweep("--grid", "agent.learnig_rate=[1,2]"), None, "unknown key 'agent.learnig_rate'"),
    "grid-bad-value": (sweep("--grid", "training.batch_size=[32,big]"), None, "expected an integer"),
    "sweep-empty-grid": (sweep("--grid", "agent.learning_rate=[]"), None, "the sweep would have no runs"),
    "sweep-empty-seeds": (sweep("--seeds", "4-1"), None, "is empty"),
    "sweep-zero-jobs": (sweep("--jobs", "0"), None, "--jobs: must be positive"),
    "sweep-different-grid": (sweep("--grid", "agent.n_step=[1,2]"), None, "asked for something else"),
    "compare-missing": (("compare", "{dir}/nothing"), None, "no such run or sweep folder"),
    "compare-no-runs": (("compare", "{dir}"), None, "no run folders there"),
    "compare-empty-glob": (("compare", "{dir}/runs-*"), None, "no run folders there"),
    "space-unknown-key": (*tune("agent.learnin_rate: {low: 1e-4, high: 1e-2}\n"), "did you mean 'agent.learning_rate'"),
    "space-bad-bound": (*tune("agent.gamma: {low: 0.9, high: 1.5}\n"), "agent.gamma: 1.5 is not a valid value"),
    "space-malformed": (*tune("agent.gamma: {low: 0.9\n"), "cannot read"),
    "tune-zero-trials": (*tune(GOOD_SPACE, "--trials", "0"), "--trials: must be positive"),
    "storage-unsupported": (*tune(GOOD_SPACE, "--storage", "redis://127.0.0.1/0"), "unsupported"),
    "storage-unreachable": (*tune(GOOD_SPACE, "--storage", f"postgresql://u:pw@127.0.0.1:{_closed_port()}/db"),
                            "cannot use the database"),
    "sweep-ray-silent-address": (sweep("--ray", "--address", f"127.0.0.1:{_closed_port()}"), None,
                                 "no Ray cluster answers there within"),
    "sweep-ray-bad-address": (sweep("--ray", "--address", "head-without-port"), None, "expected HOST:PORT"),
    "sweep-address-without-ray": (sweep("--address", "127.0.0.1:6379"), None, "--address: only with --ray"),
    "sweep-ray-client-address": (sweep("--ray", "--address", "ray://127.0.0.1:10001"), None,
                                 "the Ray client (ray://) is not supported here"),
    "tune-ray-silent-address": (*tune(GOOD_SPACE, "--ray", "--address", f"127.0.0.1:{_closed_port()}"),
                                "no Ray cluster answers there within"),
    # a study every trial of which would score the same penalty (smoke.yaml never stops at a solve)
    "tune-never-solves": (*tune(GOOD_SPACE), f"error: {SMOKE}: evaluation.stop_when_solved is false, so no run "
                                             f"stops at a solve (each trains its whole budget past it); --objective "
                                             f"env_steps is measured at a confirmed solve"),
    "tune-negative-sampler-seed": (*tune(GOOD_SPACE, "--seed", "-3"), "error: --seed -3: must be in [0, 2147483647]"),
}


def _snapshot(folder):
    return sorted(os.path.relpath(os.path.join(root, n), folder) for root, dirs, files in os.walk(folder)
                  for n in dirs + files)


def _run(case_id, args, space_text, folder):
    os.makedirs(folder)
    if space_text is not None:
        with open(os.path.join(folder, "space.yaml"), "w") as handle:
            handle.write(space_text)
    if case_id == "sweep-different-grid":
        os.makedirs(os.path.join(folder, "out", "sweeps", "x"))
        with open(os.path.join(folder, "out", "sweeps", "x", "sweep.yaml"), "w") as handle:
            handle.write(f"config: {SMOKE}\nseeds: [0]\ngrid: ['agent.learning_rate=[1e-3,2e-3]']\nset: []\n")
    before = _snapshot(folder)
    start = time.time()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main([a.replace("{dir}", folder) for a in args])
    proc = SimpleNamespace(returncode=status, stderr=err.getvalue())
    return proc, time.time() - start, before, _snapshot(folder)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp("experiments_bad_input")
    return {cid: _run(cid, args, space_text, str(base / cid)) for cid, (args, space_text, _) in CASES.items()}


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input_is_one_line_and_exit_2(case_id, results):
    proc, _, before, after = results[case_id]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert CASES[case_id][2] in lines[0], lines[0]
    assert after == before, "the command created or changed files"


def test_an_unreachable_database_fails_within_seconds(results):
    proc, seconds, _, _ = results["storage-unreachable"]
    assert proc.returncode == 2 and seconds < 15
    assert "pw" not in proc.stderr  # the password is not echoed


def test_a_silent_ray_address_fails_within_seconds(results):
    for case in ("sweep-ray-silent-address", "tune-ray-silent-address"):
        proc, seconds, _, _ = results[case]
        assert proc.returncode == 2 and seconds < 15, (case, seconds)


HIDE_RAY = """
import json, sys
sys.modules["ray"] = None  # `import ray` fails, as where the extra is not installed
from dqn_cartpole.cli.main import main
for argv in json.loads(sys.argv[1]):
    print(main(argv), flush=True)
"""


def test_ray_options_without_ray_installed_are_one_line_naming_the_extra(tmp_path):
    import json
    import subprocess
    import sys

    from helpers import REPO, cli_env

    (tmp_path / "space.yaml").write_text(GOOD_SPACE)
    out = tmp_path / "out"
    commands = [["sweep", "--config", SMOKE, "--ray", "--name", "x", "--set", f"output.root={out}"],
                ["tune", "--config", SMOKE, "--space", str(tmp_path / "space.yaml"), "--trials", "2", "--ray",
                 "--set", f"output.root={out}"]]
    proc = subprocess.run([sys.executable, "-c", HIDE_RAY, json.dumps(commands)], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "2"], proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {what} --ray needs Ray, which is not installed: pip install \"dqn_cartpole[ray]\" "
                     f"(in a checkout: pip install -e \".[ray]\")" for what in ("sweep", "tune")], proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("url, module, package", [
    ("postgresql://u:pw@127.0.0.1:1/db", "psycopg", '"dqn_cartpole[postgres]"'),
    ("postgresql+psycopg2://u:pw@127.0.0.1:1/db", "psycopg2", "psycopg2-binary"),
])
def test_a_missing_database_driver_names_its_package(monkeypatch, url, module, package):
    """SQLAlchemy 2.1 reads `postgresql://` as psycopg 3 (the postgres extra); Optuna re-raises the driver's
    import error as its own, and the line still names the module and what installs it."""
    from dqn_cartpole.errors import UserError
    from dqn_cartpole.experiments import storage

    monkeypatch.setitem(sys.modules, module, None)  # `import MODULE` fails, as where it is not installed
    with pytest.raises(UserError, match=rf"needs the {module} driver \(pip install {re.escape(package)}\)$"):
        storage.open_storage(url)
