"""A role's end once its work is done and its files are closed: at once (`os._exit`), not through the interpreter's
teardown. There, the C++ threads of a Reverb client whose server is gone can abort the process (`terminate called
without an active exception`, exit status -6: seen once in CI, after a learner had written its checkpoint and summary
for a lost server). A warm start-up process's fork tells its warm process how it ended first (`report_with`)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Callable, NoReturn, Optional

_report: Optional[Callable[[int], None]] = None


def report_with(report: Callable[[int], None]) -> None:
    """`report(status)` runs just before `exit_now` ends the process (a warm fork's status pipe)."""
    global _report  # pylint: disable=global-statement
    _report = report


def exit_now(status: int) -> NoReturn:
    """Flushes Python's output and logging, reports `status` if asked to, and ends the process with it."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing more can reach it
            stream.flush()
    logging.shutdown()
    if _report is not None:
        _report(status)
    os._exit(status)  # pylint: disable=protected-access
