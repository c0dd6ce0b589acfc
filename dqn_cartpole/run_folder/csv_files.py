"""Every CSV file the package writes or reads: the metrics logs (appended row by row), the tables of sweeps,
studies and comparisons (written whole, atomically), and reading them back."""

from __future__ import annotations

import csv
import io
import os
from typing import Iterable, Mapping, Sequence

from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder.atomic import write_text_atomic


def csv_text(columns: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A header and rows as CSV text (None is an empty cell)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    writer.writerows(rows)
    return out.getvalue()


def dict_rows(columns: Sequence[str], rows: Iterable[Mapping]) -> list[list]:
    """Dict rows as lists in `columns`' order (a missing key is an empty cell)."""
    return [[row.get(c) for c in columns] for row in rows]


def write_csv_atomic(path: str, columns: Sequence[str], rows: Iterable[Sequence]) -> None:
    """A whole CSV file, written atomically (`atomic.write_text_atomic`)."""
    write_text_atomic(path, csv_text(columns, rows))


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
    write_csv_atomic(path, columns, dict_rows(columns, read_csv(path)))


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
