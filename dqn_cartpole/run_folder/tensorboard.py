"""TensorBoard scalars of a run (the CSVs are in `run_folder.metrics`)."""

from __future__ import annotations

from typing import Callable, Mapping, Optional

import tensorflow as tf


class Scalars:
    """TensorBoard scalars under `train/` and `eval/`; a no-op when disabled. A row's scalars are written by one
    compiled call per set of names (a dozen eager `tf.summary.scalar` calls cost ~5 ms, which sixteen seeds of a
    population pay at every train row)."""

    def __init__(self, logdir: Optional[str]):
        self._writer = tf.summary.create_file_writer(logdir) if logdir else None
        self._compiled: dict[tuple, Callable] = {}

    def write(self, prefix: str, step: int, values: Mapping[str, float]) -> None:
        if self._writer is None:
            return
        present = {f"{prefix}/{name}": float(value) for name, value in values.items() if value is not None}
        names = tuple(present)
        if names not in self._compiled:
            self._compiled[names] = self._compile(names)
        self._compiled[names](tf.constant(step, tf.int64), tf.constant(list(present.values()), tf.float32))

    def _compile(self, names: tuple) -> Callable:
        writer = self._writer

        @tf.function(autograph=False)
        def write_row(step: tf.Tensor, values: tf.Tensor) -> None:
            with writer.as_default(step=step):
                for index, name in enumerate(names):
                    tf.summary.scalar(name, values[index])

        return write_row

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
