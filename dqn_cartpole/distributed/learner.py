"""The `learn` role: the single-process training session, minus collection and evaluation, fed by collectors.

It is `training.session.TrainingSession` built from other parts (`learner_parts`; the same under `--topology
local` and `--topology ray`, where the role runs in a Ray actor's child process: `ray_role`):

* the replay: with `distributed.replay: learner` (the default) its own in-graph buffer, which its
  compiled chunk fills from the server's queue at the run's samples per insert and samples like a
  single process (`replay.learner_side`), checkpointed with the agent; with `server`, a client of
  the server's shared replay table (`rate_limiter_timeout_ms` set), checkpointed by the server;
* the fill: it waits until the collectors have written `initial_collect_steps` windows;
* the weights: a background thread pushes them every `distributed.weight_push_interval` train
  steps, and at every `evaluation.eval_interval` (`WeightPusher`);
* the evaluation: the `evaluate-live` role evaluates the pushed weights, and a background thread
  reads its published results (`StatusWatch`); a confirmed solve stops the run (`following.FollowEvaluator`);
* the finish: the evaluator's solve check owns policy/final (`following.EvaluatorSolveCheck`).

So the boundary between two compiled chunks makes no call that waits on the server, and a chunk blocked on a read
is cancelled (`distributed.cancel`: the server silent for `rate_limiter_timeout_ms`, or a stop signal not answered
within CANCEL_AFTER_S); the learner then checkpoints what it trained (`cut_short`) and leaves, as a stop or as a
crash (`exit_status.EXIT_CRASHED`): docs/distributed.md, "Every wait has a bound". Its stop (it alone writes the
run's `stop`: `status`) and its final weights' evaluation: `following`. The compiled gradient step, checkpoints,
exports, metrics and plots are the same code.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from typing import Any, Callable, Iterator, Optional

import tensorflow as tf

from dqn_cartpole.config import Config
from dqn_cartpole.console import exit_status, signals
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core import build
from dqn_cartpole.distributed import parts, status
from dqn_cartpole.distributed.cancel import ChunkCanceller
from dqn_cartpole.distributed.following import EvaluatorSolveCheck, FollowEvaluator
from dqn_cartpole.distributed.policy_lag import IntervalLag, make_lagged_train_step
from dqn_cartpole.distributed.variables import VARIABLES_TABLE, WeightPusher, WeightSync
from dqn_cartpole.errors import UserError
from dqn_cartpole.processes.commands import continue_command
from dqn_cartpole.replay import deadlines
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training import prioritized
from dqn_cartpole.training.loop import Chunk, ChunkedLoop
from dqn_cartpole.training.outcome import RunEnd
from dqn_cartpole.training.parts import Parts
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.session import TrainingSession

WAIT_POLL_S = 0.2
# After a stop signal, a chunk still running this long is blocked on a read (a chunk lasts a fraction of a second).
CANCEL_AFTER_S = 2.0
SERVER_QUIET_S = 2.0  # a server that has not answered the status watch for this long cannot checkpoint its table
NO_DATA, SERVER_GONE = "no data", "a lost replay server"  # why a learner left early (its summary's stopped_by)


def learner_parts(config: Config, address: str) -> Parts:
    """The learner's parts: data from the server at `address`, returns from the evaluator, the evaluator's solve
    check; a stop signal cancels a chunk blocked on a read, and ends the process ROLE_GIVE_UP_S later."""
    link = ServerLink(config, address)
    data = LearnerData(config, link)
    stop_request = signals.StopRequest(give_up_after_s=signals.ROLE_GIVE_UP_S)
    stop_request.when_signalled(lambda signum: link.canceller.cancel_if_still_running(
        CANCEL_AFTER_S, signals.signal_name(signum)))
    return Parts(data, FollowEvaluator(link), EvaluatorSolveCheck(lambda: data.crash), stop_request)


KEPT_PUSHES_BYTES = 64 * 2**20  # the newest pushes a learner keeps to go back to the solved ones (1,800 of the default)


def kept_bytes(config: Config) -> int:
    """How much of its newest pushed weights a learner keeps: those of a run that brings back its solved weights
    (`agent.solved_learning_rate`, `FollowEvaluator.solved_weights`), none otherwise."""
    holds = config.agent.solved_learning_rate is not None and not config.evaluation.stop_when_solved
    return KEPT_PUSHES_BYTES if holds else 0


class ServerLink:
    """The learner's calls to the server besides its replay: the weights it pushes (`WeightPusher`), the run's
    status it watches (`status.StatusWatch`), and the canceller of a chunk blocked on a read."""

    def __init__(self, config: Config, address: str):
        self.config, self.address = config, address
        self.client: Any = None
        self.pusher: Optional[WeightPusher] = None
        self.watch: Optional[status.StatusWatch] = None
        self.canceller = ChunkCanceller()

    def open(self, session: Any) -> None:
        """Starts pushing and watching. A learner that (re)starts owns the run's stop and results: a restarted
        learner (`--topology ray`) must not stop on its previous process's stop, nor take an evaluation of steps
        it has not trained yet. Made only after the restore: it re-seeds TensorFlow, which clears the eager
        kernels and with them the TF Reverb client a container made before it ("Resource ... ReverbClient does
        not exist")."""
        status.clear(self.client)
        self.pusher = WeightPusher(WeightSync(self.address, session.pipeline.agent),
                                   self.config.distributed.weight_push_interval, keep_bytes=kept_bytes(self.config))
        session.stack.callback(self.pusher.close)  # before the replay and the server's clients close
        lost_after_s = self.config.distributed.rate_limiter_timeout_ms / 1000
        self.watch = status.StatusWatch(self.client, lost_after_s=lost_after_s,
                                        on_lost=lambda: self.canceller.cancel(SERVER_GONE), on_info=self.repush_if_lost)
        session.stack.callback(self.watch.close)

    def repush_if_lost(self, info: dict) -> None:
        """A server restarted on its port (`--topology ray`) holds no weights: the collectors and the evaluator
        wait for them, so they are pushed again at once."""
        if self.pusher.pushes and int(info[VARIABLES_TABLE].current_size) == 0:
            self.pusher.repush()


class LearnerData:
    """The collectors' windows, read from the server (`parts.DataSource`)."""

    def __init__(self, config: Config, link: ServerLink):
        self.config, self.link = config, link
        # The train row's columns: the policy lag (each item's priority carries its collecting train step), or with
        # prioritized replay, where the priority is the item's own, the importance weights and the priorities.
        self.lag = IntervalLag(config.training.log_interval)
        self.priorities = prioritized.IntervalPriorities(config.training.log_interval)
        self.crash: Optional[str] = None  # why it left early: NO_DATA, SERVER_GONE

    @property
    def replay_on_learner(self) -> bool:
        return self.config.distributed.replay == "learner"

    def make_pipeline(self, session: Any, found: Optional[checkpointing.Found]) -> Pipeline:
        import reverb

        # A learner-side buffer is in the agent's checkpoint; a server loaded its table itself.
        config, address, stack = self.config, self.link.address, session.stack
        timeout_ms = config.distributed.rate_limiter_timeout_ms  # a read that waits this long fails

        def make_replay(agent: Any) -> Any:  # its own buffer, read from the queue, or a client of the server's table
            if self.replay_on_learner:
                return build.make_learner_replay(config, agent.collect_data_spec, address, agent.train_step_counter,
                                                 stack, timeout_ms)
            return build.make_replay_client(config.replay, agent.collect_data_spec, config.env.num_envs,
                                            agent.window_length, address, stack, timeout_ms, remote=True)

        pipeline = parts.remote_pipeline(config, address, stack, make_replay)
        self.link.client = reverb.Client(address)
        return pipeline

    def fill(self, session: Any) -> tuple[Any, Any, Optional[ChunkedLoop]]:
        return (), (), None  # the collectors fill the replay (`feeding` waits for it)

    def make_train(self, session: Any) -> Callable:
        """The session's gradient step, on samples that carry their collecting train step (policy lag); with
        prioritized replay, on the server table's prioritized samples, whose new priorities it writes back."""
        cfg, agent = self.config, session.pipeline.agent
        if cfg.replay.prioritized:
            return prioritized.train_step_for(cfg, agent, session.pipeline.replay)
        sample = session.pipeline.replay.sampler(cfg.training.batch_size, agent.window_length, with_tags=True)
        return make_lagged_train_step(agent, sample, cfg.training.train_steps_per_iteration, cfg.training.jit_compile)

    @contextlib.contextmanager
    def feeding(self, session: Any, time_step: Any, policy_state: Any) -> Iterator[Optional[tuple]]:
        """Pushes the first weights, waits for the data, and ends the loop on a read that waited too long or was
        cancelled (`cut_short`). No env stream here: the loop starts from no time step."""
        session.checkpoints.time_step = None  # (a restore set one): checkpoints keep no seam
        self.link.open(session)
        if not self.replay_on_learner:
            session.pipeline.replay.counts_from(lambda: self.link.watch.server_info)
        self.link.pusher.push_now()  # the collectors and the evaluator start from these weights
        try:
            filled = self.wait_for_data(session)
        except (tf.errors.OutOfRangeError, tf.errors.CancelledError) as exc:  # the fill's own read (learner mode)
            self.read_ended(session, exc)
            filled = False  # still one yield: a context manager that yields none is a RuntimeError
        try:
            yield ((), ()) if filled else None
        except (tf.errors.OutOfRangeError, tf.errors.CancelledError) as exc:
            self.read_ended(session, exc)

    def read_ended(self, session: Any, exc: Exception) -> None:
        """A read that waited rate_limiter_timeout_ms (no data), or was cancelled (see `distributed.cancel`)."""
        if isinstance(exc, tf.errors.OutOfRangeError):
            self.cut_short(session, NO_DATA)
        else:
            self.cut_short(session, self.link.canceller.reason or SERVER_GONE)

    def running_chunk(self) -> contextlib.AbstractContextManager:
        return self.link.canceller.running()

    def after_chunk(self, session: Any, chunk: Chunk) -> None:
        session.checkpoints.time_step = None  # no env stream here: checkpoints keep no seam
        columns = self.priorities if self.config.replay.prioritized else self.lag
        session.state.row_extras = columns.row(chunk.first, chunk.extras)
        parts.count_env_steps(session.pipeline, session.pipeline.replay.inserts)

    def wait_for_data(self, session: Any) -> bool:
        """Waits until the replay holds `initial_collect_steps` windows (or what a resumed run's next step
        needs), so the first sample finds data; False if stopped first."""
        stopped = lambda: session.stop_request.requested  # noqa: E731
        replay = session.pipeline.replay
        if self.replay_on_learner:
            with self.link.canceller.running():
                filled = replay.fill(stopped)
        else:
            while replay.size() < self.config.training.initial_collect_steps and not stopped():
                time.sleep(WAIT_POLL_S)
                self.link.watch.poll()
            filled = not stopped()
        parts.count_env_steps(session.pipeline, replay.inserts)
        return filled

    def cut_short(self, session: Any, reason: str) -> None:
        """A chunk ended early: by a signal (a stop), or with no data or no server (a crash). Every train step it
        completed is in the variables (a chunk waits on a read only before a step), so the run's iteration
        follows the train step; then a checkpoint, unless the server holding the run's replay is gone."""
        state, per_iteration = session.state, self.config.training.train_steps_per_iteration
        state.iteration = max(state.iteration, session.pipeline.train_step_count() // per_iteration)
        state.stopped_by = reason
        if reason not in (signals.signal_name(s) for s in exit_status.STOP_SIGNALS):
            self.crash, state.failed = reason, True
            session.progress.message(f"error: {self.crash_line(reason)}")
        if self.replay_on_learner or self.link.watch.unanswered_s() < SERVER_QUIET_S:
            save_checkpoint(session)
        else:
            session.progress.message("The replay server holds this run's replay and is gone: no new checkpoint.")

    def crash_line(self, reason: str) -> str:
        timeout_s = self.config.distributed.rate_limiter_timeout_ms / 1000
        if reason == NO_DATA:
            return (f"the replay had no new data for {timeout_s:g} s (distributed.rate_limiter_timeout_ms): are the "
                    f"collectors running? Stopping with a checkpoint.")
        return (f"the replay server at {self.link.address} did not answer for {timeout_s:g} s "
                f"(distributed.rate_limiter_timeout_ms); stopping.")


def save_checkpoint(session: Any) -> None:
    """A checkpoint now; one line if the server (whose table a shared replay checkpoints) cannot take part."""
    try:
        session.checkpoints.save()
    except (deadlines.ServerProblem, RuntimeError) as exc:
        session.progress.message(f"error: no checkpoint written: the replay server did not take part ({exc})")


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
            end.summary = TrainingSession(config, RunLayout(run_dir), progress, plan,
                                          parts=learner_parts(config, address)).run()
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
