"""The single-process run from start to end: what it says first, the training, then how it ended
(`outcome.RunEnd`). The CLI calls these once it has checked the input and holds the run folder's lock."""

from __future__ import annotations

import os
import sys
from typing import Optional

from dqn_cartpole.config import Config
from dqn_cartpole.console.imports import heavy_imports
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.processes.commands import resume_command
from dqn_cartpole.run_folder.checkpointing import ResumePlan
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training.outcome import RunEnd


def run_new(config: Config, run_dir: str, config_file: str, created: bool, quiet: bool) -> int:
    """A new run into `run_dir`; returns its exit status."""
    progress = Progress(config.training.num_iterations, enabled=not quiet)
    progress.message(f"Training {config.env.id} with {os.path.basename(config_file)} "
                     f"(seed {config.training.seed}, replay {config.replay.backend}) -> {run_dir}")
    return run(config, run_dir, progress, None, created)


def run_resumed(config: Config, run_dir: str, plan: ResumePlan, quiet: bool) -> int:
    """Continues the run in `run_dir` from the checkpoint `plan` found (or from the start); its exit status."""
    for bad in plan.bad:
        instead = f"using {os.path.basename(plan.found.path)} instead" if plan.found else "no other checkpoint"
        print(f"warning: checkpoint {bad.path} is {bad.reason}; {instead}", file=sys.stderr)
    if plan.found is None:
        print(f"warning: {run_dir} has no usable checkpoint (it stopped before writing one); "
              f"starting it again from iteration 0 with its config.yaml", file=sys.stderr)
    progress = Progress(config.training.num_iterations, enabled=not quiet)
    start = f"{os.path.basename(plan.found.path)}" if plan.found else "the beginning"
    progress.message(f"Resuming {run_dir} ({config.env.id}, seed {config.training.seed}, replay "
                     f"{config.replay.backend}) from {start}")
    return run(config, run_dir, progress, plan, created=False)


def run(config: Config, run_dir: str, progress: Progress, plan: Optional[ResumePlan], created: bool) -> int:
    """Trains in this process, then writes summary.json and report.html and prints the summary."""
    # TensorFlow's import (about 3 s) waits until here, so the run's first line is already on the screen: this
    # module stays light (training/__init__ imports nothing heavy), and `heavy_imports` imports TensorFlow quietly.
    with heavy_imports():
        from dqn_cartpole.training.session import train

    with RunEnd(run_dir, created, progress, resume_command(run_dir)) as end:
        end.summary = train(config, RunLayout(run_dir), progress, plan)
    return end.finish()
