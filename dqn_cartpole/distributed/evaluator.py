"""The `evaluate-live` role: the greedy evaluation of the learner's pushed weights, in its own process.

It pulls the weights (and their train step) from the `variables` table. Each time the train step
passes a multiple of `evaluation.eval_interval` iterations, it evaluates the newest weights with the
single-process run's own trigger: a row in eval_metrics.csv (at the train step the weights really
have), policy/best, and, if the return reaches the solve threshold, the solve check on fresh
episodes, which exports policy/final. Each result is published in the `evaluation` table for the
learner, and the evaluator leaves after a confirmed solve: the learner stops on it and writes the
run's `stop`, which the collectors watch. When the learner has trained all its iterations it
writes the stop too: the evaluator then evaluates the final weights and exits. Every call to the server has a
deadline: a server that stops answering ends it with one line and `exit_status.EXIT_CRASHED`.

It shares the run folder with the learner. It opens eval_metrics.csv only once the learner has pushed
weights, that is after a resumed learner has put back its checkpoint's copy of that file.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Optional

from dqn_cartpole.config import Config
from dqn_cartpole.console import exit_status, signals
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core.seeding import seed_everything
from dqn_cartpole.distributed import parts, status
from dqn_cartpole.distributed.variables import WeightSync
from dqn_cartpole.processes.start_time import process_start_time
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.csv_files import read_csv
from dqn_cartpole.run_folder.metrics import column
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training import checkpoints as run_checkpoints, triggers
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.local import make_evaluation
from dqn_cartpole.training.state import RunState

POLL_S = 0.25  # between looks at the newest weights while no evaluation is due


def next_due(train_step: int, every: int) -> int:
    """The first multiple of `every` after `train_step`."""
    return (train_step // every + 1) * every


def restore_state(layout: RunLayout, state: RunState, clock: triggers.Clock, per_iteration: int) -> Optional[int]:
    """Picks up a resumed run's evaluations from eval_metrics.csv (and a newer policy/best on disk);
    returns the last evaluated train step, or None for a fresh run."""
    rows = read_csv(layout.eval_metrics)
    if not rows:
        return None
    returns, steps = column(rows, "average_return"), [int(r["train_step"]) for r in rows]
    best = max(range(len(returns)), key=lambda i: (returns[i], i))  # ties go to the later
    state.last_return, state.best_return = returns[-1], returns[best]
    state.best_iteration = steps[best] // per_iteration
    run_checkpoints.adopt_best_on_disk(layout.best_policy, state)
    clock.continue_from(float(rows[-1]["wall_s"]))
    return steps[-1]


class LiveEvaluator:
    """Follows the learner's weights and evaluates them; see the module docstring."""

    def __init__(self, config: Config, layout: RunLayout, address: str, stop: signals.StopRequest):
        self.config, self.layout, self.address, self.stop = config, layout, address, stop
        self.state = RunState()
        self.clock = triggers.Clock(process_start_time())
        self.per_iteration = config.training.train_steps_per_iteration
        self.every = config.evaluation.eval_interval * self.per_iteration  # in train steps
        self.pipeline: Optional[Pipeline] = None
        self.client: Any = None
        self.collected: Optional[parts.CollectedSteps] = None
        self.evaluate: Optional[triggers.Evaluate] = None
        self.solved_train_step = -1  # the weights whose solve check passed (the learner holds them: AfterSolve)
        self.progress = Progress(config.training.num_iterations, enabled=False)  # messages only, to the role's log

    def run(self) -> int:
        import reverb

        cfg = self.config
        seed_everything(cfg.training.seed)
        with contextlib.ExitStack() as stack:
            self.pipeline = parts.remote_pipeline(cfg, self.address, stack)
            self.client = reverb.Client(self.address)
            self.collected = parts.CollectedSteps(cfg, self.address)
            sync = WeightSync(self.address, self.pipeline.agent)
            if not sync.wait_for_first(lambda: self.stop.requested):
                return exit_status.for_signal(self.stop.signum)
            last = restore_state(self.layout, self.state, self.clock, self.per_iteration)
            scalars = stack.enter_context(contextlib.closing(
                Scalars(self.layout.tensorboard if cfg.output.tensorboard else None)))
            exporter = triggers.PolicyExport(self.pipeline, cfg, self.state)
            self.evaluate = make_evaluation(self.pipeline, cfg, self.state, exporter, self.layout, scalars,
                                            self.clock, self.progress, stack)
            self.follow(sync, -1 if last is None else last)
        return exit_status.for_signal(self.stop.signum) if self.stop.signum else 0

    def follow(self, sync: WeightSync, last: int) -> None:
        """Evaluates at each due train step until a stop: a signal, a solve, or the learner's last step."""
        due = 0 if last < 0 else next_due(last, self.every)
        while not self.stop.requested:
            ended = status.read_stop(self.client)  # before the pull: the learner pushes its last weights first
            train_step = sync.pull()
            if ended is not None:
                if not ended.solved and last < ended.train_step <= train_step:
                    self.evaluate_now(train_step)
                return
            if train_step >= due:
                if self.evaluate_now(train_step) and self.config.evaluation.stop_when_solved:
                    return
                last, due = train_step, next_due(train_step, self.every)
            else:
                time.sleep(POLL_S)

    def evaluate_now(self, train_step: int) -> bool:
        """Evaluates the pulled weights and publishes the result; True once a solve is confirmed."""
        state = self.state
        state.iteration = train_step // self.per_iteration
        parts.count_env_steps(self.pipeline, self.collected)
        self.evaluate()
        self.progress.message(f"train step {train_step}: average return {state.last_return:.1f} "
                              f"(best {state.best_return:.1f})")
        solved = state.solved_at_iteration is not None  # (a run that trains on after it says so in every result)
        if solved and self.solved_train_step < 0:
            self.solved_train_step = train_step
        status.publish_evaluation(self.client, status.Evaluation(
            train_step=train_step, env_steps=self.pipeline.env_step_count(), average_return=state.last_return,
            best_return=state.best_return, best_iteration=state.best_iteration, solved=solved,
            solved_return=state.solved_return if solved else float("nan"),
            solved_episodes=self.config.evaluation.solve_episodes if solved else 0,
            solved_train_step=self.solved_train_step))
        return solved  # the learner stops on it, then writes the run's stop for the collectors


def evaluate_live(config: Config, address: str, run_dir: str) -> int:
    """Evaluates until a stop (signal, solve, or the learner's end); returns the exit status."""
    with signals.StopRequest(give_up_after_s=signals.ROLE_GIVE_UP_S) as stop:
        with parts.lost_server_ends("the evaluator", address, stop):
            return LiveEvaluator(config, RunLayout(run_dir), address, stop).run()
    return exit_status.for_signal(stop.signum)
