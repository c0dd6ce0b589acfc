"""The side process that streams a running run's metrics to MLflow (`python -m dqn_cartpole.tracking.follower`,
started by `stream.start_stream`): it opens (or, for a resumed run, continues) the folder's MLflow run, says where
the run goes in its first lines, then every few seconds sends the metrics CSVs' new rows, until its stdin closes (the
run ended: one last send, then it exits; the run's end sends the rest, as `send.send_run`).

A process of its own, not a thread: MLflow's import takes 2 to 5 s of CPU, which a thread would spend holding the
trainer's GIL; niced, and waiting for the run's first row, this one gives way to the training. The run folder is its
whole input (`CsvTail`); a failure (a server that stops answering, a full disk) is one warning line, after which it
sends nothing more and the run goes on.
"""

from __future__ import annotations

import csv
import json
import os
import select
import signal
import sys
from typing import Callable

from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.tracking.ledger import read_ledger
from dqn_cartpole.tracking.sent import EVAL_PREFIX, rows

# As the run's plotter and video renderer: below the training, whose time to its policy it then leaves as it was
# (scripts/benchmark.py --tracking, 5 seeds interleaved: x1.003 at 10, x1.034 at 5). On a machine busy with other
# work, its metrics come later; the run's end waits for its last send.
NICENESS = 10
START_POLL_S = 0.5  # how often it looks for the run's first metrics row


class CsvTail:
    """The complete rows appended to a metrics CSV since the last read (a row still being written waits for its
    newline; a file rewritten shorter, as a resume may, is read again from its start)."""

    def __init__(self, path: str):
        self.path, self.offset, self.header = path, 0, None

    def new_rows(self) -> list:
        try:
            with open(self.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self.offset:
                    self.offset, self.header = 0, None
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = list(csv.reader(complete.decode("utf-8", "replace").splitlines()))
        if self.header is None and lines:
            self.header, lines = lines[0], lines[1:]
        return [dict(zip(self.header, line)) for line in lines if line]


def stopped_within(seconds: float) -> bool:
    """Waits up to `seconds` for stdin to close (the run ended, or its process died); whether it did."""
    readable, _, _ = select.select([sys.stdin], [], [], seconds)
    return bool(readable) and not sys.stdin.buffer.read1(4096)


def first_row_or_end(layout: RunLayout) -> bool:
    """Waits for the run's first metrics row (its first evaluation), or its end (then True). MLflow's import, seconds
    of CPU, then runs beside the training loop, not beside the trainer's own start-up (TensorFlow's import, its
    helper processes'), which already keeps two cores busy (measured: x1.059 of the untracked time to the policy
    without this wait, x1.034 with it, both at niceness 5)."""
    while not (os.path.exists(layout.eval_metrics) or os.path.exists(layout.train_metrics)):
        if stopped_within(START_POLL_S):
            return True
    return False


def follow(run_dir: str, output_root: str, tracking: dict, say: Callable[[str], None]) -> int:
    """Opens the run, says where it goes, then streams the new rows until stdin closes; 0, or 1 after a failure
    (said in one line)."""
    from dqn_cartpole.tracking import mlflow_run
    from dqn_cartpole.tracking.send import one_line

    uri = mlflow_run.tracking_uri(output_root)
    layout = RunLayout(run_dir)
    ended = first_row_or_end(layout)
    step = "open the run"
    try:
        client = mlflow_run.connect(uri)
        continued = read_ledger(run_dir, mlflow_run.BACKEND, uri) is not None
        ledger = mlflow_run.open_run(client, uri, run_dir, tracking["project"], tracking["run_name"],
                                     tracking["tags"], mlflow_run.artifact_location(uri))
        say(mlflow_run.run_line(client, ledger, continued))
        train, evaluations = CsvTail(layout.train_metrics), CsvTail(layout.eval_metrics)
        step = "stream the metrics"
        while True:  # what is new at once, then every interval_s, and once more when the run ended
            ledger = mlflow_run.log_rows(client, run_dir, ledger, rows(train.new_rows(), ""),
                                         rows(evaluations.new_rows(), EVAL_PREFIX))
            if ended:
                return 0
            ended = stopped_within(tracking["interval_s"])
    except Exception as exc:  # pylint: disable=broad-except  # tracking never fails the run
        say(f"warning: --track mlflow: could not {step} at {uri} ({one_line(exc)}); the run goes on, and is sent "
            f"to MLflow once it ends")
        return 1


def main() -> int:
    os.nice(NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the run; its end closes our stdin
    run_dir, output_root, tracking = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    from dqn_cartpole.tracking.send import quiet_libraries

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        import mlflow  # pylint: disable=import-outside-toplevel,unused-import  # first: it sets its loggers' levels
    except Exception as exc:  # pylint: disable=broad-except  # a broken install: the run goes on, one line says so
        from dqn_cartpole.tracking.send import one_line

        say(f"warning: --track mlflow: cannot import mlflow ({one_line(exc)}); the run goes on, and is sent to "
            f"MLflow once it ends")
        return 1
    with quiet_libraries():
        return follow(run_dir, output_root, tracking, say)


if __name__ == "__main__":
    sys.exit(main())
