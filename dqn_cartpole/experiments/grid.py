"""Parsing `--seeds 0-4` and `--grid section.key=[v1,v2]` into the list of runs a sweep makes."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Sequence

import yaml

from dqn_cartpole.errors import UserError

SEED_KEY = "training.seed"
# Keys a sweep sets itself (or that would put two members in one folder): never on a grid.
RESERVED_PREFIXES = ("output.",)


@dataclass(frozen=True)
class Axis:
    """One `--grid` entry: a config key and the values it takes."""

    key: str
    values: tuple

    def overrides(self) -> list[str]:
        return [f"{self.key}={_yaml_value(v)}" for v in self.values]


@dataclass(frozen=True)
class Point:
    """One grid point: the overrides that make it, and a folder-safe label."""

    overrides: tuple  # ("agent.learning_rate=0.001", ...)
    label: str  # "learning_rate=0.001" or "base" for an empty grid


def parse_seeds(text: str) -> list[int]:
    """'0-4' -> [0..4]; '0,3,7' -> [0, 3, 7]; '1-2,5' works too. Raises UserError on anything else."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise UserError(f"--seeds {text}: expected seeds like 0-4 or 0,1,5")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise UserError(f"--seeds {text}: the range {part} is empty (write low-high)")
        seeds.extend(range(low, high + 1))
    if len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds {text}: a seed is listed twice")
    return seeds


def parse_axis(text: str) -> Axis:
    """'agent.learning_rate=[1e-3,2e-3]' -> Axis. The values are YAML, so strings and lists work."""
    where = f"--grid {text}"
    if "=" not in text:
        raise UserError(f"{where}: expected section.key=[value, value, ...]")
    key, raw = (s.strip() for s in text.split("=", 1))
    if key.count(".") != 1 or not all(key.split(".")):
        raise UserError(f"{where}: expected section.key=[value, ...], with one dot in the key")
    if key == SEED_KEY:
        raise UserError(f"{where}: give seeds with --seeds, not on the grid")
    if key.startswith(RESERVED_PREFIXES):
        raise UserError(f"{where}: output keys cannot be swept (each run gets its own folder)")
    try:
        values = yaml.safe_load(raw)
    except yaml.YAMLError:
        values = None
    if not isinstance(values, list):
        raise UserError(f"{where}: expected a list of values in brackets, e.g. {key}=[1e-3,2e-3]")
    if not values:
        raise UserError(f"{where}: the list of values is empty, so the sweep would have no runs")
    if len({_yaml_value(v) for v in values}) != len(values):
        raise UserError(f"{where}: a value is listed twice")
    return Axis(key, tuple(values))


def expand(axes: Sequence[Axis]) -> list[Point]:
    """Every combination of the axes' values (the first axis varies slowest)."""
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        raise UserError(f"--grid: {next(k for k in keys if keys.count(k) > 1)} is given twice")
    points = []
    for combo in itertools.product(*(a.overrides() for a in axes)):
        label = "__".join(_label(item) for item in combo) or "base"
        points.append(Point(tuple(combo), label))
    return points


def _label(override: str) -> str:
    key, value = override.split("=", 1)
    safe = re.sub(r"[^A-Za-z0-9.+-]+", "_", value).strip("_") or "none"
    return f"{key.split('.', 1)[1]}={safe}"


def _yaml_value(value) -> str:
    """A value as `--set` reads it back (flow-style YAML on one line)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def check_configs(config_path: str, override_lists: Sequence[Sequence[str]], population: bool = False) -> list:
    """Loads and checks the config once per list of overrides; returns, for each, the config as plain
    data (`to_dict`) or the UserError that `train` would have refused it with (`population`: or that a population
    cannot run, `config.population_problem`).

    Checking a config looks its env id up, which imports TF-Agents and TensorFlow (~3 s, ~400 MB).
    That happens in one short-lived spawned process, so the long-lived parent of a sweep or a study
    stays small. A bad config raises the same one-line UserError as `train` would.
    """
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_load_all, config_path, [list(o) for o in override_lists], population).result()


def first_error(checked: list) -> None:
    """Raises the first UserError among `check_configs`' results."""
    for item in checked:
        if isinstance(item, UserError):
            raise item


def _load_all(config_path: str, override_lists: list, population: bool = False) -> list:
    import contextlib
    import io

    from dqn_cartpole.config import load_config, population_problem, to_dict

    results: list = []
    with contextlib.redirect_stderr(io.StringIO()):  # import-time notices of gymnasium / TF-Agents
        for overrides in override_lists:
            try:
                config = load_config(config_path, overrides)
            except UserError as exc:
                results.append(UserError(str(exc)))
                continue
            problem = population_problem(config) if population else None
            results.append(UserError(f"--population: {problem}") if problem else to_dict(config))
    return results
