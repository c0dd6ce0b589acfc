"""The `plot RUN_DIR` and `report RUN_DIR` commands: redraw a run's plots and its report.html from disk."""

from __future__ import annotations

import os

from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder import read_run
from dqn_cartpole.run_folder.layout import EVAL_METRICS_FILE


def redraw_run(run_dir: str) -> list[str]:
    """Redraws every plot and report.html of a run folder; returns the written paths (report last).

    Raises UserError (one line) for a path that is not a run folder or has no metrics yet.
    """
    record = read_run(run_dir)
    if not os.path.isfile(record.layout.eval_metrics):
        raise UserError(f"{run_dir}: no {EVAL_METRICS_FILE} yet (the run stopped before its first evaluation); "
                        f"nothing to plot")
    from dqn_cartpole.report import figures  # matplotlib: only once the input is known to be good
    from dqn_cartpole.report.run_page import write_run_report

    paths = figures.plot_run(record.layout, record)
    return paths + [write_run_report(run_dir, record)]
