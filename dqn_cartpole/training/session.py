"""The training run, as a story: prepare the folder, build, fill replay (or resume), iterate, finish.

Each phase is one method of `TrainingSession`, which a way of running does not subclass: it picks the session's
three parts (`parts`: where the data come from, where the returns come from, what the end writes), the single
process `local.single_process_parts`, the learner role `distributed.learner.learner_parts`. The work the phases
share lives next door: the compiled loop (`loop`), the periodic work (`triggers`), checkpoints and resuming
(`checkpoints`) and the run's state (`state`). Everything the run opens is closed by one ExitStack, in reverse.
"""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Any, Optional

from dqn_cartpole.config import Config, dump_yaml, sampling_mode
from dqn_cartpole.console import signals
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core import build
from dqn_cartpole.core.policies import greedy_policy
from dqn_cartpole.core.q_probe import QProbe
from dqn_cartpole.core.seeding import seed_everything
from dqn_cartpole.run_folder import checkpointing, policy_files
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.csv_files import CsvLog
from dqn_cartpole.run_folder.metrics import TRAIN_COLUMNS
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training import atoms, checkpoints as run_checkpoints, final_policy, local, phases as phase, triggers
from dqn_cartpole.training.artifacts import ArtifactWorkers
from dqn_cartpole.training.host import Host, own_process
from dqn_cartpole.training.loop import ChunkedLoop, make_iterations, run_ops_on_one_thread
from dqn_cartpole.training.parts import Parts
from dqn_cartpole.training.phases import Phases
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.state import RunState


class TrainingSession:
    """One training run, built from `parts` (the single process's unless given). `run()` goes through the phases
    and returns the summary (summary.json's content)."""

    def __init__(self, config: Config, layout: RunLayout, progress: Progress,
                 plan: Optional[checkpointing.ResumePlan] = None, host: Optional[Host] = None,
                 parts: Optional[Parts] = None):
        self.config, self.layout, self.progress, self.plan = config, layout, progress, plan
        self.host = host or own_process()
        # The CLI's wall times count from the process's start, as a user sees them; a shared process's from now.
        self.clock = triggers.Clock(self.host.started, self.host.cpu_started)
        self.phases = Phases(started_s_ago=self.clock.wall())  # summary.json's `phases`: where the seconds went
        if self.host.owns_process:
            gc.freeze()  # the imports' objects (`host`: why); the traced graph's follow after the first chunk
        self.parts = parts or local.single_process_parts()
        self.data, self.evaluation, self.ending = self.parts.data, self.parts.evaluation, self.parts.finish
        self.stop_request = self.parts.stop_request
        self.state = RunState()
        self.stack = contextlib.ExitStack()
        self.pipeline: Optional[Pipeline] = None
        self.checkpoints: Optional[run_checkpoints.Checkpoints] = None
        self.exporter: Optional[triggers.PolicyExport] = None
        self.evaluate: Any = None  # the periodic evaluation (`Evaluation.make`)
        self.log_train: Optional[triggers.LogTrain] = None
        self.workers: Optional[ArtifactWorkers] = None  # the plotter and the video renderer (child processes)
        self.trained = False  # whether this process ran the loop (a resumed run may have had nothing left to do)
        self.after_solve: Optional[final_policy.AfterSolve] = None  # made at the loop (`run_loop`)
        self.loop: Optional[ChunkedLoop] = None  # prepared beside the random fill (`DataSource.fill`), else at the loop

    def run(self) -> dict:
        with self.stop_request, self.stack:
            try:
                with self.phases(phase.STARTUP):  # starting two children takes a while on a busy machine
                    found = run_checkpoints.prepare_folder(self.layout, self.plan)
                    # The plotter and the renderer start now: their imports overlap the training.
                    self.workers = ArtifactWorkers(self.config, self.layout, self.progress, self.phases)
                time_step, policy_state = self.build(found)
                if found is None or not run_checkpoints.already_done(found, self.config):
                    with self.data.feeding(self, time_step, policy_state) as start:
                        if start is not None:
                            with self.phases(phase.LOOP):
                                self.run_loop(*start)
                return self.finish()
            except checkpointing.DiskFullError:
                raise
            except Exception as exc:  # pylint: disable=broad-except
                if checkpointing.is_disk_full(exc):
                    where = getattr(exc, "filename", None) or self.layout.root
                    raise checkpointing.DiskFullError(
                        f"disk full while writing {where} (no space left on device)") from None
                raise
            finally:
                if self.workers is not None:
                    self.workers.close()  # their work done, or never coming

    # -- phases
    def build(self, found: Optional[checkpointing.Found]) -> tuple[Any, Any]:
        """Builds the pipeline, logs and triggers; restores `found` or fills replay. Returns where collection starts."""
        cfg, layout = self.config, self.layout
        with self.phases(phase.BUILD):
            if self.host.owns_process and cfg.collection.driver == "compiled" and \
                    sampling_mode(cfg.replay) == "direct":
                run_ops_on_one_thread()  # a chain of small ops: see there (tf.data and Reverb keep their threads)
            seed_everything(cfg.training.seed)
            pipeline = self.pipeline = self.data.make_pipeline(self, found)
            self.checkpoints = run_checkpoints.Checkpoints(layout, pipeline, cfg, self.state, self.clock)
            if found is not None:
                time_step, policy_state = self.checkpoints.restore(found, self.progress.message)
            self.open_logs()
        if found is None:
            time_step, policy_state, self.loop = self.data.fill(self)
        return time_step, policy_state

    def open_logs(self) -> None:
        cfg, layout, pipeline, state = self.config, self.layout, self.pipeline, self.state
        write_text_atomic(layout.config, dump_yaml(cfg))
        train_log = self.stack.enter_context(contextlib.closing(CsvLog(layout.train_metrics, TRAIN_COLUMNS)))
        scalars = self.stack.enter_context(contextlib.closing(
            Scalars(layout.tensorboard if cfg.output.tensorboard else None)))
        q_probe = QProbe.for_agent(pipeline.agent, cfg.env.id, cfg.training.seed, cfg.env.max_episode_steps)
        self.exporter = triggers.PolicyExport(pipeline, cfg, state, self.phases)
        self.evaluate = self.evaluation.make(self, scalars)
        self.log_train = triggers.LogTrain(pipeline, cfg, state, train_log, scalars, q_probe, self.clock)

    def make_loop(self) -> ChunkedLoop:
        """The compiled loop of the data source's train step (and collect driver), in chunks that end on every
        trigger's interval."""
        cfg = self.config
        intervals = [cfg.training.log_interval, cfg.evaluation.eval_interval, cfg.training.checkpoint_interval]
        return ChunkedLoop(make_iterations(self.data.make_train(self), self.pipeline.collect_driver), intervals)

    def run_loop(self, time_step: Any, policy_state: Any) -> None:
        """Runs compiled chunks of iterations, stopping at every due trigger and at a stop request; then the final
        evaluation and checkpoint."""
        cfg, state, pipeline, timed = self.config, self.state, self.pipeline, self.phases.timed
        self.trained = True
        total = cfg.training.num_iterations
        periodic = [(cfg.training.log_interval, timed(phase.TRAIN_ROWS, self.log_train)),
                    (cfg.evaluation.eval_interval, timed(phase.EVALUATIONS, self.evaluate)),
                    # last: after the rows it keeps (and the evaluation in flight, taken in first)
                    (cfg.training.checkpoint_interval,
                     timed(phase.CHECKPOINTS, triggers.PeriodicCheckpoint(self.checkpoints.save, state, total,
                                                                          before=self.evaluation.settle)))]
        loop = self.loop or self.make_loop()  # (the same intervals as `periodic`'s)
        if isinstance(pipeline.collect_driver, build.PyCollection):  # it goes on from the Python env's time step
            time_step = pipeline.envs.collect.current_time_step()
        due = [triggers.every(interval, trigger, state.iteration) for interval, trigger in periodic]
        after_solve = self.after_solve = final_policy.AfterSolve(cfg, state.solved_at_iteration is not None)
        if self.checkpoints.restored is None:
            with self.phases(phase.FIRST_EVALUATION):
                self.evaluate()  # iteration 0: the untrained policy, as in the tutorial
        while state.iteration < total and not state.stop and not self.stop_request.requested:
            first = not loop.traced
            with self.phases(phase.FIRST_CHUNK if first else phase.LOOP), self.data.running_chunk():
                chunk = loop.run(state.iteration, total, time_step, policy_state)
                if first and self.host.owns_process:
                    gc.freeze()
            state.loop_s, state.loop_iterations = loop.loop_s, loop.loop_iterations
            bad = chunk.first_bad_loss()
            if bad is not None:  # (an evaluation in flight is dropped with its worker)
                self.checkpoints.diverge(*bad, self.progress.message)
                return
            time_step, policy_state = chunk.time_step, chunk.policy_state
            state.iteration += chunk.size
            state.add_losses(chunk.losses)  # the train row logs their mean and max over its interval
            self.checkpoints.time_step = time_step
            self.data.after_chunk(self, chunk)
            self.evaluation.after_chunk(self, chunk)
            for trigger in due:
                trigger(state.iteration)
            after_solve(self)
            self.progress.update(state.iteration, state.loss, state.last_return)
        self.evaluation.settle()
        if self.stop_request.requested and state.iteration < total and not state.stop:
            state.stopped_by = signals.signal_name(self.stop_request.signum)
        if not self.stop_request.requested:
            self.evaluation.final(self)
            self.evaluation.settle()
            if not state.stop and not state.failed and state.iteration >= total:
                with self.phases(phase.EVALUATIONS):
                    final_policy.score_final(self)  # policy/final is the last step's: its score
        with self.phases(phase.CHECKPOINTS):
            self.checkpoints.save()

    def finish(self) -> dict:
        """Exports policy/final, then the videos and the plots (child processes: see `artifacts`); returns the
        summary."""
        layout, state, checkpoints, ending = self.layout, self.state, self.checkpoints, self.ending
        artifacts = state.artifacts
        artifacts.update({"config": layout.config, "train metrics": layout.train_metrics,
                          "eval metrics": layout.eval_metrics})
        newest = checkpoints.newest()
        trained = state.diverged_at_iteration is None or newest is not None
        if checkpoints.rolled_back_to is not None:
            good = checkpoints.rolled_back_to
            self.exporter.save(layout.final_policy, good["run_state"].get("last_return"),
                               keep_solved=ending.solved_elsewhere, iteration=good["iteration"],
                               env_steps=good["env_steps"])
        elif trained and not ending.keeps_solved_policy(self):
            scored = state.final_policy_return is not None
            self.exporter.save(layout.final_policy, state.final_policy_return if scored else state.last_return,
                               episodes=state.final_policy_episodes, keep_solved=ending.solved_elsewhere,
                               **final_policy.held_since(self.config, state))
        for name, path in (("best policy", layout.best_policy), ("final policy", layout.final_policy)):
            if os.path.exists(path):
                artifacts[name] = path
        if newest is not None:
            artifacts["checkpoint"] = newest
        summary_inputs = (self.pipeline.train_step_count(), self.pipeline.env_step_count())
        # The logs are closed (complete, to be plotted) and the envs and servers released in there.
        light = ending.lightly(self)
        if trained and not light:
            with self.phases(phase.EXPORT):  # (it reads the exported policy; for DQN it only asks the agent)
                artifacts.update(self.policy_atoms())
        artifacts.update(self.workers.make(self.final_greedy_policy(), trained and not light,
                                           close_logs=self.stack.close, with_plots=not light))
        if self.config.output.tensorboard:
            artifacts["tensorboard"] = layout.tensorboard
        state.end(self.stop_request.signum)
        summary = state.summary(layout.root, *summary_inputs, self.clock.wall(), checkpoints.last, self.clock.cpu())
        target = local.solve_return(self.config)
        summary["solve_return_target"] = target if target != float("inf") else None  # the average that counts as solved
        summary["solve_checked"] = summary["solve_return_target"] is not None and final_policy.checks_for_solve(self.config)
        summary["policies"] = {name: policy_files.describe_policy(path, name) for name, path in
                               (("final", layout.final_policy), ("best", layout.best_policy))}
        return ending.seal(self, {**summary, **self.phases.as_dict(), **self.workers.peak_rss_mb,
                                  "evaluator_peak_rss_mb": getattr(self.evaluate, "peak_rss_mb", None)})

    def on_solved(self, policy: Any) -> None:
        """A solve taken in beside the training: policy/final is written, and before the next evaluation's weights
        are taken a run that trains on brings back those that passed (`final_policy.AfterSolve`); its video and the
        plots start at once."""
        if self.after_solve is not None:
            self.after_solve(self)
        if not self.ending.lightly(self):
            self.policy_atoms()  # the plotter draws them from policy/final's weights
            self.workers.start_final(policy)

    def policy_atoms(self) -> dict:
        """A distributional agent's atoms at the Q probe's states under the saved policy's weights (`atoms`), for
        the report's figure; a failure there is a warning, never the run's end."""
        try:
            return atoms.write_policy_atoms(self.pipeline.agent, self.config, self.layout)
        except Exception as exc:  # pylint: disable=broad-except
            self.progress.message(f"warning: the atoms' distribution was not written: {exc}")
            return {}

    def final_greedy_policy(self) -> Any:
        """policy/final's greedy policy, for the video: the weights that passed the solve check beside the training
        (the live ones went on training up to the stop), else the live weights."""
        solved = self.evaluation.solved_policy()
        return solved if solved is not None else greedy_policy(self.pipeline.agent)


def train(config: Config, layout: RunLayout, progress: Progress,
          plan: Optional[checkpointing.ResumePlan] = None, host: Optional[Host] = None) -> dict:
    """Trains an agent as `config` says (or continues `plan`), writing everything under `layout.root`, in a process
    of its own (`host` None) or a shared one (`host.shared_process()`), from the single process's parts.

    Returns the run's summary (what summary.json holds).
    """
    return TrainingSession(config, layout, progress, plan, host, local.single_process_parts()).run()
