"""`sweep` and `compare`: the experiment commands' cores as functions (thin calls into `experiments`).

A sweep trains its runs as the CLI's sweep does, in train processes of their own, several at a time, or on a Ray
cluster (not in this process: its runs are independent processes, on every core); `compare` reads finished runs and writes the plot and
the table. Both take the commands' input and raise the commands' one-line `UserError`s.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from dqn_cartpole.api.configs import Overrides, override_items, shortcut_items
from dqn_cartpole.api.run import Run, RunFailed
from dqn_cartpole.config import locate_config
from dqn_cartpole.errors import UserError

RunLike = Union[Run, str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Comparison:
    """What `compare` wrote: `folder` holds returns.png, table.md, table.csv and report.html; `table` is the
    markdown table; `cells`, its rows as printed. In Jupyter it shows the plot and the table."""

    folder: str
    table: str
    cells: tuple = field(default=(), repr=False)  # compare_table.cells of each group's row

    @property
    def plot(self) -> str:
        return os.path.join(self.folder, "returns.png")

    def __str__(self) -> str:
        return self.table

    def _repr_html_(self) -> str:
        from dqn_cartpole.api.display import data_uri
        from dqn_cartpole.experiments.compare_table import TABLE_COLUMNS
        from dqn_cartpole.report import html

        image = data_uri(self.plot, "image/png")
        figure = f'<img src="{image}" alt="average return" style="max-width: 100%">' if image else ""
        return figure + html.table(TABLE_COLUMNS, self.cells, key_columns=1)


def compare(runs: Iterable[RunLike], output_dir: "str | os.PathLike[str] | None" = None, *,
            name: Optional[str] = None, statistic: str = "iqm") -> Comparison:
    """`python -m dqn_cartpole compare RUNS...`: groups the finished runs (folders, sweep folders, globs or `Run`s) by
    the config keys that differ and compares the groups across their seeds. Writes into `output_dir` (default:
    outputs/compare/<name or time>)."""
    from dqn_cartpole.experiments import compare as compare_module

    if statistic not in ("iqm", "mean"):
        raise UserError(f"statistic: must be one of iqm, mean, got {statistic!r}")
    paths = [os.fspath(run.path if isinstance(run, Run) else run) for run in runs]
    if not paths:
        raise UserError("compare: give at least one run or sweep folder")
    records = compare_module.load_runs(paths)
    folder = compare_module.output_folder(None if output_dir is None else os.fspath(output_dir), name)
    from dqn_cartpole.experiments.compare_table import cells

    found = compare_module.compare(records, folder, statistic)
    return Comparison(folder, found.markdown, tuple(tuple(cells(row)) for row in found.rows))


def grid_texts(grid: Optional[Mapping[str, Sequence[Any]]]) -> list[str]:
    """`{"agent.learning_rate": [1e-3, 2e-3]}` as `--grid` takes it: `agent.learning_rate=[0.001, 0.002]`."""
    texts = []
    for key, values in (grid or {}).items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise UserError(f"grid: {key}: expected a list of values, got {type(values).__name__} {values!r}")
        texts.append(f"{key}={json.dumps(list(values))}")
    return texts


def sweep(config: "str | os.PathLike[str] | None" = None, *, seeds: Union[str, Iterable[int]] = "0",
          grid: Optional[Mapping[str, Sequence[Any]]] = None, overrides: Overrides = None,
          jobs: Optional[int] = None, name: Optional[str] = None, progress: bool = True, ray: bool = False,
          address: Optional[str] = None, track: Optional[str] = None, population: bool = False) -> list[Run]:
    """`python -m dqn_cartpole sweep`: every (grid point, seed) pair as its own run folder under
    <output.root>/sweeps/NAME/, `jobs` runs at a time (reused train processes, as the command's); calling it again
    with the same name continues it. With `ray=True`, as `sweep --ray`: the runs on the Ray cluster at `address`
    (else RAY_ADDRESS, else a local Ray instance started for the call), their folders gathered into the same sweep
    folder. With `track` ("mlflow" or "wandb", as `--track`), every run is sent there in the sweep's group. With
    `population=True`, as `sweep --population`: each grid point's seeds train as one population (one process, one
    batched graph; `jobs` populations at a time), into the same run folders. Returns the members' Runs; raises RunFailed (with every member) when one failed."""
    import argparse

    from dqn_cartpole.cli import experiments as commands
    from dqn_cartpole.experiments import sweep as sweep_module

    if address is not None and not ray:
        raise UserError("sweep(address=...): only with ray=True")
    commands.check_population_runner(population, ray, "sweep(population=True)")
    args = argparse.Namespace(ray=ray, address=address, quiet=not progress, jobs=jobs)
    runner = commands.ray_runner(args, "sweep")  # Ray's checks (the extra installed, the address) before any folder
    seeds_text = seeds if isinstance(seeds, str) else ",".join(str(seed) for seed in seeds)
    config_path = locate_config(None if config is None else os.fspath(config))
    items = [item.item for item in shortcut_items(None, None, None, track)] + override_items(overrides)
    plan = sweep_module.plan_sweep(config_path, seeds_text, grid_texts(grid), items, jobs, name, population)
    outcome = commands.run_planned_sweep(plan, args, runner)
    runs = [Run(member.run_dir) for member in plan.members if os.path.isdir(member.run_dir)]
    if outcome.failed:
        name_, status, error, log = outcome.failed[0]
        raise RunFailed(f"{len(outcome.failed)} of {len(plan.members)} sweep runs failed, first {name_} (exit "
                        f"{status}): {error or '?'} [log: {log}]", runs)
    return runs
