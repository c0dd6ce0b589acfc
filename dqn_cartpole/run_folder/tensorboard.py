"""TensorBoard scalars of a run (the CSVs are in `run_folder.metrics`)."""

from __future__ import annotations

from typing import Mapping, Optional

import tensorflow as tf


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
