"""The single-process run from start to end: what it says first, the training, then how it ended
(`outcome.RunEnd`). The CLI calls these once it has checked the input and holds the run folder's lock; the Python
API calls `run_here`, which trains in a process that goes on after the run (a notebook's kernel, a worker)."""

from __future__ import annotations

import os
import sys
from typing import Optional

from dqn_cartpole.config import Config
from dqn_cartpole.console.imports import heavy_imports, import_tensorflow
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.processes.commands import resume_command
from dqn_cartpole.run_folder.checkpointing import ResumePlan
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training.host import custom_gradients_released, shared_process
from dqn_cartpole.tracking.send import send_run
from dqn_cartpole.tracking.stream import streamed
from dqn_cartpole.training.outcome import RunEnd


def run_new(config: Config, run_dir: str, config_file: str, created: bool, quiet: bool) -> int:
    """A new run into `run_dir`; returns its exit status."""
    progress = Progress(config.training.num_iterations, enabled=not quiet)
    announce_new(config, run_dir, f" with {os.path.basename(config_file)}", progress)
    return run(config, run_dir, progress, None, created)


def announce_new(config: Config, run_dir: str, source: str, progress: Progress) -> None:
    """The first line of a new run (`source`: e.g. " with smoke.yaml")."""
    progress.message(f"Training {config.env.id}{source} (seed {config.training.seed}, replay "
                     f"{config.replay.backend}) -> {run_dir}")


def run_resumed(config: Config, run_dir: str, plan: ResumePlan, quiet: bool) -> int:
    """Continues the run in `run_dir` from the checkpoint `plan` found (or from the start); its exit status."""
    warn_about_checkpoints(run_dir, plan)
    progress = Progress(config.training.num_iterations, enabled=not quiet)
    announce_resume(config, run_dir, plan, progress)
    return run(config, run_dir, progress, plan, created=False)


def warn_about_checkpoints(run_dir: str, plan: ResumePlan) -> None:
    """A line for each checkpoint a resume cannot use, and one if none is left."""
    for bad in plan.bad:
        instead = f"using {os.path.basename(plan.found.path)} instead" if plan.found else "no other checkpoint"
        print(f"warning: checkpoint {bad.path} is {bad.reason}; {instead}", file=sys.stderr)
    if plan.found is None:
        print(f"warning: {run_dir} has no usable checkpoint (it stopped before writing one); "
              f"starting it again from iteration 0 with its config.yaml", file=sys.stderr)


def announce_resume(config: Config, run_dir: str, plan: ResumePlan, progress: Progress) -> None:
    """The first line of a resumed run."""
    start = f"{os.path.basename(plan.found.path)}" if plan.found else "the beginning"
    progress.message(f"Resuming {run_dir} ({config.env.id}, seed {config.training.seed}, replay "
                     f"{config.replay.backend}) from {start}")


def run(config: Config, run_dir: str, progress: Progress, plan: Optional[ResumePlan], created: bool) -> int:
    """Trains in this process, then writes summary.json and report.html and prints the summary."""
    # TensorFlow's import (about 3 s) waits until here, so the run's first line is already on the screen: this
    # module stays light (training/__init__ imports nothing heavy), and `heavy_imports` imports TensorFlow quietly.
    with heavy_imports():
        from dqn_cartpole.training.session import train

    with streamed(config, run_dir, progress.message):  # --track: where it goes, and its metrics as they come
        with RunEnd(run_dir, created, progress, resume_command(run_dir)) as end:
            end.summary = train(config, RunLayout(run_dir), progress, plan)
        status = end.finish()
    send_run(config, run_dir)  # --track: after the summary (nothing without it); at worst one warning line
    return status


def run_here(config: Config, run_dir: str, progress: Progress, plan: Optional[ResumePlan], created: bool,
             resume_hint: Optional[str] = None, change_hint: Optional[str] = None) -> tuple[int, Optional[str]]:
    """Trains in this process, which goes on afterwards, as the CLI's `run` does (summary.json, report.html, the
    summary on stdout), but prints no failure and leaves the process as it found it:

    * nothing is frozen on the heap (`host.shared_process`), and the gradient functions its traced train step put
      in TensorFlow's global registry are dropped (`host.custom_gradients_released`), so the run's objects are freed
      when it ends;
    * Keras' global state is cleared first, so the network's layers get the names a fresh process gives them;
    * the run's wall and CPU seconds count from now;
    * the seeds are set as in a fresh process (the session's `seed_everything`): the same run, value for value.
    """
    host = shared_process()  # the run's seconds count from here, TensorFlow's first import included
    import_tensorflow()
    import tensorflow as tf

    from dqn_cartpole.training.session import train

    tf.keras.backend.clear_session()  # layer-name counters (and the Keras graph) as in a fresh process
    with streamed(config, run_dir, progress.message):
        with RunEnd(run_dir, created, progress, resume_hint, change_hint, print_failure=False) as end, \
                custom_gradients_released():
            end.summary = train(config, RunLayout(run_dir), progress, plan, host)
        status = end.finish()
    send_run(config, run_dir)
    return status, end.failure  # the exit status as the CLI's, and why it failed (one line) when that is 1
