"""The run's metrics CSVs: one row per train log and one per evaluation, flushed as they are written."""

from __future__ import annotations

import csv
import os
from typing import Mapping, Optional, Sequence

# New columns go at the end: a run resumed from files with an older header gets them added (see CsvLog).
TRAIN_COLUMNS = ("train_step", "env_steps",
                 "loss",  # the mean over the log interval's iterations (each iteration's last gradient step)
                 "epsilon", "replay_size", "replay_inserts",
                 "replay_samples", "samples_per_insert", "wall_s",
                 "mean_max_q",  # the online network's mean max_a Q(s, a) over a fixed set of states
                 "train_steps_per_s",  # since the previous row of this process (empty in its first)
                 # A learner's: its train step minus the train step of the weights that collected the
                 # sampled items, mean and max over the log interval's batches (empty in one process).
                 "policy_lag", "policy_lag_max",
                 "loss_max",  # the largest loss of the interval
                 # The collect (epsilon-greedy) policy's episodes that ended in the interval: their mean return
                 # and how many (empty for a learner, whose collectors are other processes).
                 "collect_return", "collect_episodes")
EVAL_COLUMNS = ("train_step", "env_steps", "average_return", "average_episode_length", "num_episodes", "wall_s",
                "min_return", "max_return", "std_return",  # the spread across the evaluation's episodes
                "average_discounted_return",  # sum of gamma^t r_t from each episode's first state
                "average_max_q_at_reset")  # mean of max_a Q(s0, a) over those first states: its estimate


class CsvLog:
    """Appends rows to a CSV file with a fixed header; flushed after every row.

    An existing file written with other columns (an older version, then resumed) is first
    rewritten with `columns` as its header, its old rows kept and new cells left empty.
    """

    def __init__(self, path: str, columns: Sequence[str]):
        self.path, self.columns = path, tuple(columns)
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        if not new and read_header(path) != list(self.columns):
            rewrite_with_columns(path, self.columns)
        self._file = open(path, "a", newline="", encoding="utf-8")  # pylint: disable=consider-using-with
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns)
        if new:
            self._writer.writeheader()
            self._file.flush()

    def write(self, row: Mapping[str, object]) -> None:
        self._writer.writerow({k: _fmt(row.get(k)) for k in self.columns})
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _fmt(value: object) -> object:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def read_header(path: str) -> list[str]:
    """The first row of a CSV file."""
    with open(path, newline="", encoding="utf-8") as handle:
        return next(csv.reader(handle), [])


def rewrite_with_columns(path: str, columns: Sequence[str]) -> None:
    """Rewrites a CSV file atomically with `columns` as its header; cells of dropped columns are lost."""
    from dqn_cartpole.run_folder.atomic import replacing

    rows = read_csv(path)
    with replacing(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
            handle.flush()
            os.fsync(handle.fileno())


def read_csv(path: str) -> list[dict[str, str]]:
    """All rows of a metrics CSV (empty list if the file is missing)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def read_numbers(path: str) -> list[dict[str, str]]:
    """`read_csv`, checking that every cell is a number or empty (the metrics CSVs hold nothing else).

    Raises UserError (one line: the file, the line, the column) for a cell that is not, e.g. a hand-edited
    or truncated file, so readers can convert any cell with float().
    """
    from dqn_cartpole.errors import UserError

    rows = read_csv(path)
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        for name, cell in row.items():
            if name is None or isinstance(cell, list):
                raise UserError(f"{path}: line {line} has more cells than the header has columns")
            if cell in (None, ""):
                continue
            try:
                float(cell)
            except ValueError:
                raise UserError(f"{path}: line {line}, column {name}: {cell!r} is not a number") from None
    return rows


def column(rows: list[dict[str, str]], name: str) -> list[float]:
    """One numeric column, skipping empty cells."""
    return [float(r[name]) for r in rows if r.get(name) not in (None, "")]


def number(text: Optional[str]) -> Optional[float]:
    """A CSV cell as a float, or None when empty."""
    return None if text in (None, "") else float(text)
