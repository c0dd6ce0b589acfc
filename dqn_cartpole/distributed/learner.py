"""The `learn` role: the single-process training session, minus collection and evaluation, fed by collectors.

It is `training.session.TrainingSession` with its parts swapped:

* the replay: with `distributed.replay: learner` (the default) its own in-graph buffer, which its
  compiled chunk fills from the server's queue at the run's samples per insert and samples like a
  single process (`replay.learner_side`), checkpointed with the agent; with `server`, a client of
  the server's shared replay table (`rate_limiter_timeout_ms` set), checkpointed by the server;
* the fill: it waits until the collectors have written `initial_collect_steps` windows;
* the weights: a background thread pushes them every `distributed.weight_push_interval` train
  steps, and at every `evaluation.eval_interval` (`WeightPusher`);
* the evaluation: the `evaluate-live` role evaluates the pushed weights, and a background thread
  reads its published results (`StatusWatch`); a confirmed solve stops the run.

So the boundary between two compiled chunks makes no call that waits on the server, and the reads inside a
chunk can be cancelled (`distributed.cancel`): when the server has not answered for
`rate_limiter_timeout_ms` (gone, or stuck), or a stop signal is not answered within CANCEL_AFTER_S, the
blocked chunk is cancelled, and the learner checkpoints what it trained (`cut_short`) and leaves: a
signal is a stop (130 / 143), no data or a lost server a crash (`exit_status.EXIT_CRASHED`, which the
launcher reports with the last checkpoint and the resume command). Like every role, it is ended
ROLE_GIVE_UP_S after a signal whatever happens. When it stops
(solved, or all iterations done) it writes the run's `stop`, which the collectors and the
evaluator watch; only the learner writes it, so collectors never leave while it still reads. After
its last iteration it pushes its final weights first and waits for their evaluation.
The compiled gradient step, checkpoints, exports, metrics and plots are the same code.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Callable, Optional

import tensorflow as tf

from dqn_cartpole.config import Config
from dqn_cartpole.console import exit_status, signals
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.distributed import parts, status
from dqn_cartpole.distributed.cancel import ChunkCanceller
from dqn_cartpole.distributed.policy_lag import IntervalLag, make_lagged_train_step
from dqn_cartpole.distributed.variables import VARIABLES_TABLE, WeightPusher, WeightSync
from dqn_cartpole.errors import UserError
from dqn_cartpole.processes.commands import continue_command
from dqn_cartpole.replay import deadlines
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training.loop import Chunk
from dqn_cartpole.training.outcome import RunEnd
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.session import TrainingSession

WAIT_POLL_S = 0.2
# After a stop signal, a chunk still running this long is blocked on a read (a chunk lasts a fraction of a second).
CANCEL_AFTER_S = 2.0
SERVER_QUIET_S = 2.0  # a server that has not answered the status watch for this long cannot checkpoint its table
NO_DATA, SERVER_GONE = "no data", "a lost replay server"  # why a learner left early (its summary's stopped_by)


class LearnerSession(TrainingSession):
    """A training session whose data comes from collectors, and whose returns from an evaluator, in other processes."""

    solved_elsewhere = True  # the evaluator's solve check exports policy/final (see TrainingSession)

    def __init__(self, config: Config, layout: RunLayout, progress: Progress,
                 plan: Optional[checkpointing.ResumePlan], address: str):
        super().__init__(config, layout, progress, plan)
        self.address = address
        self.pusher: Optional[WeightPusher] = None
        self.watch: Optional[status.StatusWatch] = None
        self.client: Any = None
        self.lag = IntervalLag(config.training.log_interval)
        self.crash: Optional[str] = None  # why it left early: NO_DATA, SERVER_GONE
        self.canceller = ChunkCanceller()
        self.stop_request = signals.StopRequest(give_up_after_s=signals.ROLE_GIVE_UP_S)
        self.stop_request.when_signalled(lambda signum: self.canceller.cancel_if_still_running(
            CANCEL_AFTER_S, signals.signal_name(signum)))

    @property
    def replay_on_learner(self) -> bool:
        return self.config.distributed.replay == "learner"

    def make_pipeline(self, found: Optional[checkpointing.Found]) -> Pipeline:
        import reverb

        # A learner-side buffer is in the agent's checkpoint; a server loaded its table itself.
        make_replay = parts.learner_replay(self.config, self.address, self.stack,
                                           self.config.distributed.rate_limiter_timeout_ms)
        pipeline = parts.remote_pipeline(self.config, self.address, self.stack, make_replay)
        self.client = reverb.Client(self.address)
        return pipeline

    def make_evaluation(self, scalars: Scalars) -> Callable[[], None]:
        # At every eval_interval: the evaluator evaluates the newest weights once the interval has passed.
        return lambda: self.pusher.request()

    def iterate(self, time_step: Any, policy_state: Any) -> None:
        self.checkpoints.time_step = None  # no env stream here (a restore set one): checkpoints keep no seam
        # A learner that (re)starts owns the run's stop and results: a restarted learner (`--topology ray`) must
        # not stop on its previous process's stop, nor take an evaluation of steps it has not trained yet.
        status.clear(self.client)
        # Made only now: a restore re-seeds TensorFlow, which clears the eager kernels and with them the
        # TF Reverb client a container made before it ("Resource ... ReverbClient does not exist").
        self.pusher = WeightPusher(WeightSync(self.address, self.pipeline.agent),
                                   self.config.distributed.weight_push_interval)
        self.stack.callback(self.pusher.close)  # before the replay and the server's clients close
        self.watch = status.StatusWatch(self.client, lost_after_s=self.config.distributed.rate_limiter_timeout_ms / 1000,
                                        on_lost=lambda: self.canceller.cancel(SERVER_GONE), on_info=self.repush_if_lost)
        self.stack.callback(self.watch.close)
        if not self.replay_on_learner:
            self.pipeline.replay.counts_from(lambda: self.watch.server_info)
        self.pusher.push_now()  # the collectors and the evaluator start from these weights
        try:
            if self.wait_for_data():
                super().iterate((), ())
        except tf.errors.OutOfRangeError:  # a read that waited rate_limiter_timeout_ms
            self.cut_short(NO_DATA)
        except tf.errors.CancelledError:  # see `distributed.cancel`
            self.cut_short(self.canceller.reason or SERVER_GONE)

    def repush_if_lost(self, info: dict) -> None:
        """A server restarted on its port (`--topology ray`) holds no weights: the collectors and the evaluator
        wait for them, so they are pushed again at once."""
        if self.pusher.pushes and int(info[VARIABLES_TABLE].current_size) == 0:
            self.pusher.repush()

    def running_chunk(self) -> Any:
        return self.canceller.running()

    def make_train(self) -> Callable:
        """The session's gradient step, on samples that carry their collecting train step (policy lag)."""
        cfg = self.config
        sample = self.pipeline.replay.sampler(cfg.training.batch_size, self.pipeline.agent.window_length,
                                              with_tags=True)
        return make_lagged_train_step(self.pipeline.agent, sample, cfg.training.train_steps_per_iteration,
                                      cfg.training.jit_compile)

    def after_chunk(self, chunk: Chunk) -> None:
        self.checkpoints.time_step = None  # no env stream here: checkpoints keep no seam
        self.state.row_extras = self.lag.row(chunk.first, chunk.extras)
        parts.count_env_steps(self.pipeline, self.pipeline.replay.inserts)
        self.follow_evaluator(self.watch.evaluation)

    def wait_for_data(self) -> bool:
        """Waits until the replay holds `initial_collect_steps` windows (or what a resumed run's next step
        needs), so the first sample finds data; False if stopped first."""
        stopped = lambda: self.stop_request.requested  # noqa: E731
        if self.replay_on_learner:
            with self.canceller.running():
                filled = self.pipeline.replay.fill(stopped)
        else:
            while self.pipeline.replay.size() < self.config.training.initial_collect_steps and not stopped():
                time.sleep(WAIT_POLL_S)
                self.watch.poll()
            filled = not stopped()
        parts.count_env_steps(self.pipeline, self.pipeline.replay.inserts)
        return filled

    def cut_short(self, reason: str) -> None:
        """A chunk ended early: by a signal (a stop), or with no data or no server (a crash). Every train step it
        completed is in the variables (a chunk waits on a read only before a step), so the run's iteration
        follows the train step; then a checkpoint, unless the server holding the run's replay is gone."""
        state, per_iteration = self.state, self.config.training.train_steps_per_iteration
        state.iteration = max(state.iteration, self.pipeline.train_step_count() // per_iteration)
        state.stopped_by = reason
        if reason not in (signals.signal_name(s) for s in exit_status.STOP_SIGNALS):
            self.crash, state.failed = reason, True
            self.progress.message(f"error: {self.crash_line(reason)}")
        if self.replay_on_learner or self.watch.unanswered_s() < SERVER_QUIET_S:
            self.save_checkpoint()
        else:
            self.progress.message("The replay server holds this run's replay and is gone: no new checkpoint.")

    def crash_line(self, reason: str) -> str:
        if reason == NO_DATA:
            return (f"the replay had no new data for {self.config.distributed.rate_limiter_timeout_ms / 1000:g} s "
                    f"(distributed.rate_limiter_timeout_ms): are the collectors running? Stopping with a checkpoint.")
        return (f"the replay server at {self.address} did not answer for "
                f"{self.config.distributed.rate_limiter_timeout_ms / 1000:g} s (distributed.rate_limiter_timeout_ms); "
                f"stopping.")

    def save_checkpoint(self) -> None:
        """A checkpoint now; one line if the server (whose table a shared replay checkpoints) cannot take part."""
        try:
            self.checkpoints.save()
        except (deadlines.ServerProblem, RuntimeError) as exc:
            self.progress.message(f"error: no checkpoint written: the replay server did not take part ({exc})")

    def finish(self) -> dict:
        summary = super().finish()
        if self.crash is not None:
            summary["exit_status"] = self.state.exit_status = exit_status.EXIT_CRASHED
        return summary

    # -- the evaluator's results
    def follow_evaluator(self, evaluation: Optional[status.Evaluation]) -> Optional[status.Evaluation]:
        """Takes the evaluator's newest result into the run state; a confirmed solve stops the run."""
        if evaluation is None:
            return None
        state, per_iteration = self.state, self.config.training.train_steps_per_iteration
        state.last_return = evaluation.average_return
        state.best_return, state.best_iteration = evaluation.best_return, evaluation.best_iteration
        if evaluation.solved and state.solved_at_iteration is None and self.config.evaluation.stop_when_solved:
            state.stop = True
            state.solved_at_iteration = evaluation.train_step // per_iteration
            state.solved_return, state.solved_env_steps = evaluation.solved_return, evaluation.env_steps
            state.solved_wall_s = self.clock.wall()
            self.progress.message(
                f"Solved at iteration {state.solved_at_iteration} (the evaluator's check: average return "
                f"{evaluation.solved_return:.1f} over {evaluation.solved_episodes} greedy episodes); stopping at "
                f"iteration {state.iteration}.")
        return evaluation

    def final_evaluation(self) -> None:
        """Pushes the final weights, tells every role to stop, and waits for the evaluation of those weights."""
        if self.state.solved_at_iteration is not None:  # the evaluator confirmed a solve, and has left
            status.publish_stop(self.client, self.pipeline.train_step_count(), solved=True)
            return
        if self.crash is not None:
            return
        train_step = self.pusher.push_now()
        status.publish_stop(self.client, train_step, solved=False)
        deadline = time.monotonic() + self.config.distributed.final_evaluation_timeout_s
        while time.monotonic() < deadline and not self.stop_request.requested and not self.watch.lost:
            evaluation = self.follow_evaluator(self.watch.evaluation)
            if evaluation is not None and evaluation.train_step >= train_step:
                return
            time.sleep(WAIT_POLL_S)
        why = ("the replay server stopped answering" if self.watch.lost else
               f"{self.config.distributed.final_evaluation_timeout_s:g} s passed (is an evaluate-live role running?)")
        self.progress.message(f"warning: no evaluation of train step {train_step} arrived before {why}; policy/final "
                              f"is exported without a measured return")
        self.state.last_return = None

    def finishes_lightly(self) -> bool:
        # After a stop signal the watchdog ends this process ROLE_GIVE_UP_S later: the checkpoint, policy/final
        # and the summary fit, videos and plots may not (the launcher redraws the plots once every role stopped).
        return self.stop_request.requested

    def keeps_solved_policy(self) -> bool:
        # The evaluator exported the policy it confirmed; the learner trained on a little while the word came.
        return self.state.solved_at_iteration is not None and os.path.exists(self.layout.final_policy)


def learn(config: Config, layout: RunLayout, progress: Progress, plan: Optional[checkpointing.ResumePlan],
          address: str) -> dict:
    """Trains from the server at `address`, writing everything under `layout.root`; returns the summary."""
    return LearnerSession(config, layout, progress, plan, address).run()


def run_learner(config: Config, run_dir: str, address: str, plan: Optional[checkpointing.ResumePlan], created: bool,
                quiet: bool, supervised: bool) -> int:
    """The learn role from start to end: the training, then summary.json, report.html and the summary; returns
    its exit status. Supervised, the launcher prints how to resume the whole topology; by hand, the role
    resumes alone."""
    progress = Progress(config.training.num_iterations, enabled=not quiet)
    progress.message(f"Learning {config.env.id} from the replay server at {address} -> {run_dir}")
    hint = None if supervised else continue_command(
        ["learn", "--resume", "--config", f"{run_dir}/config.yaml", "--replay-address", address, "--run-dir", run_dir])
    try:
        with RunEnd(run_dir, created, progress, hint) as end:
            end.summary = learn(config, RunLayout(run_dir), progress, plan, address)
        return end.finish()
    except (UserError, OSError):
        raise  # the command line's one line (bad input: 2; the disk: 1)
    except Exception as exc:  # pylint: disable=broad-except  # a crash: one line, the traceback in the roles' folder
        return report_crash(exc, RunLayout(run_dir))


def report_crash(exc: BaseException, layout: RunLayout) -> int:
    """One line on stderr for an uncaught error, its traceback in roles/learner-crash.log; EXIT_CRASHED."""
    os.makedirs(layout.roles, exist_ok=True)
    log_path = os.path.join(layout.roles, "learner-crash.log")
    with open(log_path, "a", encoding="utf-8") as log:
        traceback.print_exception(exc, file=log)
    first = (str(exc).strip().splitlines() or [""])[0]
    print(f"error: the learner crashed: {type(exc).__name__}: {first} (traceback in {log_path})", file=sys.stderr,
          flush=True)
    return exit_status.EXIT_CRASHED
