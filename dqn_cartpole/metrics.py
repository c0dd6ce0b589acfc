"""The run's metrics: CSV files (one for training, one for evaluation) and TensorBoard scalars."""

from __future__ import annotations

import csv
import os
from typing import Mapping, Optional, Sequence

import tensorflow as tf

TRAIN_COLUMNS = ("train_step", "env_steps", "loss", "epsilon", "replay_size", "replay_inserts",
                 "replay_samples", "samples_per_insert", "wall_s")
EVAL_COLUMNS = ("train_step", "env_steps", "average_return", "average_episode_length", "num_episodes", "wall_s")


class CsvLog:
    """Appends rows to a CSV file with a fixed header; flushed after every row."""

    def __init__(self, path: str, columns: Sequence[str]):
        self.path, self.columns = path, tuple(columns)
        new = not os.path.exists(path) or os.path.getsize(path) == 0
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


def read_csv(path: str) -> list[dict[str, str]]:
    """All rows of a metrics CSV (empty list if the file is missing)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


class Scalars:
    """TensorBoard scalars under `train/` and `eval/`; a no-op when disabled."""

    def __init__(self, logdir: Optional[str]):
        self._writer = tf.summary.create_file_writer(logdir) if logdir else None

    def write(self, prefix: str, step: int, values: Mapping[str, float]) -> None:
        if self._writer is None:
            return
        with self._writer.as_default(step=step):
            for name, value in values.items():
                if value is not None:
                    tf.summary.scalar(f"{prefix}/{name}", value)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
