"""`compare`: group runs by the config keys that differ and report each group across its seeds.

Reads run folders through `dqn_cartpole.run_folder` only (no TensorFlow). Each run's evaluation curve (average
return against env steps) is interpolated onto its group's common grid of env steps; a run that stopped (on its
solve, or at its budget) keeps its last evaluated return, that of the policy it holds, to the grid's end, so the
curve across seeds is never drawn over the runs still going only. The statistics are rliable's (`stats`); the table
is `compare_table`'s, the verdicts `verdicts`', the page `compare_page`'s.
"""

from __future__ import annotations

import datetime as dt
import glob
import os
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import compare_page, compare_table, figures, stats, verdicts
from dqn_cartpole.report import changed_keys
from dqn_cartpole.run_folder import RunRecord, read_run
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.metrics import column
from dqn_cartpole.run_folder.record import find_runs

IGNORED_KEYS = ("training.seed",)
IGNORED_SECTIONS = ("output", "tracking")  # where a run went, not what it trained
PLOTS = ("returns.png", "solved.png", "profile.png")
OUTPUT_FILES = (*PLOTS, "table.md", "table.csv", "report.html")
PAGE_FILE = "report.html"
CURVE_POINTS = 100
MAX_LABEL_KEYS = 3  # more differing keys than this: groups are named by folder (or lettered), keys listed below


@dataclass(frozen=True)
class Group:
    """Runs that share every config value they read, except the seed and output keys."""

    label: str
    settings: dict  # differing key -> this group's value (changed_keys.NOT_READ where its runs do not read it)
    runs: tuple
    named_by_keys: bool = True  # the label says the differing keys' values (else they are listed under the table)
    shown: dict = field(default_factory=dict)  # differing key -> its value as printed (changed_keys.show_values)


@dataclass(frozen=True)
class GroupCurves:
    """A group's returns on its env-step grid: each run's own (x, y), and across runs the statistic and its band."""

    label: str
    x: np.ndarray
    seeds: list  # (x, y) of each run, as evaluated: its held return runs on from its last x to x[-1]
    line: np.ndarray
    low: np.ndarray
    high: np.ndarray


@dataclass(frozen=True)
class Comparison:
    """What `compare` found: the groups, their table rows, the verdicts, and the files it wrote."""

    groups: list
    rows: list
    verdicts: list
    folder: str
    markdown: str

    @property
    def page(self) -> str:
        return os.path.join(self.folder, PAGE_FILE)


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


def acting_configs(runs: Sequence[RunRecord]) -> list[dict]:
    """Each run's flat config with the keys it does not read as `changed_keys.NOT_READ` (a single-process run does
    not read the distributed section, a DQN run the C51 keys, a run without noisy layers noisy_sigma0)."""
    return [changed_keys.acting_values(r.config, flat_config(r), os.path.isdir(r.layout.roles)) for r in runs]


def differing_keys(runs: Sequence[RunRecord]) -> list[str]:
    """The config keys whose values differ among the runs that read them (`changed_keys.differing`)."""
    return changed_keys.differing(acting_configs(runs))


def group_runs(runs: Sequence[RunRecord]) -> list[Group]:
    """Groups by the config keys whose values differ among the runs that read them. Labels: those keys' values when
    there are few; else each group's own folder (a sweep's name), else a letter; the keys are then listed under the
    table."""
    acting = acting_configs(runs)
    differing = changed_keys.differing(acting)
    buckets: dict[tuple, list] = {}
    for run, values in zip(runs, acting):
        buckets.setdefault(tuple(repr(values.get(k)) for k in differing), []).append((run, values))
    settings = [{k: members[0][1].get(k) for k in differing} for members in buckets.values()]
    members = [tuple(run for run, _ in group) for group in buckets.values()]
    shown = {k: dict(zip(range(len(settings)), changed_keys.show_values([s[k] for s in settings])))
             for k in differing}
    if not differing:
        labels, by_keys = ["all runs"] * len(members), True
    elif len(differing) <= MAX_LABEL_KEYS:
        labels = [", ".join(f"{k}={shown[k][i]}" for k in differing) for i in range(len(settings))]
        by_keys = True
    else:
        labels = folder_labels(members) or [chr(ord("A") + i) if i < 26 else str(i + 1) for i in range(len(members))]
        by_keys = False
    return [Group(label, setting, runs_of, by_keys, {k: shown[k][i] for k in differing})
            for i, (label, setting, runs_of) in enumerate(zip(labels, settings, members))]


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


# ---------------------------------------------------------------------------- curves


def group_curves(group: Group, statistic_name: str) -> GroupCurves:
    """Each run's return on the group's env-step grid, and the statistic across runs with its 95% band. A run that
    stopped before the grid's end keeps its last evaluated (held) return (np.interp holds the end values), so no
    run drops out of the statistic."""
    seeds = [(np.array(column(r.eval_rows, "env_steps"), dtype=float),
              np.array(column(r.eval_rows, "average_return"), dtype=float)) for r in group.runs]
    start = min(float(x[0]) for x, _ in seeds)
    end = max(float(x[-1]) for x, _ in seeds)
    grid = np.linspace(start, end, CURVE_POINTS)
    curves = np.stack([np.interp(grid, x, y) for x, y in seeds])
    line, low, high = stats.band(curves, statistic_name)
    return GroupCurves(group.label, grid, seeds, line, low, high)


def solve_steps(group: Group) -> tuple[list[float], int]:
    """(the env steps at which each solve-checking run of `group` solved, inf for one that never did; how many of
    its runs checked)."""
    checked = [r for r in group.runs if r.solve_checked]
    steps = [float(r.get("solved_env_steps")) if r.solved and r.get("solved_env_steps") is not None else np.inf
             for r in checked]
    return steps, len(checked)


# ---------------------------------------------------------------------------- the whole comparison


def run_compare(runs: Sequence[RunRecord], folder: str, statistic_name: str = "iqm") -> str:
    """Writes the plots, table.md, table.csv and report.html into `folder`; returns the markdown of table.md."""
    return compare(runs, folder, statistic_name).markdown


def compare(runs: Sequence[RunRecord], folder: str, statistic_name: str = "iqm") -> Comparison:
    """Groups `runs`, measures each group across its seeds, says which group is better than the first (or that its
    seeds cannot tell), and writes it all into `folder`."""
    groups = group_runs(runs)
    os.makedirs(folder, exist_ok=True)
    rows = [compare_table.group_row(g) for g in groups]
    found = verdicts.against_first(groups)
    draw_plots(groups, folder, statistic_name)
    markdown = compare_table.markdown(rows, groups, found)
    write_text_atomic(os.path.join(folder, "table.md"), markdown)
    write_text_atomic(os.path.join(folder, "table.csv"), compare_table.csv_table(rows))
    comparison = Comparison(groups, rows, found, folder, markdown)
    compare_page.write(comparison, statistic_name)
    return comparison


def draw_plots(groups: Sequence[Group], folder: str, statistic_name: str) -> None:
    """returns.png (the statistic of the return, runs held at their last evaluation), solved.png (the share of
    runs solved by each env step) and profile.png (the performance profile of the final policies' scores)."""
    curves = [group_curves(g, statistic_name) for g in groups]
    figures.plot_returns(curves, os.path.join(folder, "returns.png"), statistic_name)
    end = max(float(c.x[-1]) for c in curves)
    figures.plot_solved({g.label: solve_steps(g) for g in groups}, end, os.path.join(folder, "solved.png"))
    scores = {g.label: [s.score for s in compare_table.final_scores(g.runs)] for g in groups}
    targets = [s.target for g in groups for s in compare_table.final_scores(g.runs) if s.target is not None]
    figures.plot_profile(scores, max(targets) if targets else None, os.path.join(folder, "profile.png"))
