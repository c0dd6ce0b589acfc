"""A learner's compiled chunk, cancelled from another thread when its Reverb read can no longer end.

The learner reads the server inside its compiled chunk (the queue, or the shared table). Reverb
retries a server that is gone for ever, and no signal handler runs meanwhile. A chunk run inside
`ChunkCanceller.running()` is registered with a TensorFlow `CancellationManager`: `cancel()`
(from the status watch when the server stopped answering, or from the signal watchdog when a
stop request is not answered) makes the blocked read, and so the chunk's call, raise
`tf.errors.CancelledError` in the main thread, which can then checkpoint and leave.

A chunk is cancelled only while it waits on a read: everything it read before is in the learner's
variables, its last gradient step complete (the read for a step comes before the step; see
`learner.LearnerData.cut_short`). The manager is one-shot: once cancelled, every later chunk fails at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator, Optional


class ChunkCanceller:
    """Makes the chunks run in `running()` cancellable; `cancel(reason)` from any thread."""

    def __init__(self) -> None:
        from tensorflow.python.eager import cancellation  # pylint: disable=import-outside-toplevel

        self._cancellation = cancellation
        self._manager = cancellation.CancellationManager()
        self.in_chunk = False
        self.reason: Optional[str] = None

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """A compiled call inside this block is cancelled by `cancel()`."""
        self.in_chunk = True
        try:
            with self._cancellation.CancellationManagerContext(self._manager):
                yield
        finally:
            self.in_chunk = False

    def cancel(self, reason: str) -> None:
        """Cancels the running chunk (and every later one); the first reason is kept."""
        if self.reason is None:
            self.reason = reason
        self._manager.start_cancel()

    def cancel_if_still_running(self, after_s: float, reason: str) -> None:
        """In a background thread: `after_s` from now, cancels the chunk if one is still running (a chunk that
        answers a stop request takes a fraction of a second; one blocked on a read never ends)."""

        def later() -> None:
            time.sleep(after_s)
            if self.in_chunk:
                self.cancel(reason)

        threading.Thread(target=later, name="chunk-canceller", daemon=True).start()
