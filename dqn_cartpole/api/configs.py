"""`load_config`: the CLI's `--config`, `--set` and shortcuts, as one Python call.

The same frozen `Config` and the same checks as `python -m dqn_cartpole train --config ... --set ...`: bad input
raises `UserError` (a `ValueError`; `ConfigError` for the config itself) with the CLI's one-line message. Nothing
exits the process and nothing prints.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from typing import Any, Iterable, Mapping, Optional, Union

import dqn_cartpole.config as config_module
from dqn_cartpole.cli.shortcuts import SHORTCUTS
from dqn_cartpole.config import Config, Flagged
from dqn_cartpole.errors import ConfigError

Overrides = Union[Mapping[str, Any], Iterable[str], None]
ConfigLike = Union[Config, str, "os.PathLike[str]", None]


def override_items(overrides: Overrides) -> list[Flagged]:
    """`section.key=value` items, as `--set` takes them, for a mapping of dotted keys to Python values (a string
    stays a string: `{"env.id": "CartPole-v0"}`) or for `section.key=value` strings as typed after `--set`. Each is
    `Flagged` with the argument as the caller wrote it, so an error names that, not a `--set` the caller never
    typed: `overrides["training.batch_size"]='64': expected an integer ...`."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise ConfigError(f"overrides: expected a mapping of section.key to a value, or a list of section.key=value "
                          f"strings, got the string {overrides!r}")
    if isinstance(overrides, Mapping):
        return [Flagged(f"{_key(key)}={_yaml_value(key, value)}", f"overrides[{key!r}]={value!r}")
                for key, value in overrides.items()]
    items = list(overrides)
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise ConfigError(f"overrides[{index}]: expected a section.key=value string, got "
                              f"{type(item).__name__} {item!r}")
    return [Flagged(item, f"overrides[{index}]={item!r}") for index, item in enumerate(items)]


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise ConfigError(f"overrides: a key must be a string section.key, got {type(key).__name__} {key!r}")
    return key


def _yaml_value(key: str, value: Any) -> str:
    """A Python value as the YAML text `--set` parses back to it (JSON is YAML), tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    try:
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    except (TypeError, ValueError):
        raise ConfigError(f"overrides[{key!r}]: expected a number, string, true/false, null or a list, got "
                          f"{type(value).__name__} {value!r}") from None


def shortcut_items(env: Optional[str], seed: Optional[int], iterations: Optional[int],
                   track: Optional[str] = None) -> list[Flagged]:
    """The CLI's shortcuts (`--env`, `--seed`, `-n`, `--track`) as `section.key=value` items; an error about one
    names the argument as the caller wrote it (`env='Pendulum-v1': ...`)."""
    given = {"env_id": ("env", env), "seed": ("seed", seed), "iterations": ("iterations", iterations),
             "track": ("track", track)}
    return [Flagged(f"{SHORTCUTS[name][0]}={json.dumps(value)}", f"{argument}={value!r}")
            for name, (argument, value) in given.items() if value is not None]


def load_config(name_or_path: Union[str, "os.PathLike[str]", None] = None, overrides: Overrides = None, *,
                env: Optional[str] = None, seed: Optional[int] = None, iterations: Optional[int] = None,
                track: Optional[str] = None) -> Config:
    """The frozen, checked config of a run, as `train --config NAME_OR_PATH [--env ID] [--seed N] [-n N] --set ...`
    builds it.

    Args:
        name_or_path: a shipped config's name (`"tutorial"`, `"smoke"`, `"acrobot"`, ...), a YAML file, or None
            for the default (configs/default.yaml).
        overrides: `{"agent.learning_rate": 5e-4, ...}` (Python values), or `["agent.learning_rate=5e-4", ...]`
            (as after `--set`); applied after the shortcuts, in order.
        env, seed, iterations: the CLI's shortcuts for `env.id`, `training.seed` and `training.num_iterations`.
        track: `"mlflow"` or `"wandb"`, as `--track`: the run's metrics go there as it trains (MLflow), the rest
            once it ended (tracking.backend).

    Raises:
        ConfigError: (a `UserError`, a `ValueError`) the file, a key or a value is bad; the message is the CLI's line.
    """
    path = config_module.locate_config(None if name_or_path is None else os.fspath(name_or_path))
    items = shortcut_items(env, seed, iterations, track) + override_items(overrides)
    with contextlib.redirect_stderr(io.StringIO()):  # gymnasium's import-time notices, as the CLI hides them
        return config_module.load_config(path, items)


def as_config(config: ConfigLike, overrides: Overrides = None, track: Optional[str] = None) -> Config:
    """A `Config` as given (with `track`, tracked there), or `load_config(config, overrides, track=track)` for a
    name, a path or None."""
    if isinstance(config, Config):
        if overrides:
            raise ConfigError("overrides: a Config is already loaded and checked; give the overrides to "
                              "load_config(..., overrides) instead, or pass the config's name or path")
        if track is not None:
            (item,) = shortcut_items(None, None, None, track)
            config = config_module.apply_override(config, item.item, item.flag)
            config_module.validate(config, item.flag)
        return config
    if config is not None and not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config: expected a Config, a shipped config's name or a YAML path, got "
                          f"{type(config).__name__} {config!r}")
    return load_config(config, overrides, track=track)
