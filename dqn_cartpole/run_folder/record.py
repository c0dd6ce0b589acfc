"""A finished (or stopped) run as data: `read_run(path)` for every tool that consumes run folders.

`summary.json` is versioned. Version 1 added `version` itself and `solved_env_steps`; a summary
without `version` was written before that and reads as version 0. Consumers (compare, sweeps,
the report) read runs only through this module and never import the trainer or TensorFlow.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder.atomic import write_json_atomic
from dqn_cartpole.run_folder.layout import COLLECTOR_METRICS, CONFIG_FILE, RunLayout
from dqn_cartpole.run_folder.csv_files import read_numbers

SUMMARY_VERSION = 1


@dataclass(frozen=True)
class RunRecord:
    """What a run folder says about its run. `summary` is empty for a run that never finished."""

    root: str
    version: int
    config: dict
    summary: dict = field(default_factory=dict)
    train_rows: list = field(default_factory=list)
    eval_rows: list = field(default_factory=list)
    collector_rows: dict = field(default_factory=dict)  # a distributed run: collector id -> its CSV's rows
    written: Optional[dict] = None  # section.key -> value: what the user wrote (config.written.yaml; None: no file)

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.root)

    @property
    def finished(self) -> bool:
        """The trainer wrote its summary (it may still have stopped early on a signal)."""
        return bool(self.summary)

    @property
    def solved(self) -> bool:
        return self.summary.get("solved_at_iteration") is not None

    @property
    def solve_checked(self) -> bool:
        """Whether the run checked for a solve: its summary's `solve_checked` (a run that stops on its solve, or
        that trains on past it and acts on it: `training.final_policy.checks_for_solve`); a run from before that
        field checked only with `evaluation.stop_when_solved` (true unless its config.yaml says false). A run solved
        before the check was turned off, by a resume past its solve, did check. A run without the check is neither
        solved nor unsolved: its best return was never confirmed on fresh episodes."""
        if self.solved:
            return True
        if "solve_checked" in self.summary:
            return bool(self.summary["solve_checked"])
        return self.config_value("evaluation.stop_when_solved") is not False

    def get(self, key: str, default: Any = None) -> Any:
        """A summary field (None for a run without a summary)."""
        return self.summary.get(key, default)

    def config_value(self, dotted: str) -> Any:
        """`section.key` of the run's resolved config."""
        section, key = dotted.split(".", 1)
        return self.config.get(section, {}).get(key)


def write_summary(path: str, summary: dict) -> None:
    """Writes summary.json atomically, stamped with the current version."""
    write_json_atomic(path, {"version": SUMMARY_VERSION, **summary})


def read_run(path: str) -> RunRecord:
    """Reads a run folder. Raises UserError (one line) when `path` is not a readable run folder, or one of its
    metrics CSVs holds a cell that is not a number."""
    layout = RunLayout(path)
    if not os.path.isdir(path):
        raise UserError(f"{path}: no such run folder")
    if not os.path.isfile(layout.config):
        raise UserError(f"{path}: not a run folder (no {os.path.basename(layout.config)})")
    config = read_yaml(layout.config)
    written = read_written(layout.written_config)
    summary: dict = {}
    if os.path.isfile(layout.summary):
        try:
            with open(layout.summary, encoding="utf-8") as handle:
                summary = json.load(handle)
        except (OSError, ValueError) as exc:
            raise UserError(f"{layout.summary}: cannot read: {str(exc).splitlines()[0]}") from None
    version = int(summary.get("version", 0)) if summary else SUMMARY_VERSION
    if version > SUMMARY_VERSION:
        raise UserError(f"{layout.summary}: written by a newer dqn_cartpole (summary version {version}, this one "
                        f"reads up to {SUMMARY_VERSION}); upgrade to read it")
    return RunRecord(root=path, version=version, config=config, summary=summary,
                     train_rows=read_numbers(layout.train_metrics), eval_rows=read_numbers(layout.eval_metrics),
                     collector_rows=read_collectors(layout), written=written)


def read_yaml(path: str) -> dict:
    """A run folder's YAML file as data; one line if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            found = yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: cannot read: {str(exc).splitlines()[0]}") from None
    if not isinstance(found, dict):
        raise UserError(f"{path}: cannot read: expected a mapping of sections, got {type(found).__name__}")
    return found


def read_written(path: str) -> Optional[dict]:
    """config.written.yaml as section.key -> value (None: the run has none, e.g. it was written by an older
    version or not by the command line)."""
    if not os.path.isfile(path):
        return None
    sections = read_yaml(path)
    if not all(isinstance(keys, dict) for keys in sections.values()):
        raise UserError(f"{path}: cannot read: expected a mapping of keys in every section")
    return {f"{section}.{key}": value for section, keys in sections.items() for key, value in keys.items()}


def read_collectors(layout: RunLayout) -> dict[int, list]:
    """The rows of every collector's metrics CSV (roles/collector-I.csv), by collector id."""
    pattern = re.compile(re.escape(COLLECTOR_METRICS).replace(re.escape("{id}"), r"(\d+)") + "$")
    found = {}
    for path in glob.glob(os.path.join(layout.roles, COLLECTOR_METRICS.format(id="*"))):
        match = pattern.search(os.path.basename(path))
        if match:
            found[int(match.group(1))] = read_numbers(path)
    return dict(sorted(found.items()))


def find_runs(path: str) -> list[str]:
    """Run folders at or below `path` (a run folder itself, or a folder of runs such as a sweep)."""
    found = []
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        if CONFIG_FILE in files:
            found.append(folder)
            dirs[:] = []
    return found
