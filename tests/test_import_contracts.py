"""The layers of docs/internals.md as import contracts (pyproject.toml, `[tool.importlinter]`), checked by import-linter:
imports point down only, experiments never import the trainer, only the entry points import the package's top, and no
package's modules import each other in a cycle. The next upward import or cycle fails here rather than in a review."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def lint_imports(root: str) -> subprocess.CompletedProcess:
    """`lint-imports` on the package under `root` with the contracts of `root`/pyproject.toml (no cache written)."""
    env = {**os.environ, "PYTHONPATH": root}  # before the editable install's finder: the package under `root`
    return subprocess.run([LINT_IMPORTS, "--no-cache", os.path.join(root, "pyproject.toml")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_package_keeps_every_import_contract():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize("module, planted, contract", [
    ("run_folder/atomic.py", "import dqn_cartpole.cli.main", "Layers: imports point down only"),
    ("experiments/grid.py", "import dqn_cartpole.training.loop", "Experiments never import the trainer"),
    ("config/coerce.py", "import dqn_cartpole", "Only entry points import the package top"),
    ("experiments/tune_outputs.py", "import dqn_cartpole.experiments.tune", "No import cycles among siblings"),
])
def test_a_planted_import_against_the_contracts_breaks_one(tmp_path, module, planted, contract):
    shutil.copytree(os.path.join(REPO, "dqn_cartpole"), tmp_path / "dqn_cartpole", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path)
    with open(tmp_path / "dqn_cartpole" / module, "a", encoding="utf-8") as source:
        source.write(f"\n{planted}  # planted by the test\n")
    result = lint_imports(str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{contract} BROKEN" in result.stdout, result.stdout


def scripts_importing(name: str, folder: str) -> list[str]:
    """The scripts in `folder` that import the module `name` (`import name`, `from name import ...`)."""
    found = []
    for entry in sorted(os.listdir(folder)):
        if entry.endswith(".py"):
            with open(os.path.join(folder, entry), encoding="utf-8") as source:
                tree = ast.parse(source.read())
            modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
            if name in modules:
                found.append(entry)
    return found


def test_no_part_of_the_benchmark_imports_scripts_benchmark_back(tmp_path):
    """scripts/benchmark.py runs its parts (benchmark_*.py); what they share is in benchmark_common.py, so no cycle."""
    assert scripts_importing("benchmark", os.path.join(REPO, "scripts")) == []
    (tmp_path / "benchmark_part.py").write_text("from benchmark import REPO\n")  # the check sees a planted one
    assert scripts_importing("benchmark", str(tmp_path)) == ["benchmark_part.py"]
