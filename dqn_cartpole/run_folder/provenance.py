"""What produced a run: the package and its git commit, the library versions, the machine.

Recorded in summary.json (`provenance`) and shown in report.html, so a result can be traced to
the code and the machine that made it. Versions are read from the installed distributions'
metadata (no import of TensorFlow here); the git commit only when the package runs from a
checkout (an installed wheel has none).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from typing import Optional

from dqn_cartpole.version import __version__

# Label in the report -> distribution name (pip's).
LIBRARIES = {"tensorflow": "tensorflow", "tf_agents": "tf-agents", "reverb": "dm-reverb", "gymnasium": "gymnasium"}
GIT_TIMEOUT_S = 5.0


def provenance() -> dict:
    """The package version, the git commit and dirty flag (a checkout only), the Python and library versions,
    the CPU model, its core count and the OS."""
    commit, dirty = git_state(checkout_root())
    return {
        "package_version": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        **{name: library_version(dist) for name, dist in LIBRARIES.items()},
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "os": operating_system(),
    }


def checkout_root() -> Optional[str]:
    """The git checkout the package runs from (its parent folder holds .git), else None (an installed wheel)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dqn_cartpole/, from run_folder/
    root = os.path.dirname(package)
    return root if os.path.exists(os.path.join(root, ".git")) else None


def git_state(root: Optional[str]) -> tuple[Optional[str], Optional[bool]]:
    """(HEAD's commit, whether tracked files differ from it) of the checkout at `root`; (None, None) without one."""
    if root is None:
        return None, None
    try:
        commit = _git(root, "rev-parse", "HEAD").strip()
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.SubprocessError):  # no git, not a repository, or too slow
        return None, None
    return commit, dirty


def _git(root: str, *args: str) -> str:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, check=True,
                          timeout=GIT_TIMEOUT_S).stdout


def library_version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def operating_system() -> str:
    """e.g. 'Debian GNU/Linux 12 (bookworm), Linux 6.1.0 x86_64'."""
    kernel = f"{platform.system()} {platform.release()} {platform.machine()}"
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            fields = dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)
        return f"{fields['PRETTY_NAME'].strip(chr(34))}, {kernel}"
    except (OSError, KeyError, ValueError):
        return kernel
