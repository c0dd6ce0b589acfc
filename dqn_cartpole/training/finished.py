"""A finished run resumed: does it train on, and what does the command line say first. No TensorFlow, so `train
--resume` answers a run with nothing left to do at once, without rebuilding it or redrawing its artifacts.

A finished run trains on only when asked to go past where it ended. A run that stopped because it was solved trains
on when the command asks for more iterations than it ran (`-n N`): the solve check, which would stop it again at its
next evaluation, is turned off from then on (`evaluation.stop_when_solved: false`), and so is the hold of the solved
weights (`agent.solved_learning_rate: null`, unless the command sets it), and the first line says so. A run with
nothing left to do says why in one line and how to go on; it is only finished again (its summary, plots, videos and
report written) when an earlier process did not get to write them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Callable, Optional

from dqn_cartpole.config import Config
from dqn_cartpole.processes.commands import resume_command
from dqn_cartpole.run_folder.checkpointing import Found
from dqn_cartpole.run_folder.layout import RunLayout

STOP_KEY = "evaluation.stop_when_solved"
HOLD_KEY = "agent.solved_learning_rate"  # 0 would hold the solved weights a run asked to train on past its solve
ITERATIONS_KEY = "training.num_iterations"


def stopped_solved(found: Found) -> Optional[int]:
    """The iteration a finished run was solved and stopped at (None: it did not stop because it was solved)."""
    solved = found.state.get("run_state", {}).get("solved_at_iteration")
    return solved if found.finished and solved is not None and solved == found.iteration else None


def already_done(found: Found, config: Config) -> bool:
    """Whether a run resumed from `found` with `config` has nothing left to train: it finished, and either `config`
    asks for no more iterations than it ran or it stopped at its solve and would stop again (stop_when_solved)."""
    if not found.finished:
        return False
    if config.training.num_iterations <= found.iteration:
        return True
    return stopped_solved(found) is not None and config.evaluation.stop_when_solved


@dataclass(frozen=True)
class Resume:
    """What `train --resume` does with a run: train (on), finish it again, or nothing."""

    config: Config  # the config to run with (a solved run trained on past its solve: the solve check off)
    line: Optional[str] = None  # what to say first (None: the usual "Resuming ..." line says it all)
    run: bool = True  # False: nothing to do; say `line` and stop
    written: tuple = ()  # (section.key, value) the resume set for the user (recorded as written)


def cli_again(run_dir: str, changes: dict) -> str:
    """The command that resumes `run_dir` with `changes` (section.key -> value; "N": a number to choose)."""
    flags = [f"-n {value}" if key == ITERATIONS_KEY else f"--set {key}={str(value).lower()}"
             for key, value in changes.items()]
    return " ".join([resume_command(run_dir), *flags])


def plan_finished(run_dir: str, found: Optional[Found], config: Config, given: dict,
                  again: Callable[[str, dict], str] = cli_again) -> Resume:
    """How to resume a run from `found` with `config`; `given`: section.key -> value of the flags the user gave;
    `again`: how the line that says there is nothing to do writes the resume that trains on (`cli_again`)."""
    if found is None or not found.finished:
        return Resume(config)
    solved_at = stopped_solved(found)
    if solved_at is not None and ITERATIONS_KEY in given and STOP_KEY not in given \
            and config.training.num_iterations > found.iteration and config.evaluation.stop_when_solved:
        evaluation = dataclasses.replace(config.evaluation, stop_when_solved=False)
        written, agent = ((STOP_KEY, False),), config.agent
        if agent.solved_learning_rate is not None and HOLD_KEY not in given:  # asked to train on: not to hold
            written, agent = written + ((HOLD_KEY, None),), dataclasses.replace(agent, solved_learning_rate=None)
        keys = " and ".join(f"{key}: {'false' if value is False else 'null'}" for key, value in written)
        return Resume(dataclasses.replace(config, evaluation=evaluation, agent=agent),
                      f"{run_dir} was solved at iteration {solved_at}; training on past the solve to iteration "
                      f"{config.training.num_iterations} ({keys} from now on)", written=written)
    if not already_done(found, config):
        return Resume(config)
    if not artifacts_written(run_dir, found.iteration):
        return Resume(config, f"{run_dir} finished training at iteration {found.iteration}, but its summary and "
                              f"artifacts were not all written: writing them now")
    return Resume(config, nothing_to_do(run_dir, found, config, given, again), run=False)


def artifacts_written(run_dir: str, iteration: int) -> bool:
    """The run's end was written after its last iteration: summary.json (of that iteration), report.html and every
    artifact the summary lists (a plot or a policy deleted since is written again)."""
    layout = RunLayout(run_dir)
    try:
        with open(layout.summary, encoding="utf-8") as handle:
            summary = json.load(handle)
    except (OSError, ValueError):
        return False
    if summary.get("iterations") != iteration or not os.path.isfile(layout.report):
        return False
    then = summary.get("run_dir") or run_dir  # the artifacts' paths start with the run folder as it was given then
    return all(os.path.exists(os.path.join(run_dir, os.path.relpath(path, then)))
               for path in (summary.get("artifacts") or {}).values())


def nothing_to_do(run_dir: str, found: Found, config: Config, given: dict,
                  again: Callable[[str, dict], str] = cli_again) -> str:
    """One line: why a finished run has nothing to train, and the resume (`again`) that trains it on."""
    solved_at = stopped_solved(found)
    if solved_at is None:
        return (f"{run_dir} finished all its {found.iteration} iterations: nothing to do (its artifacts are written). "
                f"To train longer: {again(run_dir, {ITERATIONS_KEY: 'N'})}, with N above {found.iteration}")
    if ITERATIONS_KEY in given and config.training.num_iterations > found.iteration:  # more, with the check on
        changes = {ITERATIONS_KEY: config.training.num_iterations, STOP_KEY: False}
        return (f"{run_dir} was solved at iteration {solved_at} and stops when solved ({STOP_KEY}): nothing to do. "
                f"To train on past the solve: {again(run_dir, changes)}")
    return (f"{run_dir} was solved at iteration {solved_at} and stopped there: nothing to do (its artifacts are "
            f"written). To train on past the solve: {again(run_dir, {ITERATIONS_KEY: 'N'})}, with N above {solved_at}")
