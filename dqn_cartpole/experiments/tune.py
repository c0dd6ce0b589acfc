"""`tune`: an Optuna study whose trials are ordinary training runs in child processes.

Objective (minimised, `--objective`), per run, read from its summary.json:
  env_steps  the env steps to a confirmed solve (`solved_env_steps`), the default;
  wall_s     the wall seconds from the run's process start to its confirmed, saved policy (`solved_wall_s`);
  cpu_s      the CPU seconds that process used until then (`solved_cpu_s`): the compiled loop runs on one
             thread, so on an idle machine this is about the wall time, and it barely moves when other
             jobs share the cores, which the wall time does (a study of wall time on a shared machine
             ranks the load more than the configs; run it with --jobs 1 at least).
A run that never solves scores 2 x its budget: 2 x the env-step budget (initial_collect_steps +
num_iterations x collect_steps_per_iteration), or 2 x the seconds that whole budget takes at the
run's own speed. So any solving config beats any unsolved one, and a diverged run is not cheap.

Seeds (`--seeds 0-4`): each trial trains every seed, one after another (so they never compete for
the cores), and scores the mean of its seeds' objectives; after each seed it reports the running
mean, and the median rule may prune it from the second seed on (compared with the other trials
after the same seeds). Without `--seeds`, a trial trains the config's `training.seed` once.

Sampler: TPE, multivariate, with few random start-up trials for small studies. Pruner: the median
rule; with one seed, on the run's periodic evaluations: the parent tails the trial's eval_metrics.csv
and reports each evaluation as the negated average return at its env step (the study minimises, so
a higher return is a lower value); a trial the pruner stops gets SIGTERM and ends with its
checkpoint. A run that diverges (exit 1) is pruned (with several seeds it is an unsolved seed), any
other failure fails the trial; the reason is the trial's `reason` user attribute.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from dqn_cartpole.console import exit_status
from dqn_cartpole.console.signals import STOP_CHILDREN, StopRequest, signal_name
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import grid, space, storage, study_checks, train_worker
from dqn_cartpole.processes import commands
from dqn_cartpole.experiments.tracking_group import group_overrides, trial_tags
from dqn_cartpole.processes.commands import child_command, train_argv
from dqn_cartpole.processes.supervisor import Child, ChildSet

JOURNAL_FILE = "journal.log"
TRIALS_DIR = "trials"
POLL_S = 0.5
STOP_WAIT_S = 120.0  # a stopped run writes its checkpoint, plots and videos
PENALTY_FACTOR = 2
# --objective: (what it measures, the summary's key for a solved run, the key of the run's own total)
OBJECTIVES = {"env_steps": ("env steps to a confirmed solve", "solved_env_steps", "env_steps"),
              "wall_s": ("wall seconds to a confirmed solve", "solved_wall_s", "wall_s"),
              "cpu_s": ("CPU seconds to a confirmed solve", "solved_cpu_s", "cpu_s")}


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
    seeds: tuple = ()  # each trial trains these seeds (empty: the config's training.seed, once)
    objective: str = "env_steps"
    runner: tuple = ()  # where the trials run, as the continue command says it: () here, ("--ray", ...) on Ray
    tracking: Optional[dict] = None  # the config's tracking section (--track: each trial tracked in the study's group)

    @property
    def trials_dir(self) -> str:
        return os.path.join(self.folder, TRIALS_DIR)


def plan_tune(config_path: str, space_path: str, trials: int, jobs: int, storage_url: Optional[str],
              study_name: Optional[str], overrides: Sequence[str], sampler_seed: Optional[int],
              seeds_text: Optional[str] = None, objective: str = "env_steps") -> TunePlan:
    """Checks every input (config, space, numbers, seeds, storage URL form); raises UserError on bad input."""
    for flag, value in (("--trials", trials), ("--jobs", jobs)):
        if value is not None and value <= 0:
            raise UserError(f"{flag}: must be positive, got {value}")
    if objective not in OBJECTIVES:
        raise UserError(f"--objective {objective}: expected one of {', '.join(OBJECTIVES)}")
    study_checks.check_sampler_seed(sampler_seed)
    seeds = tuple(grid.parse_seeds(seeds_text)) if seeds_text is not None else ()
    if seeds and any(item.split("=", 1)[0].strip() == "training.seed" for item in overrides):
        raise UserError("--set training.seed: give the seeds with --seeds")
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
    study_checks.check_can_solve(config_path, overrides, base, [c for c in checked if isinstance(c, dict)],
                                 objective, OBJECTIVES[objective][1])
    return TunePlan(name, folder, os.path.abspath(config_path), os.path.abspath(space_path), tuple(params), trials,
                    jobs, storage_url or os.path.join(folder, JOURNAL_FILE), tuple(overrides), sampler_seed,
                    budget // 3, rdb, seeds, objective, tracking=base.get("tracking"))


def env_step_budget(config: dict) -> int:
    """The env steps a run takes if it never stops early."""
    training = config["training"]
    return int(training["initial_collect_steps"] + training["num_iterations"] * training["collect_steps_per_iteration"])


def score(run, objective: str = "env_steps") -> float:
    """The objective of a finished run (a RunRecord): its env steps or seconds to solve, or the penalty."""
    _, solved_key, total_key = OBJECTIVES[objective]
    if run.solved and run.get(solved_key) is not None:
        return float(run.get(solved_key))
    budget = env_step_budget(run.config)
    if objective == "env_steps":
        return float(PENALTY_FACTOR * budget)
    # The seconds the whole budget takes at this run's speed (a diverged or stopped run ended early).
    done = max(1, int(run.get("env_steps") or 0))
    return float(PENALTY_FACTOR * float(run.get(total_key) or 0.0) * max(1.0, budget / done))


# ---------------------------------------------------------------------------- the study


def make_study(plan: TunePlan, opened_storage):
    import optuna

    startup = min(10, max(2, plan.trials // 4))  # random trials before TPE models the space
    sampler = optuna.samplers.TPESampler(multivariate=True, n_startup_trials=startup, seed=plan.sampler_seed)
    # One seed: steps are env steps of its evaluations. Several: steps are seeds done (from the second).
    pruner = optuna.pruners.MedianPruner(n_startup_trials=max(1, startup // 2),
                                         n_warmup_steps=1 if plan.seeds else plan.warmup_env_steps)
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
    children = ChildSet()
    slots = train_worker.WorkerSlots(plan.jobs, os.path.join(plan.folder, "logs"))
    with StopRequest(STOP_CHILDREN, second_signal_interrupts=False) as stop:
        if remaining > 0:
            objective = Objective(plan, children, stop, study, slots)
            study.optimize(objective, n_trials=remaining, n_jobs=plan.jobs, catch=(TrialFailed, TrialStopped),
                           callbacks=[optuna.study.MaxTrialsCallback(plan.trials, states=None),
                                      lambda study, _trial: study.stop() if stop.requested else None],
                           gc_after_trial=False)
        children.stop(stop.signum or signal.SIGTERM, STOP_WAIT_S)  # nothing is left running, even after an error
        slots.close()
    for line in tune_outputs.write_outputs(study, plan):
        print(line)
    warning = study_checks.all_equal_warning([t.value for t in study.trials if t.state.name == "COMPLETE"])
    if warning:
        print(warning, file=sys.stderr)
    if stop.signum is not None:
        print(f"Stopped by {signal_name(stop.signum)}. Continue the study with the same command:\n  "
              f"{continue_command(plan)}")
        return exit_status.for_signal(stop.signum)
    return exit_status.EXIT_OK


def continue_command(plan: TunePlan) -> str:
    argv = ["tune", "--config", plan.config_path, "--space", plan.space_path, "--trials", str(plan.trials),
            *(["--jobs", str(plan.jobs)] if plan.jobs is not None else []), *plan.runner, "--study", plan.study_name,
            "--storage", storage.describe(plan.storage_url)]
    if plan.seeds:
        argv += ["--seeds", ",".join(str(s) for s in plan.seeds)]
    if plan.objective != "env_steps":
        argv += ["--objective", plan.objective]
    for item in plan.overrides:
        argv += ["--set", item]
    return commands.continue_command(argv)


class Objective:
    """One trial: start its run (or one run per seed), report progress, prune or score it."""

    def __init__(self, plan: TunePlan, children: ChildSet, stop: StopRequest, study,
                 slots: "train_worker.WorkerSlots") -> None:
        self.plan, self.children, self.stop, self.study, self.slots = plan, children, stop, study, slots
        self.worker = storage.worker_id()

    def __call__(self, trial) -> float:
        if self.stop.requested:
            self.study.stop()
            raise TrialStopped("stopped before it started")
        overrides, folder = start_trial(trial, self.plan, self.worker)
        if self.plan.seeds:
            return self._seeds(trial, overrides, folder)
        child = self._start(trial, overrides, folder, f"{trial.number:04d}")
        pruned_at = self._run(child, trial, follow_evaluations=True)
        return score_trial(trial, run_result(trial, RunEnded.of(child), pruned_at), self.plan.objective)

    def _seeds(self, trial, overrides: list[str], folder: str) -> float:
        """Trains each seed in turn; the running mean of their scores is reported after each (and may be pruned)."""
        rows: list[dict] = []
        for seed in self.plan.seeds:
            if self.stop.requested:  # between two seeds: no run is left to stop
                self.study.stop()
                trial.set_user_attr("reason", f"stopped by {signal_name(self.stop.signum)} after "
                                              f"{len(rows)} seeds")
                raise TrialStopped("stopped by the user")
            child = self._start(trial, [*overrides, f"training.seed={seed}"], os.path.join(folder, f"s{seed}"),
                                f"{trial.number:04d}-s{seed}")
            pruned_at = self._run(child, trial, follow_evaluations=False)
            mean = after_seed(trial, self.plan, rows, seed, run_result(trial, RunEnded.of(child), pruned_at, True))
        return mean

    def _start(self, trial, overrides: Sequence[str], run_dir: str, log_name: str) -> Child:
        argv = train_argv(self.plan.config_path, [*self.plan.overrides, *overrides], run_dir)
        log = os.path.join(self.plan.folder, "logs", f"{log_name}.log")
        # a reused worker's run counts its seconds from its own start, a fresh one's from its process's: the
        # seconds objectives time a fresh process, as a person times `train`
        reuse = self.plan.objective == "env_steps"
        return self.children.add(self.slots.start(run_dir, child_command(argv), log, reuse=reuse))

    def _run(self, child: Child, trial, follow_evaluations: bool) -> Optional[str]:
        """Waits for the run (reporting its evaluations, with one seed); returns why it was pruned, if it was."""
        try:
            return self._follow(child, trial, follow_evaluations)
        finally:
            child.stop(STOP_WAIT_S)  # SIGTERM if it still runs, SIGKILL after the grace
            self.children.remove(child)

    def _follow(self, child: Child, trial, follow_evaluations: bool) -> Optional[str]:
        """Reports each new evaluation until the run ends; SIGTERMs it if pruned (returns why) or stopped."""
        from dqn_cartpole.run_folder.layout import RunLayout
        from dqn_cartpole.run_folder.csv_files import read_csv

        reported, eval_csv = 0, RunLayout(child.name).eval_metrics
        while child.returncode is None:
            time.sleep(POLL_S)
            if self.stop.requested:
                child.send(self.stop.signum)
                train_worker.wait_run(child)
                self.study.stop()
                trial.set_user_attr("reason", f"stopped by {signal_name(self.stop.signum)}; the run folder "
                                              f"can be continued with train --resume")
                raise TrialStopped("stopped by the user")
            if not follow_evaluations:
                continue
            rows = read_csv(eval_csv)
            for row in rows[reported:]:
                if row.get("average_return") in (None, "") or row.get("env_steps") in (None, ""):
                    continue
                step, value = int(row["env_steps"]), -float(row["average_return"])
                trial.report(value, step)
                if trial.should_prune():
                    child.send(signal.SIGTERM)  # it saves a checkpoint and exits 143
                    train_worker.wait_run(child)
                    return f"pruned by the median rule at env step {step} (average return {-value:g})"
            reported = len(rows)
        return None



# ---------------------------------------------------------------------------- one trial's decisions (here and on Ray)


@dataclass(frozen=True)
class RunEnded:
    """How one run of a trial ended: its folder, its exit status (None: no process status), its last error line."""

    run_dir: str
    status: Optional[int]
    last_error: str
    log_path: str

    @classmethod
    def of(cls, child: Child) -> "RunEnded":
        return cls(child.name, child.returncode, child.last_error(), child.log_path or "")


def start_trial(trial, plan: TunePlan, worker: str) -> tuple[list[str], str]:
    """Samples the trial's overrides and records who runs it and where; returns (overrides, its folder)."""
    overrides = space.suggest(trial, plan.params)
    folder = os.path.join(plan.trials_dir, f"{trial.number:04d}")
    for key, value in ((storage.WORKER_ATTR, worker), ("run_dir", os.path.abspath(folder)),
                       ("overrides", list(overrides)), ("objective", plan.objective)):
        trial.set_user_attr(key, value)
    tracked = group_overrides(plan.tracking or {}, plan.study_name, trial_tags(trial.number, overrides))
    return [*overrides, *tracked], folder


def run_result(trial, ended: RunEnded, pruned_at: Optional[str], seeds: bool = False):
    """The finished run's record; raises TrialPruned (pruned, or diverged with one seed) or TrialFailed."""
    import optuna

    from dqn_cartpole.run_folder import read_run

    if pruned_at:
        trial.set_user_attr("reason", pruned_at)
        print(f"trial {trial.number}: {pruned_at}")
        raise optuna.TrialPruned(pruned_at)
    status = ended.status
    run = read_run(ended.run_dir) if os.path.isfile(os.path.join(ended.run_dir, "config.yaml")) else None
    diverged = run is not None and run.get("diverged_at_iteration") is not None
    if status == exit_status.EXIT_FAILED and diverged and run.finished:
        if seeds:  # one seed of several: an unsolved seed, scored with the penalty
            return run
        reason = f"diverged (loss NaN/Inf) at iteration {run.get('diverged_at_iteration')}"
        trial.set_user_attr("reason", reason)
        print(f"trial {trial.number}: pruned, {reason}")
        raise optuna.TrialPruned(reason)
    if status != exit_status.EXIT_OK or run is None or not run.finished:
        reason = f"exit status {status}: {ended.last_error or 'no summary'} (log: {ended.log_path})"
        trial.set_user_attr("reason", reason)
        print(f"trial {trial.number}: failed, {reason}", file=sys.stderr)
        raise TrialFailed(reason)
    return run


def score_trial(trial, run, objective: str) -> float:
    """A one-seed trial's value: its run's score, with the run's figures kept on the trial and one line printed."""
    value = score(run, objective)
    for key in ("solved_env_steps", "solved_wall_s", "solved_cpu_s", "best_return", "final_return", "env_steps",
                "wall_s"):
        trial.set_user_attr(key, run.get(key))
    verdict = f"solved, {OBJECTIVES[objective][0]} {value:g}" if run.solved else f"not solved (scores {value:g})"
    print(f"trial {trial.number}: {verdict}, best return {run.get('best_return') or 0:.1f}, "
          f"{run.get('wall_s') or 0:.1f} s")
    return value


def after_seed(trial, plan: TunePlan, rows: list[dict], seed: int, run) -> float:
    """Adds one seed's run to `rows` and reports the running mean; raises TrialPruned if the median rule stops the
    trial before its last seed. Returns the mean (the trial's value after its last seed)."""
    import optuna

    rows.append(seed_row(seed, run, score(run, plan.objective)))
    mean = statistics.mean(row["score"] for row in rows)
    for key, value in (("seeds", rows), ("per_seed", per_seed_text(rows)),
                       ("solved_seeds", f"{sum(r['solved'] for r in rows)}/{len(rows)}")):
        trial.set_user_attr(key, value)
    trial.report(mean, len(rows) - 1)
    if len(rows) < len(plan.seeds) and trial.should_prune():
        reason = f"pruned by the median rule after {len(rows)} seeds (mean {mean:g})"
        trial.set_user_attr("reason", reason)
        print(f"trial {trial.number}: {reason}")
        raise optuna.TrialPruned(reason)
    if len(rows) == len(plan.seeds):
        print(f"trial {trial.number}: {trial.user_attrs['solved_seeds']} seeds solved, mean "
              f"{OBJECTIVES[plan.objective][0]} {mean:g} ({per_seed_text(rows)})")
    return mean


def seed_row(seed: int, run, value: float) -> dict:
    """One seed's figures, kept on the trial (JSON): its score and what it took."""
    return {"seed": seed, "score": value, "solved": run.solved, "env_steps": run.get("solved_env_steps"),
            "wall_s": run.get("solved_wall_s"), "cpu_s": run.get("solved_cpu_s"),
            "solved_return": run.get("solved_return"), "run_dir": run.root}


def per_seed_text(rows: list[dict]) -> str:
    """'s0 8.1, s1 unsolved (40.2), ...': each seed's score, as the trials table shows it."""
    return ", ".join(f"s{r['seed']} {r['score']:.4g}" if r["solved"] else f"s{r['seed']} unsolved ({r['score']:.4g})"
                     for r in rows)
