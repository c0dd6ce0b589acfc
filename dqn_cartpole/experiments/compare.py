"""`compare`: group runs by the config keys that differ and report each group across its seeds.

Reads run folders through `dqn_cartpole.run_folder` only (no TensorFlow). Each run's evaluation
curve (average return against env steps) is interpolated onto its group's common grid of env
steps; a run that stopped early (solved) keeps its last evaluated return to the grid's end.
"""

from __future__ import annotations

import datetime as dt
import glob
import os
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import figures, stats
from dqn_cartpole.run_folder import RunRecord, read_run
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.csv_files import csv_text
from dqn_cartpole.run_folder.metrics import column
from dqn_cartpole.run_folder.record import find_runs

IGNORED_KEYS = ("training.seed",)
IGNORED_SECTIONS = ("output", "tracking")  # where a run went, not what it trained
OUTPUT_FILES = ("returns.png", "table.md", "table.csv", "report.html")
PAGE_FILE = "report.html"
CURVE_POINTS = 100
MAX_LABEL_KEYS = 3  # more differing keys than this: groups are named by folder (or lettered), keys listed below


@dataclass(frozen=True)
class Group:
    """Runs that share every config value except the seed and output keys."""

    label: str
    settings: dict  # differing key -> this group's value
    runs: tuple
    named_by_keys: bool = True  # the label says the differing keys' values (else they are listed under the table)


@dataclass(frozen=True)
class GroupCurves:
    label: str
    x: np.ndarray
    seeds: list  # (x, y) of each run
    line: np.ndarray
    low: np.ndarray
    high: np.ndarray


# ---------------------------------------------------------------------------- finding runs


def load_runs(paths: Sequence[str]) -> list[RunRecord]:
    """Every finished run at or below each path (globs expanded); unfinished runs are skipped with a warning."""
    folders: list[str] = []
    for pattern in paths:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        found = []
        for match in matches:
            if not glob.has_magic(pattern) and not os.path.isdir(match):
                raise UserError(f"{match}: no such run or sweep folder")
            found += find_runs(match) if os.path.isdir(match) else []
        if not found:
            raise UserError(f"{pattern}: no run folders there (no config.yaml at or below it)")
        known = {os.path.abspath(f) for f in folders}
        folders += [f for f in found if os.path.abspath(f) not in known]
    runs = [read_run(folder) for folder in folders]
    unfinished = [r.root for r in runs if not r.finished or not r.eval_rows]
    if unfinished:
        print(f"warning: skipping {len(unfinished)} unfinished run(s) (no summary.json or no evaluations): "
              f"{', '.join(unfinished[:3])}{' ...' if len(unfinished) > 3 else ''}", file=sys.stderr)
    runs = [r for r in runs if r.finished and r.eval_rows]
    if not runs:
        raise UserError(f"{' '.join(paths)}: no finished runs to compare")
    return runs


def output_folder(output: str | None, name: str | None) -> str:
    """--output, else outputs/compare/<name or time>; refuses a folder that holds anything but compare outputs."""
    folder = output or os.path.join("outputs", "compare", name or dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    if os.path.isfile(folder):
        raise UserError(f"{folder}: is a file; give a folder for the compare outputs")
    if os.path.isdir(folder):
        others = sorted(set(os.listdir(folder)) - set(OUTPUT_FILES))
        if others:
            raise UserError(f"{folder}: holds other files ({', '.join(others[:3])}); refusing to write compare "
                            f"outputs there, choose another --output")
    return folder


# ---------------------------------------------------------------------------- grouping


def flat_config(run: RunRecord) -> dict:
    """`section.key` -> value (lists as tuples), without the seed and output keys."""
    flat = {}
    for section, values in sorted(run.config.items()):
        if section in IGNORED_SECTIONS or not isinstance(values, dict):
            continue
        for key, value in values.items():
            dotted = f"{section}.{key}"
            if dotted not in IGNORED_KEYS:
                flat[dotted] = tuple(value) if isinstance(value, list) else value
    return flat


def differing_keys(runs: Sequence[RunRecord], flats: Sequence[dict]) -> list[str]:
    """The config keys whose values differ between runs, among those that apply to at least one of them (a
    single-process run ignores the distributed section, a uniform buffer the Reverb keys)."""
    from dqn_cartpole.config import applies

    keys = sorted({k for f in flats for k in f})
    return [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1
            and any(applies(r.config, k, os.path.isdir(r.layout.roles)) for r in runs)]


def group_runs(runs: Sequence[RunRecord]) -> list[Group]:
    """Groups by the config keys whose values differ between runs. Labels: those keys' values when there are
    few; else each group's own folder (a sweep's name), else a letter; the keys are then listed under the table."""
    flats = [flat_config(r) for r in runs]
    differing = differing_keys(runs, flats)
    buckets: dict[tuple, list] = {}
    for run, flat in zip(runs, flats):
        buckets.setdefault(tuple(repr(flat.get(k)) for k in differing), []).append((run, flat))
    settings = [{k: members[0][1].get(k) for k in differing} for members in buckets.values()]
    members = [tuple(run for run, _ in group) for group in buckets.values()]
    if not differing:
        labels, by_keys = ["all runs"] * len(members), True
    elif len(differing) <= MAX_LABEL_KEYS:
        labels, by_keys = [", ".join(f"{k}={_show(v)}" for k, v in s.items()) for s in settings], True
    else:
        labels = folder_labels(members) or [chr(ord("A") + i) if i < 26 else str(i + 1) for i in range(len(members))]
        by_keys = False
    return [Group(label, setting, runs_of, by_keys) for label, setting, runs_of in zip(labels, settings, members)]


def folder_labels(groups: Sequence[Sequence[RunRecord]]) -> Optional[list[str]]:
    """Each group named by its own folder: the highest one that holds all its runs and none of another group's
    (a sweep's folder, or a lone run's), by basename, or by path below the groups' common folder where basenames
    repeat. None when a group's runs sit side by side with another group's (e.g. in one grid sweep)."""
    paths = [[os.path.abspath(r.root) for r in runs] for runs in groups]
    folders = []
    for index, own in enumerate(paths):
        others = [p for j, group in enumerate(paths) if j != index for p in group]
        folder = os.path.commonpath(own)
        if any(_inside(p, folder) for p in others):
            return None
        while os.path.dirname(folder) != folder and not any(_inside(p, os.path.dirname(folder)) for p in others):
            folder = os.path.dirname(folder)
        folders.append(folder)
    names = [os.path.basename(f) for f in folders]
    if len(set(names)) < len(names) or not all(names):
        common = os.path.commonpath(folders)
        names = [os.path.relpath(f, common) for f in folders]
    return names if len(set(names)) == len(names) and "." not in names else None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _show(value) -> str:
    """A config value as YAML writes it: null, true, [64, 64]."""
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# ---------------------------------------------------------------------------- curves and table


def group_curves(group: Group, statistic_name: str) -> GroupCurves:
    """Each run's return on a common env-step grid, and the statistic across runs with its band."""
    seeds = [(np.array(column(r.eval_rows, "env_steps")), np.array(column(r.eval_rows, "average_return")))
             for r in group.runs]
    start = min(float(x[0]) for x, _ in seeds)
    end = max(float(x[-1]) for x, _ in seeds)
    grid = np.linspace(start, end, CURVE_POINTS)
    curves = np.stack([np.interp(grid, x, y) for x, y in seeds])
    statistic = stats.STATISTICS[statistic_name]
    low, high = stats.band(curves, statistic)
    return GroupCurves(group.label, grid, seeds, statistic(curves, axis=0), low, high)


TABLE_COLUMNS = ("group", "runs", "solved", "env steps to solve (median)", "wall s to solve (median)",
                 "final return (IQM)", "best return (IQM)", "final policy, fresh episodes (IQM)",
                 "final policy solves")
SHARE_COLUMNS = ("solved", "final policy solves")  # fractions of the group's runs (k/n in the markdown table)


def solve_target(run: RunRecord) -> Optional[float]:
    """The average return that counts as solved for `run`: its config's, else its env's registered threshold."""
    from dqn_cartpole.env_ids import reward_threshold

    target = run.config_value("evaluation.solve_return")
    return target if target is not None else reward_threshold(run.config_value("env.id") or "CartPole-v1")


def final_policy_scores(runs: Sequence[RunRecord]) -> list[tuple[float, Optional[float]]]:
    """(score, solve target) of each run whose policy/final was scored at its end over fresh episodes (a run that
    did not stop on a solve: the fixed-budget protocol)."""
    return [(r.get("final_policy_return"), solve_target(r)) for r in runs if r.get("final_policy_return") is not None]


def group_row(group: Group) -> dict:
    """One table row; solve times are over the solved runs only; [low, high] is the 95% bootstrap CI. The final
    policy's columns are over the runs whose policy/final was scored at their end (`evaluation.final_episodes`
    fresh episodes): its IQM, and the share of those runs whose score reaches the solve target."""
    runs = group.runs
    solved = [r for r in runs if r.solved]
    checked = [r for r in runs if r.solve_checked]
    steps = [r.get("solved_env_steps") for r in solved if r.get("solved_env_steps") is not None]
    wall = [r.get("solved_wall_s") for r in solved if r.get("solved_wall_s") is not None]
    final = [r.get("final_return") for r in runs if r.get("final_return") is not None]
    best = [r.get("best_return") for r in runs if r.get("best_return") is not None]
    scored = final_policy_scores(runs)
    holds = [target is not None and score >= target for score, target in scored]
    return {"group": group.label, "runs": len(runs), "checked": len(checked),
            "solved": len(solved) / len(checked) if checked else float("nan"),
            "env steps to solve (median)": stats.estimate(steps, stats.median),
            "wall s to solve (median)": stats.estimate(wall, stats.median),
            "final return (IQM)": stats.estimate(final, stats.iqm),
            "best return (IQM)": stats.estimate(best, stats.iqm),
            "final policy, fresh episodes (IQM)": stats.estimate([score for score, _ in scored], stats.iqm),
            "final policy solves": sum(holds) / len(holds) if holds else None, "scored": len(holds)}


def markdown_table(rows: Sequence[dict], groups: Sequence[Group]) -> str:
    digits = {"wall s to solve (median)": 1, "final return (IQM)": 1, "best return (IQM)": 1,
              "final policy, fresh episodes (IQM)": 1}
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for row in rows:
        cells = [row[c].format(digits.get(c, 0)) if isinstance(row[c], stats.Estimate) else str(row[c])
                 for c in TABLE_COLUMNS]
        cells[2] = solved_cell(row)
        share = row["final policy solves"]
        cells[-1] = "-" if share is None else f"{round(share * row['scored'])}/{row['scored']} ({share:.0%})"
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Medians and IQMs with [95% bootstrap CI] across runs; solve times over the solved runs only. "
                 "Final policy: policy/final, the weights at the last step of a run that did not stop on a solve, "
                 "scored over evaluation.final_episodes fresh greedy episodes at its end (the fixed-budget "
                 "protocol), and the share of those runs whose score reaches the solve target.")
    if any(row["checked"] < row["runs"] for row in rows):
        lines.append("Solved counts only the runs that checked for a solve; a run from before the check ran in "
                     "every run (with evaluation.stop_when_solved: false) did not, and its best return is not a solve.")
    if groups and not groups[0].named_by_keys:
        lines += ["", "The config keys that differ between the groups (every other key that applies is the same):",
                  "", "| key | " + " | ".join(g.label for g in groups) + " |", "|" + "---|" * (len(groups) + 1)]
        for key in groups[0].settings:
            lines.append(f"| {key} | " + " | ".join(_show(g.settings[key]) for g in groups) + " |")
    return "\n".join(lines) + "\n"


def solved_cell(row: dict) -> str:
    """`3/5 (60%)` of the runs that checked for a solve; says how many did not check, or that none did."""
    runs, checked = row["runs"], row["checked"]
    if not checked:
        return "no solve check (stop_when_solved: false)"
    cell = f"{round(row['solved'] * checked)}/{checked} ({row['solved']:.0%})"
    return cell if checked == runs else f"{cell}; {runs - checked} of {runs} not checked"


def csv_table(rows: Sequence[dict]) -> str:
    header = []
    for name in TABLE_COLUMNS:
        header += [name] if name in ("group", "runs") else ["solve checked", "solved fraction"] if name == "solved" \
            else [f"{name} fraction"] if name in SHARE_COLUMNS else [name, f"{name} ci_low", f"{name} ci_high"]
    lines = []
    for row in rows:
        cells = []
        for name in TABLE_COLUMNS:
            value = row[name]
            cells += [value.value, value.low, value.high] if isinstance(value, stats.Estimate) \
                else [row["checked"], value] if name == "solved" else [value]
        lines.append(["" if c is None or (isinstance(c, float) and np.isnan(c)) else c for c in cells])
    return csv_text(header, lines)


def run_compare(runs: Sequence[RunRecord], folder: str, statistic_name: str = "iqm") -> str:
    """Writes returns.png, table.md and table.csv into `folder`; returns the markdown table."""
    groups = group_runs(runs)
    os.makedirs(folder, exist_ok=True)
    figures.plot_returns([group_curves(g, statistic_name) for g in groups], os.path.join(folder, "returns.png"),
                         statistic_name)
    rows = [group_row(g) for g in groups]
    table = markdown_table(rows, groups)
    write_text_atomic(os.path.join(folder, "table.md"), table)
    write_text_atomic(os.path.join(folder, "table.csv"), csv_table(rows))
    write_page(folder, runs)
    return table


def write_page(folder: str, runs: Sequence[RunRecord]) -> str:
    """report.html next to the plot and tables: the same kind of page as a run's, linking each run's page."""
    from dqn_cartpole.report.html import render_collection_page

    links = [(os.path.basename(os.path.normpath(run.root)), run.layout.report) for run in runs]
    return render_collection_page(os.path.join(folder, PAGE_FILE), f"Compare: {len(runs)} runs",
                                  [os.path.join(folder, "returns.png")], os.path.join(folder, "table.csv"), links)
