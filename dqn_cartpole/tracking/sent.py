"""What a tracked run sends, read from its run folder (no TensorFlow, no tracking library): the resolved config as
parameters, what the user changed as tags, the metrics rows against the train step (with the env steps beside
them), the outcome, the provenance and the artifacts' paths."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from dqn_cartpole.run_folder.record import RunRecord, read_run

DEFAULT_PROJECT = "dqn_cartpole"
# summary.json's outcome fields, sent as the run's final values.
OUTCOME_KEYS = ("solved_at_iteration", "solved_env_steps", "solved_wall_s", "solved_return", "best_return",
                "final_return", "iterations", "train_steps", "env_steps", "wall_s", "cpu_s", "eval_s", "exit_status")
EVAL_PREFIX = "eval/"


@dataclass(frozen=True)
class Row:
    """One metrics row: its train step, env steps and numeric values (named as sent: eval rows with `eval/`)."""

    train_step: int
    env_steps: int
    values: dict


@dataclass(frozen=True)
class Sent:
    """Everything a tracked run sends (`what_is_sent`)."""

    run_dir: str
    project: str
    run_name: str
    group: Optional[str]
    params: dict  # section.key -> value: the resolved config
    tags: dict  # name -> value (seed, env, agent, group, the user's tags, changed.KEY for each key written)
    train_rows: tuple  # of Row, in order
    eval_rows: tuple  # of Row, in order
    outcome: dict  # OUTCOME_KEYS found in summary.json (None values left out)
    provenance: dict
    artifacts: dict  # artifact folder -> [paths] that exist: plots, videos, report, policy, files
    finished: bool  # summary.json was written
    status: str  # FINISHED, KILLED (stopped by a signal) or FAILED


def what_is_sent(run_dir: str, tracking: dict) -> Sent:
    """Reads `run_dir` (a run folder) as `Sent`, named and tagged as `tracking` (the run's config's section, as
    data) says."""
    run = read_run(run_dir)
    return Sent(run_dir=run_dir, project=tracking.get("project") or DEFAULT_PROJECT,
                run_name=run_name(run_dir, tracking), group=tracking.get("group"), params=flat(run.config),
                tags=tags(run, tracking), train_rows=rows(run.train_rows, ""), eval_rows=rows(run.eval_rows,
                                                                                              EVAL_PREFIX),
                outcome={k: run.get(k) for k in OUTCOME_KEYS if isinstance(run.get(k), (int, float))},
                provenance=run.get("provenance") or {}, artifacts=artifacts(run), finished=run.finished,
                status=status(run))


def flat(config: dict) -> dict:
    """section -> key -> value as section.key -> value."""
    return {f"{section}.{key}": value for section, keys in config.items() for key, value in (keys or {}).items()}


def tags(run: RunRecord, tracking: dict) -> dict:
    """The run's tags: seed, env, agent, group, the user's own (NAME or NAME=VALUE), and changed.KEY = VALUE for
    every key the user wrote (config.written.yaml: a sweep's grid point, a study's sampled values)."""
    found = run_tags(run.config_value("training.seed"), run.config_value("env.id"), run.config_value("agent.kind"),
                     run.root, tracking)
    for key, value in (run.written or {}).items():
        found[f"changed.{key}"] = "" if value is None else str(value)
    return found


def run_tags(seed: Any, env: Any, agent: Any, run_dir: str, tracking: dict) -> dict:
    """The tags a tracked run has from its start: seed, env, agent, run_dir, group and the user's own."""
    found = {"seed": seed, "env": env, "agent": agent, "run_dir": os.path.abspath(run_dir)}
    if tracking.get("group"):
        found["group"] = tracking["group"]
    for tag in tracking.get("tags") or ():
        key, _, value = tag.partition("=")
        found[key.strip()] = value.strip()
    return {key: "" if value is None else str(value) for key, value in found.items()}


def run_name(run_dir: str, tracking: dict) -> str:
    """tracking.run_name, else the run folder's name."""
    return tracking.get("run_name") or os.path.basename(os.path.normpath(os.path.abspath(run_dir)))


def rows(table: list, prefix: str) -> tuple:
    """A metrics CSV's rows as `Row`s: every numeric cell but the two step columns (a cut-short row is skipped)."""
    found = []
    for row in table:
        try:
            train_step, env_steps = int(float(row["train_step"])), int(float(row["env_steps"]))
        except (KeyError, TypeError, ValueError):
            continue
        values = {}
        for key, cell in row.items():
            if key in ("train_step", "env_steps") or cell in (None, ""):
                continue
            try:
                values[prefix + key] = float(cell)
            except ValueError:
                continue
        found.append(Row(train_step, env_steps, values))
    return tuple(found)


def artifacts(run: RunRecord) -> dict:
    """artifact folder -> the paths that exist: the plots, the videos, report.html, policy/final (a folder), the
    config files and summary.json."""
    layout = run.layout
    listed = {
        "plots": [os.path.join(layout.plots, n) for n in sorted(_names(layout.plots)) if n.endswith(".png")],
        "videos": [os.path.join(layout.videos, n) for n in sorted(_names(layout.videos)) if n.endswith(".mp4")],
        "": [layout.report, layout.config, layout.written_config, layout.summary],
        "policy": [layout.final_policy],
    }
    return {folder: [path for path in paths if os.path.exists(path)] for folder, paths in listed.items()}


def _names(folder: str) -> list:
    return os.listdir(folder) if os.path.isdir(folder) else []


def status(run: RunRecord) -> str:
    """FINISHED, KILLED (a signal stopped it; it can be resumed) or FAILED (diverged, no summary)."""
    if run.get("stopped_by"):
        return "KILLED"
    return "FINISHED" if run.finished and run.get("exit_status") in (0, None) else "FAILED"


def value_text(value: Any) -> str:
    """A config value as a parameter's text (a list as YAML writes it inline)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return "null" if value is None else str(value)
