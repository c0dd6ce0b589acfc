"""Shared fixtures. Quiet start-up, a path to the repo's configs, and one smoke run for every test that reads one."""

import os

import pytest

from browser import find_chromium
from helpers import run_cli

os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # as every command runs TensorFlow (console/imports.py)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs")


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
