"""`tune`: an Optuna study whose trials are ordinary training runs in child processes.

Objective (minimised): the env steps the run took to solve (`solved_env_steps` in its summary).
A run that never solves scores 2 x its env-step budget (initial_collect_steps + num_iterations x
collect_steps_per_iteration), so any solving config beats any unsolved one.

Sampler: TPE, multivariate, with few random start-up trials for small studies. Pruner: the median
rule on the run's periodic evaluations. The parent tails the trial's eval_metrics.csv and reports
each evaluation as the negated average return at its env step (the study minimises, so a higher
return is a lower value); a trial the pruner stops gets SIGTERM and ends with its checkpoint.
A run that diverges (exit 1) is pruned, any other failure fails the trial; the reason is the
trial's `reason` user attribute.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import grid, launcher, space, storage

JOURNAL_FILE = "journal.log"
TRIALS_DIR = "trials"
POLL_S = 0.5
PENALTY_FACTOR = 2


class TrialFailed(Exception):
    """The trial's run failed; the reason is already recorded on the trial."""


class TrialStopped(Exception):
    """The user stopped the tune command while this trial ran."""


@dataclass(frozen=True)
class TunePlan:
    """Everything a tune command will do, checked before any trial starts."""

    study_name: str
    folder: str
    config_path: str
    space_path: str
    params: tuple
    trials: int
    jobs: int
    storage_url: str
    overrides: tuple
    sampler_seed: Optional[int]
    warmup_env_steps: int
    rdb: object = None  # the opened RDB storage (opened while checking, so a bad URL fails first and fast)

    @property
    def trials_dir(self) -> str:
        return os.path.join(self.folder, TRIALS_DIR)


def plan_tune(config_path: str, space_path: str, trials: int, jobs: int, storage_url: Optional[str],
              study_name: Optional[str], overrides: Sequence[str], sampler_seed: Optional[int]) -> TunePlan:
    """Checks every input (config, space, numbers, storage URL form); raises UserError on bad input."""
    for flag, value in (("--trials", trials), ("--jobs", jobs)):
        if value <= 0:
            raise UserError(f"{flag}: must be positive, got {value}")
    rdb = None
    if storage_url is not None:
        storage.check_url(storage_url)
        rdb = storage.open_storage(storage_url) if storage.is_rdb(storage_url) else None
    params = space.load_space(space_path)
    candidates = [(param, value) for param in params for value in param.values_to_check()]
    base, *checked = grid.check_configs(config_path, [overrides, *([*overrides, space.override(p.key, v)]
                                                                   for p, v in candidates)])
    grid.first_error([base])
    for (param, value), result in zip(candidates, checked):  # a trial never starts a run train would refuse
        if isinstance(result, UserError):
            raise UserError(f"--space {space_path}: {param.key}: {value!r} is not a valid value "
                            f"({str(result).split(': ', 1)[-1]})")
    name = study_name or os.path.splitext(os.path.basename(config_path))[0]
    if not name or "/" in name or name in (".", ".."):
        raise UserError(f"--study {name!r}: must be a plain name")
    folder = os.path.join(base["output"]["root"], "tune", name)
    budget = env_step_budget(base)
    return TunePlan(name, folder, os.path.abspath(config_path), os.path.abspath(space_path), tuple(params), trials,
                    jobs, storage_url or os.path.join(folder, JOURNAL_FILE), tuple(overrides), sampler_seed,
                    budget // 3, rdb)


def env_step_budget(config: dict) -> int:
    """The env steps a run takes if it never stops early."""
    training = config["training"]
    return int(training["initial_collect_steps"] + training["num_iterations"] * training["collect_steps_per_iteration"])


def score(run) -> float:
    """The objective of a finished run (a RunRecord): env steps to solve, or the penalty."""
    if run.get("solved_env_steps") is not None:
        return float(run.get("solved_env_steps"))
    return float(PENALTY_FACTOR * env_step_budget(run.config))


# ---------------------------------------------------------------------------- the study


def make_study(plan: TunePlan, opened_storage):
    import optuna

    startup = min(10, max(2, plan.trials // 4))  # random trials before TPE models the space
    sampler = optuna.samplers.TPESampler(multivariate=True, n_startup_trials=startup, seed=plan.sampler_seed)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=max(1, startup // 2),
                                         n_warmup_steps=plan.warmup_env_steps)
    return optuna.create_study(study_name=plan.study_name, storage=opened_storage, sampler=sampler, pruner=pruner,
                               direction="minimize", load_if_exists=True)


def run_tune(plan: TunePlan) -> int:
    """Runs trials until the study holds `plan.trials`; writes best.yaml, tables and plots. Returns the exit status."""
    import optuna

    from dqn_cartpole.experiments import tune_outputs

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # each trial gets one line from us instead
    opened = plan.rdb or storage.open_storage(plan.storage_url)
    study = make_study(plan, opened)
    for number in storage.fail_dead_workers_trials(opened, plan.study_name):
        print(f"trial {number}: marked FAILED (its worker process died)", file=sys.stderr)
    remaining = plan.trials - len(study.get_trials(deepcopy=False))
    print(f"study {plan.study_name} in {storage.describe(plan.storage_url)}: {len(study.trials)} trials so far, "
          f"running up to {max(0, remaining)} more with {plan.jobs} at a time; trials in {plan.trials_dir}")
    children = launcher.ChildSet()
    with launcher.StopFlag() as stop:
        if remaining > 0:
            objective = Objective(plan, children, stop, study)
            study.optimize(objective, n_trials=remaining, n_jobs=plan.jobs, catch=(TrialFailed, TrialStopped),
                           callbacks=[optuna.study.MaxTrialsCallback(plan.trials, states=None),
                                      lambda study, _trial: study.stop() if stop.requested else None],
                           gc_after_trial=False)
        children.stop(stop.signum or signal.SIGTERM)  # nothing is left running, even after an error
    for line in tune_outputs.write_outputs(study, plan):
        print(line)
    if stop.signum is not None:
        print(f"Stopped by {signal.Signals(stop.signum).name}. Continue the study with the same command:\n  "
              f"{continue_command(plan)}")
        return 128 + int(stop.signum)
    return 0


def continue_command(plan: TunePlan) -> str:
    import shlex

    argv = ["python", "-m", "dqn_cartpole", "tune", "--config", plan.config_path, "--space", plan.space_path,
            "--trials", str(plan.trials), "--jobs", str(plan.jobs), "--study", plan.study_name,
            "--storage", storage.describe(plan.storage_url)]
    for item in plan.overrides:
        argv += ["--set", item]
    return shlex.join(argv)


class Objective:
    """One trial: start the run, report its evaluations, prune or score it."""

    def __init__(self, plan: TunePlan, children: launcher.ChildSet, stop: launcher.StopFlag, study) -> None:
        self.plan, self.children, self.stop, self.study = plan, children, stop, study
        self.worker = storage.worker_id()

    def __call__(self, trial) -> float:
        if self.stop.requested:
            self.study.stop()
            raise TrialStopped("stopped before it started")
        overrides = space.suggest(trial, self.plan.params)
        run_dir = os.path.join(self.plan.trials_dir, f"{trial.number:04d}")
        for key, value in ((storage.WORKER_ATTR, self.worker), ("run_dir", os.path.abspath(run_dir)),
                           ("overrides", list(overrides))):
            trial.set_user_attr(key, value)
        argv = launcher.train_argv(self.plan.config_path, [*self.plan.overrides, *overrides], run_dir)
        child = launcher.start(argv, run_dir, os.path.join(self.plan.folder, "logs", f"{trial.number:04d}.log"))
        self.children.add(child)
        try:
            pruned_at = self._follow(child, trial)
        finally:
            if child.returncode is None:
                child.process.terminate()
            child.process.wait()
            self.children.remove(child)
        return self._result(trial, child, pruned_at)

    def _follow(self, child: launcher.Child, trial) -> Optional[str]:
        """Reports each new evaluation until the run ends; SIGTERMs it if pruned (returns why) or stopped."""
        from dqn_cartpole.run_folder.layout import RunLayout
        from dqn_cartpole.run_folder.metrics import read_csv

        reported, eval_csv = 0, RunLayout(child.run_dir).eval_metrics
        while child.returncode is None:
            time.sleep(POLL_S)
            if self.stop.requested:
                child.process.send_signal(self.stop.signum)
                child.process.wait()
                self.study.stop()
                trial.set_user_attr("reason", f"stopped by {signal.Signals(self.stop.signum).name}; the run folder "
                                              f"can be continued with train --resume")
                raise TrialStopped("stopped by the user")
            rows = read_csv(eval_csv)
            for row in rows[reported:]:
                if row.get("average_return") in (None, "") or row.get("env_steps") in (None, ""):
                    continue
                step, value = int(row["env_steps"]), -float(row["average_return"])
                trial.report(value, step)
                if trial.should_prune():
                    child.process.send_signal(signal.SIGTERM)  # it saves a checkpoint and exits 143
                    child.process.wait()
                    return f"pruned by the median rule at env step {step} (average return {-value:g})"
            reported = len(rows)
        return None

    def _result(self, trial, child: launcher.Child, pruned_at: Optional[str]) -> float:
        import optuna

        from dqn_cartpole.run_folder import read_run

        if pruned_at:
            trial.set_user_attr("reason", pruned_at)
            print(f"trial {trial.number}: {pruned_at}")
            raise optuna.TrialPruned(pruned_at)
        status = child.returncode
        run = read_run(child.run_dir) if os.path.isfile(os.path.join(child.run_dir, "config.yaml")) else None
        if status == launcher.EXIT_FAILED and run is not None and run.get("diverged_at_iteration") is not None:
            reason = f"diverged (loss NaN/Inf) at iteration {run.get('diverged_at_iteration')}"
            trial.set_user_attr("reason", reason)
            print(f"trial {trial.number}: pruned, {reason}")
            raise optuna.TrialPruned(reason)
        if status != launcher.EXIT_OK or run is None or not run.finished:
            reason = f"exit status {status}: {child.last_error() or 'no summary'} (log: {child.log_path})"
            trial.set_user_attr("reason", reason)
            print(f"trial {trial.number}: failed, {reason}", file=sys.stderr)
            raise TrialFailed(reason)
        value = score(run)
        for key in ("solved_env_steps", "best_return", "final_return", "env_steps", "wall_s"):
            trial.set_user_attr(key, run.get(key))
        verdict = f"solved in {value:.0f} env steps" if run.solved else f"not solved (scores {value:.0f})"
        print(f"trial {trial.number}: {verdict}, best return {run.get('best_return') or 0:.1f}, "
              f"{run.get('wall_s') or 0:.1f} s")
        return value
