"""`tune`: an Optuna study whose trials are ordinary training runs, here or on Ray.

The study stays with this driver in its storage (the journal file by default): it asks Optuna for each trial and
tells it the result (ask-and-tell), while its executor has room (`executor.LocalSlots`, --jobs at a time here, or
`executor.RayActors`, one per CPU of a Ray cluster, whose folders come back into trials/NNNN/). Ctrl-C stops every
run (each saves a checkpoint), marks their trials FAILED with the reason, writes the outputs and prints the command
that continues the study.

The objectives, seeds, sampler and pruner: docs/experiments.md, 'tune: an Optuna study'. A trial's seeds train one
after another, so they never compete for the cores; `cpu_s` barely moves when other jobs share the cores (the compiled
loop runs on one thread), which the wall time does: a study of `wall_s` on a shared machine ranks the load more than
the configs.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

from dqn_cartpole.console import exit_status
from dqn_cartpole.console.signals import STOP_CHILDREN, StopRequest, signal_name
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import grid, ray_transfer, space, storage, study_checks
from dqn_cartpole.experiments.executor import POLL_S, Ended, LocalSlots, RunRequest, describe_node
from dqn_cartpole.experiments.objectives import FIXED_BUDGET, OBJECTIVES, env_step_budget, score, verdict
from dqn_cartpole.experiments.tracking_group import group_overrides, trial_tags
from dqn_cartpole.tracking.send import check_installed
from dqn_cartpole.processes import commands

JOURNAL_FILE = "journal.log"
TRIALS_DIR = "trials"


class TrialFailed(Exception):
    """The trial's run failed; the reason is already recorded on the trial."""


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
    check_installed((base.get("tracking") or {}).get("backend"))  # each trial would refuse it: refused here
    for (param, value), result in zip(candidates, checked):  # a trial never starts a run train would refuse
        if isinstance(result, UserError):
            raise UserError(f"--space {space_path}: {param.key}: {value!r} is not a valid value "
                            f"({str(result).split(': ', 1)[-1]})")
    name = study_name or os.path.splitext(os.path.basename(config_path))[0]
    if not name or "/" in name or name in (".", ".."):
        raise UserError(f"--study {name!r}: must be a plain name")
    folder = os.path.join(base["output"]["root"], "tune", name)
    budget = env_step_budget(base)
    trial_configs = [c for c in checked if isinstance(c, dict)]
    study_checks.check_can_solve(config_path, overrides, base, trial_configs, objective, OBJECTIVES[objective][1])
    if objective in FIXED_BUDGET:
        study_checks.check_trains_whole_budget(config_path, space_path, overrides, base, candidates, checked,
                                               objective)
    return TunePlan(name, folder, os.path.abspath(config_path), os.path.abspath(space_path), tuple(params), trials,
                    jobs, storage_url or os.path.join(folder, JOURNAL_FILE), tuple(overrides), sampler_seed,
                    budget // 3, rdb, seeds, objective, tracking=base.get("tracking"))


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


def run_tune(plan: TunePlan, executor=None) -> int:
    """Runs trials on `executor` (default: here, `plan.jobs` at a time) until the study holds `plan.trials`; writes
    best.yaml, tables and plots. Returns the exit status."""
    import optuna

    from dqn_cartpole.experiments import tune_outputs

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # each trial gets one line from us instead
    opened = plan.rdb or storage.open_storage(plan.storage_url)
    study = make_study(plan, opened)
    for number in storage.fail_dead_workers_trials(opened, plan.study_name):
        print(f"trial {number}: marked FAILED (its worker process died)", file=sys.stderr)
    remaining = plan.trials - len(study.get_trials(deepcopy=False))
    if executor is None:
        where, executor = f"with {plan.jobs} at a time", LocalSlots(plan.jobs, os.path.join(plan.folder, "logs"))
    else:
        where = f"on Ray, {f'--jobs {plan.jobs} at a time' if plan.jobs else 'one per CPU of the cluster'}"
    print(f"study {plan.study_name} in {storage.describe(plan.storage_url)}: {len(study.trials)} trials so far, "
          f"running up to {max(0, remaining)} more {where}; trials in {plan.trials_dir}", flush=True)
    _clear_staging(plan.trials_dir)
    with StopRequest(STOP_CHILDREN, second_signal_interrupts=False) as stop:
        try:
            if remaining > 0:
                StudyDriver(plan, executor, study, stop).run(remaining)
        finally:
            executor.close()
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


def _clear_staging(trials_dir: str) -> None:
    """What an interrupted `tune --ray` left half-received, in trials/ and in each trial's folder (its seeds)."""
    if os.path.isdir(trials_dir):
        ray_transfer.clear_staging(trials_dir)
        for name in os.listdir(trials_dir):  # a file too: clear_staging finds nothing to clear in it
            ray_transfer.clear_staging(os.path.join(trials_dir, name))


def continue_command(plan: TunePlan) -> str:
    argv = ["tune", "--config", plan.config_path, "--space", plan.space_path, "--trials", str(plan.trials),
            *(["--jobs", str(plan.jobs)] if plan.jobs is not None else []), *plan.runner, "--study", plan.study_name,
            "--storage", storage.describe(plan.storage_url)]
    if plan.seeds:
        argv += ["--seeds", ",".join(str(s) for s in plan.seeds)]
    if plan.objective != "env_steps":
        argv += ["--objective", plan.objective]
    return commands.continue_command(argv + commands.set_flags(plan.overrides))


class TrialRuns:
    """One trial: its run (or its seeds' runs, in turn), the evaluations reported, and its verdict."""

    def __init__(self, plan: TunePlan, trial, worker: str) -> None:
        self.plan, self.trial = plan, trial
        self.overrides, self.folder = start_trial(trial, plan, worker)
        self.rows: list[dict] = []  # the seeds done (with --seeds)
        self.pruned_at: Optional[str] = None
        self.last_step = -1

    def request(self) -> RunRequest:
        """The trial's next run. A reused worker's run counts its seconds from its own start, a fresh one's from
        its process's: the seconds objectives time a fresh process, as a person times `train`."""
        number, plan = f"{self.trial.number:04d}", self.plan
        reuse = plan.objective not in ("wall_s", "cpu_s")
        logs = os.path.join(plan.folder, "logs")
        if not plan.seeds:
            return RunRequest(number, self.folder, os.path.join(logs, f"{number}.log"), plan.config_path,
                              (*plan.overrides, *self.overrides), report_evaluations=True, reuse=reuse)
        seed = plan.seeds[len(self.rows)]
        return RunRequest(f"{number}-s{seed}", os.path.join(self.folder, f"s{seed}"),
                          os.path.join(logs, f"{number}-s{seed}.log"), plan.config_path,
                          (*plan.overrides, *self.overrides, f"training.seed={seed}"), reuse=reuse)

    def evaluations(self, pairs: list) -> Optional[str]:
        """Reports each new evaluation (negated average return at its env step: the study minimises); returns why
        the trial is pruned, once it is."""
        for step, average_return in pairs:
            if self.pruned_at or step <= self.last_step:  # a retried run evaluates the same steps again
                continue
            self.last_step = step
            self.trial.report(-average_return, step)
            if self.trial.should_prune():
                self.pruned_at = f"pruned by the median rule at env step {step} (average return {average_return:g})"
                return self.pruned_at
        return None

    def ended(self, run_dir: str, ended: Ended) -> Optional[float]:
        """The trial's value once its last run ended; None while seeds remain. Raises TrialPruned or TrialFailed."""
        if not self.plan.seeds:
            run = run_result(self.trial, run_dir, ended, self.pruned_at)
            return score_trial(self.trial, run, self.plan.objective)
        seed = self.plan.seeds[len(self.rows)]
        run = run_result(self.trial, run_dir, ended, None, seeds=True)
        mean = after_seed(self.trial, self.plan, self.rows, seed, run)
        return mean if len(self.rows) == len(self.plan.seeds) else None


class StudyDriver:
    """One tune command: asks Optuna for a trial while the executor has room (and the study holds fewer than
    `plan.trials`, counting other workers' trials), tells it each result (ask-and-tell: the study stays here)."""

    def __init__(self, plan: TunePlan, executor, study, stop: StopRequest) -> None:
        self.plan, self.executor, self.study, self.stop = plan, executor, study, stop
        self.worker = storage.worker_id()
        self.active: dict = {}  # run key -> (TrialRuns, its run folder)

    def run(self, remaining: int) -> None:
        asked, executor = 0, self.executor
        try:
            while not self.stop.requested and (asked < remaining or executor.busy()):
                while (asked < remaining and executor.room() > 0 and not self.stop.requested
                       and len(self.study.get_trials(deepcopy=False)) < self.plan.trials):
                    self._submit(TrialRuns(self.plan, self.study.ask(), self.worker))
                    asked += 1
                if not executor.busy() and len(self.study.get_trials(deepcopy=False)) >= self.plan.trials:
                    break  # other workers asked for the rest
                self._handle(executor.step(POLL_S))
        finally:
            if executor.busy():
                self._handle(executor.stop_all(self.stop.signum or signal.SIGTERM))
            for key in list(self.active):  # stopped between two seeds, or lost while stopping
                self._stopped(self.active.pop(key)[0], " before its next seed")

    def _submit(self, runs: TrialRuns) -> None:
        request = runs.request()
        self.active[request.key] = (runs, request.run_dir)
        self.executor.submit(request)

    def _handle(self, events: list) -> None:
        for event in events:
            kind, key = event[0], event[1]
            runs, _ = self.active.get(key, (None, None))
            if runs is None:
                continue
            if kind == "started" and event[3] is not None:
                runs.trial.set_user_attr("node", describe_node(event[3]))
                print(f"trial {runs.trial.number}: {key} started on {describe_node(event[3])}", flush=True)
            elif kind == "evaluations":
                if runs.evaluations(event[2]):
                    self.executor.stop(key, signal.SIGTERM)  # it saves a checkpoint and exits 143
            elif kind == "lost":
                again = "; running it again on another node" if event[4] else ""
                print(f"trial {runs.trial.number}: {key} lost with {describe_node(event[2])} "
                      f"({event[3]}){again}", file=sys.stderr, flush=True)
            elif kind == "landed":
                self._landed(key, event[2])

    def _landed(self, key: str, ended: Ended) -> None:
        runs, run_dir = self.active.pop(key)
        if ended.status is None:
            if ended.cancelled:
                self._stopped(runs, " before its run sent its folder back")
            else:
                self._tell_failed(runs.trial, f"{ended.error} (log: {ended.log_path})")
            return
        stopped = self.stop.requested and exit_status.is_stop(ended.status)
        if stopped and not runs.pruned_at:
            self._stopped(runs, "; the run folder can be continued with train --resume")
            return
        self._verdict(runs, run_dir, ended)

    def _verdict(self, runs: TrialRuns, run_dir: str, ended: Ended) -> None:
        import optuna
        from optuna.trial import TrialState

        try:
            value = runs.ended(run_dir, ended)
        except optuna.TrialPruned:
            self.study.tell(runs.trial, state=TrialState.PRUNED)
            return
        except TrialFailed:
            self.study.tell(runs.trial, state=TrialState.FAIL)
            return
        if value is not None:
            self.study.tell(runs.trial, value)
        elif self.stop.requested:
            self._stopped(runs, f" after {len(runs.rows)} seeds")
        else:
            self._submit(runs)  # its next seed

    def _stopped(self, runs: TrialRuns, when: str) -> None:
        from optuna.trial import TrialState

        runs.trial.set_user_attr("reason", f"stopped by {signal_name(self.stop.signum or signal.SIGTERM)}{when}")
        self.study.tell(runs.trial, state=TrialState.FAIL)

    def _tell_failed(self, trial, reason: str) -> None:
        from optuna.trial import TrialState

        trial.set_user_attr("reason", reason)
        print(f"trial {trial.number}: failed, {reason}", file=sys.stderr, flush=True)
        self.study.tell(trial, state=TrialState.FAIL)


# ---------------------------------------------------------------------------- one trial's decisions (here and on Ray)


def start_trial(trial, plan: TunePlan, worker: str) -> tuple[list[str], str]:
    """Samples the trial's overrides and records who runs it and where; returns (overrides, its folder)."""
    overrides = space.suggest(trial, plan.params)
    folder = os.path.join(plan.trials_dir, f"{trial.number:04d}")
    for key, value in ((storage.WORKER_ATTR, worker), ("run_dir", os.path.abspath(folder)),
                       ("overrides", list(overrides)), ("objective", plan.objective)):
        trial.set_user_attr(key, value)
    tracked = group_overrides(plan.tracking or {}, plan.study_name, trial_tags(trial.number, overrides))
    return [*overrides, *tracked], folder


def run_result(trial, run_dir: str, ended: Ended, pruned_at: Optional[str], seeds: bool = False):
    """The finished run's record; raises TrialPruned (pruned, or diverged with one seed) or TrialFailed."""
    import optuna

    from dqn_cartpole.run_folder import read_run

    if pruned_at:
        trial.set_user_attr("reason", pruned_at)
        print(f"trial {trial.number}: {pruned_at}")
        raise optuna.TrialPruned(pruned_at)
    status = ended.status
    run = read_run(run_dir) if os.path.isfile(os.path.join(run_dir, "config.yaml")) else None
    diverged = run is not None and run.get("diverged_at_iteration") is not None
    if status == exit_status.EXIT_FAILED and diverged and run.finished:
        if seeds:  # one seed of several: an unsolved seed, scored with the penalty
            return run
        reason = f"diverged (loss NaN/Inf) at iteration {run.get('diverged_at_iteration')}"
        trial.set_user_attr("reason", reason)
        print(f"trial {trial.number}: pruned, {reason}")
        raise optuna.TrialPruned(reason)
    if status != exit_status.EXIT_OK or run is None or not run.finished:
        reason = f"exit status {status}: {ended.error or 'no summary'} (log: {ended.log_path})"
        trial.set_user_attr("reason", reason)
        print(f"trial {trial.number}: failed, {reason}", file=sys.stderr)
        raise TrialFailed(reason)
    return run


def score_trial(trial, run, objective: str) -> float:
    """A one-seed trial's value: its run's score, with the run's figures kept on the trial and one line printed."""
    value = score(run, objective)
    for key in ("solved_env_steps", "solved_wall_s", "solved_cpu_s", "best_return", "final_return",
                "final_policy_return", "env_steps", "wall_s"):
        trial.set_user_attr(key, run.get(key))
    print(f"trial {trial.number}: {verdict(run, objective, value)}, best return {run.get('best_return') or 0:.1f}, "
          f"{run.get('wall_s') or 0:.1f} s")
    return value


def after_seed(trial, plan: TunePlan, rows: list[dict], seed: int, run) -> float:
    """Adds one seed's run to `rows` and reports the running mean; raises TrialPruned if the median rule stops the
    trial before its last seed. Returns the mean (the trial's value after its last seed)."""
    import optuna

    rows.append(seed_row(seed, run, score(run, plan.objective)))
    mean = statistics.mean(row["score"] for row in rows)
    for key, value in (("seeds", rows), ("per_seed", per_seed_text(rows, plan.objective)),
                       ("solved_seeds", f"{sum(r['solved'] for r in rows)}/{len(rows)}")):  # (solves seen, any objective)
        trial.set_user_attr(key, value)
    trial.report(mean, len(rows) - 1)
    if len(rows) < len(plan.seeds) and trial.should_prune():
        reason = f"pruned by the median rule after {len(rows)} seeds (mean {mean:g})"
        trial.set_user_attr("reason", reason)
        print(f"trial {trial.number}: {reason}")
        raise optuna.TrialPruned(reason)
    if len(rows) == len(plan.seeds):
        print(f"trial {trial.number}: {seeds_summary(rows, plan.objective, trial.user_attrs['solved_seeds'])}, "
              f"{mean_text(mean, plan.objective)} ({per_seed_text(rows, plan.objective)})")
    return mean


def mean_text(mean: float, objective: str) -> str:
    """The trial's mean in words: the objective's, or (a fixed-budget objective) the final policies' mean return."""
    if objective in FIXED_BUDGET:
        return f"their mean return {-mean:.1f} (objective {mean:g})"
    return f"mean {OBJECTIVES[objective][0]} {mean:g}"


def seeds_summary(rows: list[dict], objective: str, solved_seeds: str) -> str:
    """How many seeds solved, or (a fixed-budget objective) how many final policies reach the solve target."""
    if objective not in FIXED_BUDGET:
        return f"{solved_seeds} seeds solved"
    held = sum(r["final_policy_return"] is not None and r["target"] is not None and r["final_policy_return"] >= r["target"]
               for r in rows)
    return f"{held}/{len(rows)} seeds' final policies reach the solve target"


def seed_row(seed: int, run, value: float) -> dict:
    """One seed's figures, kept on the trial (JSON): its score and what it took."""
    return {"seed": seed, "score": value, "solved": run.solved, "env_steps": run.get("solved_env_steps"),
            "wall_s": run.get("solved_wall_s"), "cpu_s": run.get("solved_cpu_s"),
            "solved_return": run.get("solved_return"), "final_policy_return": run.get("final_policy_return"),
            "target": run.get("solve_return_target"),
            "run_dir": run.root}


def per_seed_text(rows: list[dict], objective: str = "env_steps") -> str:
    """'s0 8.1, s1 unsolved (40.2), ...': each seed's score, as the trials table shows it (a fixed-budget objective's
    scores alone: a seed that never confirmed a solve may still end with a final policy that holds)."""
    return ", ".join(f"s{r['seed']} {r['score']:.4g}" if r["solved"] or objective in FIXED_BUDGET
                     else f"s{r['seed']} unsolved ({r['score']:.4g})" for r in rows)
