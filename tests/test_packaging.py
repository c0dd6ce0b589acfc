"""`pip install` of a wheel trains what the checkout trains: the configs ship inside the package, from any folder.

The wheel is built from a copy of the checkout's files and installed into a fresh venv that sees
the project venv's libraries (TensorFlow and the rest: no download) but not the checkout: the
test proves the imported package is the wheel's, then checks the resolved default config, a
shipped preset by name, and a short run of the default config from an unrelated folder, whose
sockets are sampled from start to end: the default run opens no network port.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile

import pytest
import yaml

from helpers import CONFIGS, REPO
from test_security import listening

from dqn_cartpole.config import load_config, to_dict


def checkout_files(destination: str) -> None:
    """The files git tracks (plus new ones it does not ignore), copied with their symlinks."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source, target = os.path.join(REPO, name), os.path.join(destination, name)
        if not os.path.lexists(source):
            continue  # deleted in the work tree
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)


def run(args: list, cwd: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args}: {proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of a fresh venv with only the wheel of this checkout installed, its environment, a work folder)."""
    if shutil.which("git") is None or not os.path.exists(os.path.join(REPO, ".git")):
        pytest.skip("needs a git checkout to list the files a wheel is built from")
    base = tmp_path_factory.mktemp("packaging")
    source, dist, venv = str(base / "source"), str(base / "dist"), str(base / "venv")
    checkout_files(source)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(SDL_AUDIODRIVER="dummy", TF_CPP_MIN_LOG_LEVEL="3", PIP_DISABLE_PIP_VERSION_CHECK="1")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, source],
        cwd=str(base), env=env)
    (wheel,) = glob.glob(os.path.join(dist, "dqn_cartpole-*.whl"))
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=str(base), env=env)
    python = os.path.join(venv, "bin", "python")
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], str(base), env)
    # The project venv's libraries, as a plain path: its .pth files (the editable install's finder) are not run.
    with open(os.path.join(site.stdout.strip(), "project_libraries.pth"), "w") as handle:
        handle.write(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel], str(base), env)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return python, env, str(elsewhere), wheel


def test_the_wheel_ships_the_configs(installed):
    _, _, _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    for name in os.listdir(CONFIGS):
        if name.endswith(".yaml"):
            assert f"dqn_cartpole/configs/{name}" in names, name
    assert "dqn_cartpole/configs/tune/default-space.yaml" in names


def test_an_installed_wheel_resolves_the_checkout_default_from_any_folder(installed):
    python, env, elsewhere, _ = installed
    where = run([python, "-c", "import dqn_cartpole, dqn_cartpole.config as c; "
                               "print(dqn_cartpole.__file__); print(c.default_config_path())"], elsewhere, env)
    package, default = where.stdout.splitlines()
    venv = os.path.dirname(os.path.dirname(python))
    assert package.startswith(venv + os.sep) and default.startswith(venv + os.sep), where.stdout  # not the checkout
    resolved = run([python, "-m", "dqn_cartpole", "config", "--plain"], elsewhere, env)
    assert yaml.safe_load(resolved.stdout) == to_dict(load_config(None))
    preset = run([python, "-m", "dqn_cartpole", "config", "--plain", "--config", "configs/acrobot.yaml"], elsewhere,
                 env)
    assert yaml.safe_load(preset.stdout) == to_dict(load_config(os.path.join(CONFIGS, "acrobot.yaml")))


def test_an_installed_wheel_trains_the_default_into_the_working_folder_and_opens_no_port(installed):
    python, env, elsewhere, _ = installed
    log = os.path.join(elsewhere, "train.log")
    with open(log, "w") as output:
        proc = subprocess.Popen([python, "-m", "dqn_cartpole", "train", "--quiet", "-n", "1500", "--set",
                                 "evaluation.stop_when_solved=false", "--set", "video.enabled=false", "--set",
                                 "output.run_name=wheel-run"], cwd=elsewhere, env=env, stdout=output, stderr=output)
    seen, samples = set(), 0
    try:
        while proc.poll() is None:
            seen |= listening(proc.pid)
            samples += 1
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = open(log).read()
    assert proc.returncode == 0, text[-3000:]
    assert "Training CartPole-v1 with default.yaml" in text and "Reverb" not in text
    assert samples > 20  # sampled throughout the run, training included
    assert seen == set(), f"the default run listened on {sorted(seen)}"
    run_dir = os.path.join(elsewhere, "outputs", "wheel-run")
    assert os.path.exists(os.path.join(run_dir, "checkpoints"))
    with open(os.path.join(run_dir, "config.yaml"), encoding="utf-8") as handle:
        ran = yaml.safe_load(handle)
    expected = to_dict(load_config(None, ["training.num_iterations=1500", "evaluation.stop_when_solved=false",
                                          "video.enabled=false", "output.run_name=wheel-run"]))
    assert ran == expected  # the checkout's default, resolved the same way
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["iterations"] == 1500
    assert summary["provenance"]["git_commit"] is None  # an installed wheel is no checkout
    assert summary["provenance"]["tensorflow"] == "2.15.1"
