"""`tune --ray`: the study stays with the driver, its runs train on the cluster's nodes. No database is needed.

The driver owns the study in its storage (the journal file by default, as a local `tune`), asks Optuna for each
trial and tells it the result (Optuna's ask-and-tell), one trial per CPU of the cluster. A worker only trains:
its run folder comes back into `trials/NNNN/` (`trials/NNNN/sSEED/` with --seeds) and is scored here exactly as a
local trial (`tune.run_result`, `score_trial`, `after_seed`). Pruning works as locally: with one seed the run
passes each evaluation to the driver through the board, the driver reports it to the trial and, when the median
rule prunes it, tells the run to stop (SIGTERM: it saves a checkpoint and sends its folder back); with several
seeds they train one after another, each a task, and the trial may be pruned between them. Ctrl-C stops every
run, marks their trials FAILED with the reason (their folders can be continued with `train --resume`), writes
the outputs and prints the command that continues the study.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional

from dqn_cartpole.console import exit_status
from dqn_cartpole.console.signals import STOP_CHILDREN, StopRequest, signal_name
from dqn_cartpole.experiments import ray_transfer, storage, tune
from dqn_cartpole.experiments.executor import Ended, RayActors, RunRequest, describe_node
from dqn_cartpole.experiments.tune import RunEnded, TrialFailed, TunePlan

POLL_S = 0.5
STOP_WAIT_S = 150.0  # a local trial's 120 s for the checkpoint, and the folder's way back


class RayTrial:
    """One trial on Ray: its run (or its seeds' runs, in turn), the evaluations reported, and its verdict."""

    def __init__(self, plan: TunePlan, trial, worker: str) -> None:
        self.plan, self.trial = plan, trial
        self.overrides, self.folder = tune.start_trial(trial, plan, worker)
        self.rows: list[dict] = []  # the seeds done (with --seeds)
        self.pruned_at: Optional[str] = None
        self.last_step = -1

    def request(self) -> RunRequest:
        """The next run of the trial (a reused worker's run counts its seconds from its own start: the seconds
        objectives time fresh ones)."""
        number, plan = f"{self.trial.number:04d}", self.plan
        reuse = plan.objective == "env_steps"
        logs = os.path.join(plan.folder, "logs")
        if not plan.seeds:
            return RunRequest(number, self.folder, os.path.join(logs, f"{number}.log"), plan.config_path,
                              (*plan.overrides, *self.overrides), report_evaluations=True, reuse=reuse)
        seed = plan.seeds[len(self.rows)]
        return RunRequest(f"{number}-s{seed}", os.path.join(self.folder, f"s{seed}"),
                          os.path.join(logs, f"{number}-s{seed}.log"), plan.config_path,
                          (*plan.overrides, *self.overrides, f"training.seed={seed}"), reuse=reuse)

    def evaluations(self, pairs: list) -> Optional[str]:
        """Reports each new evaluation (negated average return at its env step); returns why the trial is pruned,
        once it is."""
        for step, average_return in pairs:
            if self.pruned_at or step <= self.last_step:  # a retried run evaluates the same steps again
                continue
            self.last_step = step
            self.trial.report(-average_return, step)
            if self.trial.should_prune():
                self.pruned_at = f"pruned by the median rule at env step {step} (average return {average_return:g})"
                return self.pruned_at
        return None

    def ended(self, ended: RunEnded) -> Optional[float]:
        """The trial's value once its last run ended; None while seeds remain. Raises TrialPruned or TrialFailed."""
        if not self.plan.seeds:
            run = tune.run_result(self.trial, ended, self.pruned_at)
            return tune.score_trial(self.trial, run, self.plan.objective)
        seed = self.plan.seeds[len(self.rows)]
        run = tune.run_result(self.trial, ended, None, seeds=True)
        mean = tune.after_seed(self.trial, self.plan, self.rows, seed, run)
        return mean if len(self.rows) == len(self.plan.seeds) else None


class RayStudy:
    """One `tune --ray` command: asks for trials while the cluster has room, tells their results."""

    def __init__(self, plan: TunePlan, ray, study, stop: StopRequest) -> None:
        self.plan, self.ray, self.study, self.stop = plan, ray, study, stop
        self.worker = storage.worker_id()
        self.pool = RayActors(ray, plan.jobs)
        self.active: dict = {}  # job key -> (RayTrial, its run folder here)

    def run(self, remaining: int) -> None:
        asked = 0
        try:
            while not self.stop.requested and (asked < remaining or self.pool.flights):
                while asked < remaining and self.pool.room() > 0 and not self.stop.requested:
                    self._submit(RayTrial(self.plan, self.study.ask(), self.worker))
                    asked += 1
                self._handle(self.pool.step(POLL_S))
        finally:
            if self.pool.flights:
                self._handle(self.pool.stop_all(self.stop.signum or signal.SIGTERM, STOP_WAIT_S))
            self.pool.close()
            for key in list(self.active):  # stopped between two seeds, or lost while stopping
                self._stopped(self.active.pop(key)[0], " before its next seed")

    def _submit(self, ray_trial: RayTrial) -> None:
        request = ray_trial.request()
        self.active[request.key] = (ray_trial, request.run_dir)
        self.pool.submit(request)

    def _handle(self, events: list) -> None:
        for event in events:
            kind, key = event[0], event[1]
            ray_trial, _ = self.active.get(key, (None, None))
            if ray_trial is None:
                continue
            if kind == "started":
                ray_trial.trial.set_user_attr("node", describe_node(event[3]))
                print(f"trial {ray_trial.trial.number}: {key} started on {describe_node(event[3])}", flush=True)
            elif kind == "evaluations":
                if ray_trial.evaluations(event[2]):
                    self.pool.stop(key, signal.SIGTERM)  # it saves a checkpoint and exits 143
            elif kind == "lost":
                again = "; running it again on another node" if event[4] else ""
                print(f"trial {ray_trial.trial.number}: {key} lost with {describe_node(event[2])} "
                      f"({event[3]}){again}", file=sys.stderr, flush=True)
            else:
                self._landed(key, event[2])

    def _landed(self, key: str, ended: Ended) -> None:
        ray_trial, run_dir = self.active.pop(key)
        if ended.status is None:
            if ended.cancelled:
                self._stopped(ray_trial, " before its run sent its folder back")
            else:
                self._tell_failed(ray_trial.trial, f"{ended.error} (log: {ended.log_path})")
            return
        stopped = self.stop.requested and exit_status.is_stop(ended.status)
        if stopped and not ray_trial.pruned_at:
            self._stopped(ray_trial, "; the run folder can be continued with train --resume")
            return
        self._verdict(ray_trial, RunEnded(run_dir, ended.status, ended.error, ended.log_path))

    def _verdict(self, ray_trial: RayTrial, ended: RunEnded) -> None:
        import optuna
        from optuna.trial import TrialState

        trial = ray_trial.trial
        try:
            value = ray_trial.ended(ended)
        except optuna.TrialPruned:
            self.study.tell(trial, state=TrialState.PRUNED)
            return
        except TrialFailed:
            self.study.tell(trial, state=TrialState.FAIL)
            return
        if value is not None:
            self.study.tell(trial, value)
        elif self.stop.requested:
            self._stopped(ray_trial, f" after {len(ray_trial.rows)} seeds")
        else:
            self._submit(ray_trial)  # its next seed

    def _stopped(self, ray_trial: RayTrial, when: str) -> None:
        from optuna.trial import TrialState

        name = signal_name(self.stop.signum or signal.SIGTERM)
        ray_trial.trial.set_user_attr("reason", f"stopped by {name}{when}")
        self.study.tell(ray_trial.trial, state=TrialState.FAIL)

    def _tell_failed(self, trial, reason: str) -> None:
        from optuna.trial import TrialState

        trial.set_user_attr("reason", reason)
        print(f"trial {trial.number}: failed, {reason}", file=sys.stderr, flush=True)
        self.study.tell(trial, state=TrialState.FAIL)


def run_tune_on_ray(plan: TunePlan, ray) -> int:
    """Runs trials on the cluster until the study holds `plan.trials`; writes the outputs. Returns the exit status."""
    import optuna

    from dqn_cartpole.experiments import tune_outputs

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    opened = plan.rdb or storage.open_storage(plan.storage_url)
    study = tune.make_study(plan, opened)
    for number in storage.fail_dead_workers_trials(opened, plan.study_name):
        print(f"trial {number}: marked FAILED (its worker process died)", file=sys.stderr)
    remaining = plan.trials - len(study.get_trials(deepcopy=False))
    at_a_time = f"--jobs {plan.jobs} at a time" if plan.jobs else "one per CPU of the cluster"
    print(f"study {plan.study_name} in {storage.describe(plan.storage_url)}: {len(study.trials)} trials so far, "
          f"running up to {max(0, remaining)} more on Ray, {at_a_time}; trials in {plan.trials_dir}", flush=True)
    _clear_staging(plan.trials_dir)
    with StopRequest(STOP_CHILDREN, second_signal_interrupts=False) as stop:
        if remaining > 0:
            RayStudy(plan, ray, study, stop).run(remaining)
    for line in tune_outputs.write_outputs(study, plan):
        print(line)
    if stop.signum is not None:
        print(f"Stopped by {signal_name(stop.signum)}. Continue the study with the same command:\n  "
              f"{tune.continue_command(plan)}")
        return exit_status.for_signal(stop.signum)
    return exit_status.EXIT_OK


def _clear_staging(trials_dir: str) -> None:
    """What an interrupted command left half-received, in trials/ and in each trial's folder (its seeds)."""
    if not os.path.isdir(trials_dir):
        return
    ray_transfer.clear_staging(trials_dir)
    for name in os.listdir(trials_dir):
        if os.path.isdir(os.path.join(trials_dir, name)):
            ray_transfer.clear_staging(os.path.join(trials_dir, name))
