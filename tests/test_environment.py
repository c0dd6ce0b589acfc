"""The one environment (docs/install.md): what is installed is what uv.lock pins, the Makefile installs that lock,
requirements-lock.txt (the path without uv) is the same set, the overrides of pyproject's [tool.uv] are the only
broken requirements, and the `_DictWrapper` trap they open stays closed in every process we start.

No network and no install: the lock is read with `uv export --frozen`, the environment with importlib.metadata.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from importlib import metadata

import pytest

from helpers import REPO

LOCK_EXPORT = os.path.join(REPO, "requirements-lock.txt")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
# A tf.function traced on a trackable dict: tracing asks whether the argument follows TF's runtime-checkable
# SupportsTracingProtocol, which typing-extensions >= 4.6 answers with inspect.getattr_static, reading the object's
# __dict__, which wrapt 1.14's C ObjectProxy refuses ("this __dict__ descriptor does not support '_DictWrapper'
# objects"). PolicySaver traces the policy's variables so: every run's policy/final went through it and failed.
TRAP = """
import tensorflow as tf, wrapt
module = tf.Module()
module.table = {"a": tf.Variable(2.0)}
doubled = tf.function(lambda table: table["a"] * 2.0)(module.table)
print(type(module.table).__name__, float(doubled), wrapt.__version__)
"""


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict:
    """name -> version of every `name==version` line of a requirements file."""
    return {normalized(m.group(1)): m.group(2) for m in map(PIN.match, text.splitlines()) if m}


def uv() -> str:
    found = shutil.which("uv", path=os.path.dirname(sys.executable))
    if found is None:
        pytest.fail(f"no uv beside {sys.executable}: the environment was not installed by `make` (docs/install.md)")
    return found


def makefile_sync_args() -> list:
    """The extras of the Makefile's `uv sync` line, as it installs the environment."""
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as handle:
        text = handle.read()
    (extras,) = re.findall(r"^EXTRAS := (.*)$", text, re.M)
    (sync,) = re.findall(r"^\t.*\$\(BIN\)/uv sync (.*)$", text, re.M)
    assert sync.split()[:2] == ["--locked", "$(EXTRAS)"], f"the Makefile does not install the lock as it is: {sync}"
    return extras.split()


def exported(*extra_args: str) -> str:
    """uv.lock as requirements, for the Makefile's extras (the dev group, which holds uv, included)."""
    return subprocess.run([uv(), "export", "--frozen", "--no-emit-project", *makefile_sync_args(), *extra_args],
                          cwd=REPO, capture_output=True, text=True, check=True, timeout=60).stdout


def installed() -> dict:
    """name -> version of what the venv's site-packages hold (not what is on sys.path: setuptools puts its vendored
    packages' own dist-info there once it is imported)."""
    found = {}
    folders = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for dist in metadata.distributions(path=folders):
        found[normalized(dist.metadata["Name"])] = dist.version
    return found


def test_the_environment_is_the_lock():
    """Every package uv.lock pins for the Makefile's extras is installed at its version, and nothing else is (but
    the project itself and the venv's own pip)."""
    locked = pins(exported())
    here = installed()
    wrong = {name: (version, here.get(name)) for name, version in locked.items() if here.get(name) != version}
    extra = sorted(set(here) - set(locked) - {"dqn-cartpole", "pip"})
    assert not wrong and not extra, (
        f"this environment is not uv.lock (run `make install`): locked vs installed {wrong}; not in the lock {extra}")
    assert here["dqn-cartpole"], "the project is installed"


def test_requirements_lock_is_uv_lock_exported():
    """The path without uv (docs/install.md): requirements-lock.txt is uv.lock as `uv export` writes it; re-made
    with `make requirements-lock.txt` after `uv lock`."""
    with open(LOCK_EXPORT, encoding="utf-8") as handle:
        written = handle.read()
    assert pins(written) == pins(exported()), "requirements-lock.txt is stale: run `make requirements-lock.txt`"


def test_only_the_overrides_are_broken():
    """`uv pip check` finds exactly the two requirements that pyproject's [tool.uv] overrides, and nothing else: a
    missing dependency (TensorFlow's wheels disagree on theirs) or a new conflict fails here."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
        overrides = tomllib.load(handle)["tool"]["uv"]["override-dependencies"]
    assert sorted(overrides) == ["typing-extensions>=4.12", "wrapt>=2"]
    proc = subprocess.run([uv(), "pip", "check", "--python", sys.executable], capture_output=True, text=True,
                          timeout=60)
    output = proc.stdout + proc.stderr
    broken = sorted(re.findall(r"The package `([^`]+)` requires `([A-Za-z0-9._-]+)", output))
    problems = [line for line in output.splitlines() if "The package" in line or "not installed" in line]
    assert broken == [("tensorflow", "wrapt"), ("tf-agents", "typing-extensions")] and len(problems) == 2, output


def trap_check(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", TRAP], capture_output=True, text=True, timeout=120,
                          env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"})


def test_the_dict_wrapper_trap_is_closed_in_a_fresh_process():
    """The check PolicySaver makes, in a process of its own with nothing set in its environment (no
    WRAPT_DISABLE_EXTENSIONS): a plain `import tensorflow` in any process of this venv, a Ray worker's included."""
    env = {k: v for k, v in os.environ.items() if k != "WRAPT_DISABLE_EXTENSIONS"}
    proc = trap_check(env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kind, doubled, version = proc.stdout.split()
    assert kind == "_DictWrapper" and doubled == "4.0" and int(version.split(".")[0]) >= 2


def test_what_imports_numpy_optionally_runs_beside_numpy_1():
    """TF 2.15 needs numpy < 2; packages whose metadata leaves numpy out may still need 2 at import (pyarrow 26,
    which mlflow brings and Ray imports in every actor once installed, did; arch 7.2, rliable's, fails on pandas 3):
    each imports, and converts an array."""
    code = ("import numpy, pyarrow, pandas, ray._private.arrow_serialization, rliable.library\n"
            "assert numpy.__version__.startswith('1.')\n"
            "print(pyarrow.array(numpy.arange(3)).to_pylist(), pandas.Series(numpy.arange(2)).sum())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["[0,", "1,", "2]", "1"], proc.stderr[-2000:]


def test_the_install_page_lists_the_locked_versions():
    """docs/install.md's table of the main packages says what the lock installs."""
    with open(os.path.join(REPO, "docs", "install.md"), encoding="utf-8") as handle:
        text = handle.read()
    table = text[text.index("| package | version |"):].split("\n\n")[0]  # that table, to its blank line
    cells = [cell.strip() for line in table.splitlines() for cell in line.strip().strip("|").split("|")]
    listed = {normalized(name): version.split()[0] for name, version in zip(cells[::2], cells[1::2])
              if re.match(r"^\d+\.\d+", version)}
    locked = pins(exported())
    assert len(listed) >= 15 and {name: locked.get(name) for name in listed} == listed
