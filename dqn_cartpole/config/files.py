"""Finding and reading config files: the shipped configs (by name, from any folder), the search spaces, the presets,
and one YAML file read as a mapping of sections, each problem one line naming the file.

The package reads its configs through `importlib.resources` (`dqn_cartpole/configs`): in a checkout that is a
symlink to the top-level configs/ folder, in a wheel the copy the build made of it.
"""

from __future__ import annotations

import importlib.resources
import os
from typing import Optional

import yaml

from dqn_cartpole.errors import ConfigError

DEFAULT_CONFIG = "default.yaml"
CONFIGS_PREFIX = "configs/"  # `--config configs/NAME.yaml` finds a shipped config from any folder
NOT_PRESETS = ("default", "smoke", "tutorial")  # shipped configs that are no env's tuned preset


def read_yaml(path: str) -> dict:
    """A config file as data (`section -> key -> value`); a missing, unreadable or malformed file is one line."""
    if not os.path.exists(path):
        raise ConfigError(f"{path}: config file not found")
    if os.path.isdir(path):
        raise ConfigError(f"{path}: is a folder, not a config file")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML: {one_line(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if raw is None:
        raise ConfigError(f"{path}: the file is empty; expected a mapping of sections")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    return raw


def one_line(exc: Exception) -> str:
    """A YAML error as one line, with where it is."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{problem}{where}".replace("\n", " ")


def shipped_configs_dir() -> str:
    """The folder of the configs that come with the package (the top-level configs/ in a checkout)."""
    return os.path.realpath(str(importlib.resources.files("dqn_cartpole") / "configs"))


def shipped_config_names(subfolder: str = "") -> list[str]:
    """The shipped configs' names, without .yaml: default, tutorial, smoke and the presets (or, with
    `subfolder="tune"`, the search spaces)."""
    folder = os.path.join(shipped_configs_dir(), subfolder)
    return sorted(name[:-5] for name in os.listdir(folder) if name.endswith(".yaml")) if os.path.isdir(folder) else []


def default_config_path() -> str:
    return os.path.join(shipped_configs_dir(), DEFAULT_CONFIG)


def locate_config(path: Optional[str]) -> str:
    """The config file `path` means: the file itself if it exists, else a shipped config of that name.

    `--config acrobot`, `--config acrobot.yaml` and `--config configs/acrobot.yaml` find the shipped
    preset from any working directory (and from a wheel); None is the default config.
    """
    if path is None:
        return default_config_path()
    found = _shipped(path, "")
    if found is None:
        raise ConfigError(f"{path}: config file not found (the shipped configs: {', '.join(shipped_config_names())})")
    return found


def locate_space(path: str) -> str:
    """The search space `path` means, as `locate_config`: `--space acrobot-space` or
    `--space configs/tune/acrobot-space.yaml` finds a shipped one from any folder."""
    found = _shipped(path, "tune")
    if found is None:
        raise ConfigError(f"--space {path}: no such file (the shipped search spaces: "
                          f"{', '.join(shipped_config_names('tune'))})")
    return found


def _shipped(path: str, subfolder: str) -> Optional[str]:
    """`path` if it exists, else the shipped file it names (NAME, NAME.yaml or configs/[tune/]NAME.yaml), else None."""
    if os.path.exists(path):
        return path
    prefix = CONFIGS_PREFIX + (f"{subfolder}/" if subfolder else "")
    name = path[len(prefix):] if path.startswith(prefix) else path
    name = name[:-5] if name.endswith(".yaml") else name
    if name in shipped_config_names(subfolder):
        return os.path.join(shipped_configs_dir(), subfolder, f"{name}.yaml")
    return None


def preset_for(env_id: str) -> Optional[str]:
    """The name of the shipped preset tuned for `env_id` (`acrobot` for Acrobot-v1), if there is one."""
    for name in shipped_config_names():
        if name not in NOT_PRESETS:
            env = (read_yaml(os.path.join(shipped_configs_dir(), f"{name}.yaml")).get("env") or {})
            if env.get("id") == env_id:
                return name
    return None
