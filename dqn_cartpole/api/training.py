"""`train`: the CLI's `train` (and `train --resume`) in the calling process, returning a `Run`: the same checks, run
folder and training (`training.run.run_here`); how the console, errors and Ctrl-C differ is in docs/python-api.md."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from typing import Union

from dqn_cartpole.api.configs import ConfigLike, Overrides, as_config, override_items, shortcut_items
from dqn_cartpole.api.run import Run, RunFailed, cli_args
from dqn_cartpole.config import Config
from dqn_cartpole.console.exit_status import EXIT_FAILED
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.console.quiet import in_jupyter
from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder.checkpointing import ResumePlan
from dqn_cartpole.training.run import announce_new, announce_resume, run_here, warn_about_checkpoints


def resume_hint(run_dir: str, change: str = "") -> str:
    """The Python line that continues the run in `run_dir` (`change`: an overrides argument to add)."""
    return f"dqn_cartpole.train(resume={run_dir!r}{change})"


def python_again(run_dir: str, changes: dict) -> str:
    """`resume_hint` with `changes` (section.key -> value; "N": a number to choose) as its overrides."""
    items = ", ".join(f"{key!r}: {value if value == 'N' else repr(value)}" for key, value in changes.items())
    return resume_hint(run_dir, f", overrides={{{items}}}")


def train(config: ConfigLike = None, output_dir: "str | os.PathLike[str] | None" = None, *,
          overrides: Overrides = None, overwrite: bool = False, resume: Union[Run, str, None] = None,
          progress: bool = True, track: "str | None" = None) -> Run:
    """Trains an agent in this process and returns its run folder as a `Run`.

    Args:
        config: a `Config` (`load_config(...)`), a shipped config's name (`"tutorial"`), a YAML path, or None for
            the default; with `resume`, none (a resumed run keeps its config.yaml).
        output_dir: the run folder (default: output.root/<env>__s<seed>__<time>, as the CLI's).
        overrides: `{"section.key": value}` applied to `config` (a name or a path) or, with `resume`, to the run's
            config.yaml, as `--set` does.
        overwrite: replace an existing run at `output_dir` (as `--overwrite`).
        resume: a `Run` (or its folder) to continue from its newest good checkpoint, as `train --resume`.
        progress: show the progress bar (False: as `--quiet`, only the summary).
        track: `"mlflow"` or `"wandb"`, as `--track`: the run is tracked there (MLflow: its metrics as it trains)
            and sent once it ended (docs/tracking.md); refused at once when its extra is not installed. A resumed
            run that was tracked continues its tracked run without it.

    Raises:
        UserError: bad input (a `ValueError`): the CLI's one line; nothing was touched.
        RunFailed: the run diverged or the disk filled up.
    """
    if resume is not None:
        if config is not None:
            raise UserError("train(resume=...): give no config: a resumed run keeps its config.yaml (change single "
                            "keys with overrides={...})")
        if output_dir is not None or overwrite:
            raise UserError("train(resume=...): a resumed run keeps its folder; give no output_dir or overwrite")
        return _resume(os.fspath(resume.path if isinstance(resume, Run) else resume), overrides, track, progress)
    return _train_new(as_config(config, overrides, track), output_dir, overwrite, progress)


def _train_new(config: Config, output_dir: "str | os.PathLike[str] | None", overwrite: bool, progress: bool) -> Run:
    """`train`'s checks and folder (`resolve`), then the run here."""
    from dqn_cartpole.run_folder.resolve import create_run_dir, resolve_run_dir

    from dqn_cartpole.tracking.send import check_installed

    check_installed(config.tracking.backend, f"track={config.tracking.backend!r}")  # before any folder is made
    output_dir = None if output_dir is None else os.fspath(output_dir)
    if output_dir:
        resolve_run_dir(None, output_dir, overwrite)  # needs no config: checked first, as the CLI does
    run_dir = resolve_run_dir(config, output_dir, overwrite)
    created, lock = create_run_dir(run_dir, overwrite)
    with contextlib.closing(lock):  # held as long as the run lives
        bar = _progress(config, progress)
        announce_new(config, run_dir, "", bar)
        return _run(config, run_dir, bar, None, created)


def _resume(run_dir: str, overrides: Overrides, track: "str | None", progress: bool) -> Run:
    """`train --resume RUN_DIR --set ... [--track ...]`'s checks, lock and plan (the CLI's own: a finished run with
    nothing to do says so and is returned as it is), then the run here."""
    from dqn_cartpole.cli.single_process import lock_and_plan_resume, plan_resumed_run

    args = cli_args("train", "--resume", run_dir)
    # As `--set` items, each naming the argument as it was written.
    args.overrides = override_items(overrides) + shortcut_items(None, None, None, track)
    config, plan, lock = lock_and_plan_resume(run_dir, args)
    with contextlib.closing(lock):
        config = plan_resumed_run(run_dir, args, config, plan, again=python_again)
        if config is None:
            return Run(run_dir)
        warn_about_checkpoints(run_dir, plan)
        bar = _progress(config, progress)
        announce_resume(config, run_dir, plan, bar)
        return _run(config, run_dir, bar, plan, created=False)


def _progress(config: Config, enabled: bool) -> Progress:
    """In Jupyter, `tqdm.auto`'s bar; elsewhere (a script), the CLI's."""
    return Progress(config.training.num_iterations, enabled=enabled, notebook=in_jupyter())


def _run(config: Config, run_dir: str, bar: Progress, plan: "ResumePlan | None", created: bool) -> Run:
    """The run in this process; the stopped or finished Run, or RunFailed."""
    hint = resume_hint(run_dir)
    try:
        status, failure = run_here(config, run_dir, bar, plan, created, hint,
                                   resume_hint(run_dir, ", overrides={'agent.learning_rate': ...}"))
    except KeyboardInterrupt:  # a second Ctrl-C (or one before the run's handler was in place)
        print(f"\n{interrupted_line(run_dir, created, hint)}", file=sys.stderr)
        raise
    if status == EXIT_FAILED:
        raise RunFailed(failure or f"the run in {run_dir} failed", [Run(run_dir)])
    return Run(run_dir)


def interrupted_line(run_dir: str, created: bool, hint: str) -> str:
    """What a run interrupted at once left: a folder to resume, or (interrupted before it wrote anything) nothing;
    a folder it created then holds only its lock files, and is removed so the same `output_dir` works again."""
    from dqn_cartpole.run_folder.layout import CONFIG_FILE, LOCK_FILE, ROLES_LOCK_FILE

    if os.path.isfile(os.path.join(run_dir, CONFIG_FILE)):
        return f"interrupted: continue the run in {run_dir} from its newest checkpoint (if it wrote one) with {hint}"
    if created and set(os.listdir(run_dir)) <= {LOCK_FILE, ROLES_LOCK_FILE}:
        shutil.rmtree(run_dir, ignore_errors=True)
    return f"interrupted before the run in {run_dir} wrote anything"
