"""The reused train process's own side (`experiments/train_worker.py` starts it and speaks to it, through
`processes.child`): TensorFlow imported once, then one run a message, trained in this process through the Python API
(`dqn_cartpole.train`).

A message is a `train` or `train --resume` argv and a log path; the answer is the run's exit status (the CLI's) and
whether this worker takes another run. `experiments/train_worker.py` says which runs come here, and when a worker
ends.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Optional

from dqn_cartpole.processes.child import serve
from dqn_cartpole.processes.commands import parse_train_argv
from dqn_cartpole.processes.peak_memory import peak_rss_mb

MAX_RSS_MB = 1500  # a worker ends once its peak memory passed this (a default run peaks at ~600 MB in a worker)


def serve_child(max_rss_mb: float = MAX_RSS_MB) -> int:
    """The worker's life: TensorFlow once, then one run a message until stdin closes or a run ends it; it exits
    with that run's status, at once (TensorFlow's teardown would only cost time)."""
    def answer(request: tuple, reply) -> Optional[int]:
        status = run_logged(*request)
        goes_on = status == 0 and (peak_rss_mb() or 0.0) <= max_rss_mb
        reply((status, goes_on))
        return None if goes_on else status

    status = serve(answer, prepare)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def prepare() -> None:
    """Signals at their defaults between runs (a run sets its own), and every import a run needs."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from dqn_cartpole.console.imports import import_tensorflow

    import_tensorflow()
    from dqn_cartpole.training.loop import run_ops_on_one_thread

    run_ops_on_one_thread()  # before any op: as a fresh default run sets it for itself
    import dqn_cartpole.training.session  # noqa: F401  pylint: disable=unused-import  # the rest of the imports


def run_logged(argv: list, log_path: str) -> int:
    """One run, its output (file descriptors 1 and 2, so TensorFlow's own lines too) appended to `log_path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        return train_here(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def train_here(argv: list) -> int:
    """`python -m dqn_cartpole ARGV` (a `train` argv) in this process; the exit status the CLI would give."""
    from dqn_cartpole.api.run import RunFailed
    from dqn_cartpole.api.training import train
    from dqn_cartpole.console.exit_status import EXIT_FAILED, EXIT_USAGE, for_signal
    from dqn_cartpole.errors import UserError

    args = parse_train_argv(argv)
    try:
        if args.resume:
            run = train(resume=args.resume, overrides=args.set or None, progress=not args.quiet)
        else:
            run = train(args.config, args.output_dir, overrides=args.set or None, progress=not args.quiet)
    except (UserError, RunFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UserError) else EXIT_FAILED
    except KeyboardInterrupt:  # a second Ctrl-C: the run stopped at once
        return for_signal(signal.SIGINT)
    except Exception:  # pylint: disable=broad-except  # as a fresh process's traceback, then its status
        traceback.print_exc()
        return EXIT_FAILED
    stopped = run.read().get("stopped_by")
    return for_signal(signal.Signals[stopped]) if stopped else 0

