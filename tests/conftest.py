"""Shared fixtures. Quiet start-up, a path to the repo's configs, and one smoke run for every test that reads one."""

import atexit
import os
import shutil
import tempfile

import pytest

from browser import find_chromium
from helpers import run_cli

os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # as every command runs TensorFlow (console/imports.py)

# The suite leaves the user's home alone: a HOME of its own (Ray would write ~/.ray/auth_token there, readable by
# others, and every later `ray start --head` on the machine would turn token authentication on), removed at the end.
# And no test joins a `ray start` cluster that happens to run on the machine: a Ray run without an address of the
# test's own starts a private instance (Ray's own word for it: `local`).
_HOME = tempfile.mkdtemp(prefix="dqn-cartpole-tests-home-")
os.environ["HOME"] = _HOME
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["RAY_ADDRESS"] = "local"

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs")


# The suite runs in two processes (pyproject.toml: `-n 2 --dist loadfile`, pytest-xdist), each file whole in one of
# them, so a file's module fixtures are made once. Files go out in the order collected: the longest first (their
# seconds in a full run at load 2-4), so that no long file starts last and leaves one core idle at the end.
LONGEST_FIRST = ("test_resume.py", "test_experiments_ray.py", "test_ray_topology.py", "test_chaos.py",
                 "test_learning.py", "test_tune.py", "test_sweep.py", "test_docs.py", "test_bounded_waits.py",
                 "test_netns.py", "test_notebook.py", "test_api.py", "test_py_driver.py", "test_experiments_reuse.py")


def pytest_collection_modifyitems(session, config, items):
    """The longest files' tests first (each file's own order kept), then the rest in their collected order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(os.path.basename(str(item.fspath)), len(rank)), order[id(item)]))


def pytest_report_header(config):
    """One line at the top of every test run saying whether the real-browser test of report.html runs."""
    browser = find_chromium()
    if browser:
        return f"browser test: report.html is checked in headless {browser}"
    return ("browser test: SKIPPED, no chromium or chromium-browser on PATH "
            "(apt-get install chromium, as .ci/run does, to run it)")


@pytest.fixture
def configs_dir() -> str:
    return CONFIGS


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """`train --config configs/smoke.yaml` into a fresh folder, once per session: (run folder, process)."""
    run_dir = str(tmp_path_factory.mktemp("smoke") / "run")
    result = run_cli("train", "--config", os.path.join(CONFIGS, "smoke.yaml"), "--output-dir", run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result
