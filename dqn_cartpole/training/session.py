"""The training run, as a story: prepare the folder, build, fill replay (or resume), iterate, finish.

Each phase is one method of `TrainingSession`; the work they share lives next door: the
compiled loop (`loop`), the periodic work (`triggers`), checkpoints and resuming (`resume`) and
the run's state (`state`). Everything the run opens is closed by one ExitStack, in reverse.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import os
import sys
from typing import Any, Callable, Iterator, Optional

import tensorflow as tf

from dqn_cartpole.config import Config, dump_yaml, sampling_mode
from dqn_cartpole.console import signals
from dqn_cartpole.console.progress import Progress
from dqn_cartpole import env_ids
from dqn_cartpole.core import build
from dqn_cartpole.core.policies import greedy_policy
from dqn_cartpole.core.q_probe import QProbe
from dqn_cartpole.core.seeding import seed_everything
from dqn_cartpole.replay.base import sequence_length_for
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.csv_files import CsvLog
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS, TRAIN_COLUMNS
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training import atoms, checkpoints as run_checkpoints, overlap, phases as phase, triggers
from dqn_cartpole.training.artifacts import ArtifactWorkers
from dqn_cartpole.training.host import Host, own_process
from dqn_cartpole.training.loop import Chunk, ChunkedLoop, make_iterations, make_train_step, run_ops_on_one_thread
from dqn_cartpole.training.phases import Phases
from dqn_cartpole.training.pipeline import Pipeline, build_pipeline
from dqn_cartpole.training.state import RunState


PREPARE_SWITCH_INTERVAL_S = 1e-4  # Python's GIL hand-over while the loop is prepared beside the fill (default 5 ms)


def freeze_heap() -> None:
    """Takes every object alive now out of the garbage collector's reach (`gc.freeze`).

    TensorFlow, TF-Agents and a traced graph leave ~0.5 million long-lived objects. Python's full
    collections walk all of them, during the run and once more when the interpreter exits, which
    took 2-6 s after the summary was printed. Frozen, they are skipped: the exit takes ~0.2 s.
    They live as long as the process anyway; garbage among them is kept, which costs a few MB. Only a run that owns
    its process does this (`host.Host`): in a process that goes on, it would keep every run's objects for good.
    """
    gc.freeze()


def solve_return(config: Config) -> float:
    """The average return that counts as solved: the config's, else the env's threshold, else never."""
    if config.evaluation.solve_return is not None:
        return config.evaluation.solve_return
    threshold = env_ids.reward_threshold(config.env.id)
    return float("inf") if threshold is None else threshold


class TrainingSession:
    """One training run. `run()` goes through the phases and returns the summary (summary.json's content).

    The learner role (`distributed.learner`) keeps the phases, loop, triggers and checkpoints, and replaces only
    these hooks: make_pipeline, make_evaluation, make_train, iterate, running_chunk, after_chunk, final_evaluation and
    keeps_solved_policy."""

    # Whether a solve check in another process (the evaluator) may export policy/final: then the finish never
    # replaces a solved policy/final with its own (the two may race past `final_evaluation_timeout_s`).
    solved_elsewhere = False

    def __init__(self, config: Config, layout: RunLayout, progress: Progress,
                 plan: Optional[checkpointing.ResumePlan] = None, host: Optional[Host] = None):
        self.config, self.layout, self.progress, self.plan = config, layout, progress, plan
        self.host = host or own_process()
        # The CLI's wall times count from the process's start, as a user sees them; a shared process's from now.
        self.clock = triggers.Clock(self.host.started, self.host.cpu_started)
        self.phases = Phases(started_s_ago=self.clock.wall())  # summary.json's `phases`: where the seconds went
        if self.host.owns_process:
            freeze_heap()  # the imports' objects; the traced graph's follow after the first chunk
        self.state = RunState()
        self.stop_request = signals.StopRequest()
        self.stack = contextlib.ExitStack()
        self.pipeline: Optional[Pipeline] = None
        self.checkpoints: Optional[run_checkpoints.Checkpoints] = None
        self.exporter: Optional[triggers.PolicyExport] = None
        self.evaluate: Optional[triggers.Evaluate] = None
        self.log_train: Optional[triggers.LogTrain] = None
        self.workers: Optional[ArtifactWorkers] = None  # the plotter and the video renderer (child processes)
        self.trained = False  # whether this process ran the loop (a resumed run may have had nothing left to do)
        self.loop: Optional[ChunkedLoop] = None  # prepared beside the random fill (`preparing`), else made at the loop

    def run(self) -> dict:
        with self.stop_request, self.stack:
            try:
                with self.phases(phase.STARTUP):  # starting two children takes a while on a busy machine
                    found = run_checkpoints.prepare_folder(self.layout, self.plan)
                    # The plotter and the renderer start now: their imports overlap the training.
                    self.workers = ArtifactWorkers(self.config, self.layout, self.progress, self.phases)
                time_step, policy_state = self.build(found)
                if found is None or not run_checkpoints.already_done(found, self.config):
                    self.iterate(time_step, policy_state)
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
            pipeline = self.pipeline = self.make_pipeline(found)
            self.checkpoints = run_checkpoints.Checkpoints(layout, pipeline, cfg, self.state, self.clock)
            if found is not None:
                time_step, policy_state = self.checkpoints.restore(found, self.progress.message)
            self.open_logs()
        if found is None:
            with self.preparing() as prepared:
                with self.phases(phase.INITIAL_COLLECT):
                    time_step, policy_state = self.fill_replay()
                with self.phases(phase.FIRST_CHUNK):  # what the preparation did not finish beside the fill
                    self.loop = prepared.result()
        return time_step, policy_state

    def make_pipeline(self, found: Optional[checkpointing.Found]) -> Pipeline:
        """What this process is made of: envs, agent, replay, drivers; an embedded Reverb server loads its table
        from `found`'s copy (or an empty folder)."""
        reverb_dir = None if self.config.replay.backend != "reverb" else \
            checkpointing.stage_reverb(self.layout.checkpoints, found)
        return build_pipeline(self.config, self.stack, self.progress.message, reverb_dir)

    def open_logs(self) -> None:
        cfg, layout, pipeline, state = self.config, self.layout, self.pipeline, self.state
        write_text_atomic(layout.config, dump_yaml(cfg))
        train_log = self.stack.enter_context(contextlib.closing(CsvLog(layout.train_metrics, TRAIN_COLUMNS)))
        scalars = self.stack.enter_context(contextlib.closing(
            Scalars(layout.tensorboard if cfg.output.tensorboard else None)))
        q_probe = QProbe.for_agent(pipeline.agent, cfg.env.id, cfg.training.seed, cfg.env.max_episode_steps)
        self.exporter = triggers.PolicyExport(pipeline, cfg, state, self.phases)
        self.evaluate = self.make_evaluation(scalars)
        self.log_train = triggers.LogTrain(pipeline, cfg, state, train_log, scalars, q_probe, self.clock)

    def make_evaluation(self, scalars: Scalars) -> Callable[[], None]:
        """The periodic evaluation, beside the training (`overlap`) or in line (hook: `distributed.learner` follows
        an evaluator's)."""
        evaluate = make_evaluation(self.pipeline, self.config, self.state, self.exporter, self.layout, scalars,
                                   self.clock, self.progress, self.stack, self.phases)
        restored, seed = self.checkpoints.restored, self.config.training.seed
        first_reset = seed if restored is None else run_checkpoints.resume_seed(seed, restored.iteration)
        beside = overlap.beside(evaluate, self.config, self.pipeline, self.state, self.clock, self.phases,
                                first_reset + build.EVAL_SEED_OFFSET)
        if beside is None:
            return evaluate
        self.stack.callback(beside.close)
        # A solve taken in: its video and the plots start at once, while this process writes its final checkpoint.
        beside.on_solved = self.on_solved
        return beside

    def on_solved(self, policy: Any) -> None:
        """A solve taken in beside the training: policy/final is written, its video and the plots start at once."""
        if not self.finishes_lightly():
            self.policy_atoms()  # the plotter draws them from policy/final's weights
            self.workers.start_final(policy)

    def settle_evaluations(self) -> None:
        """Takes in an evaluation still running beside the training, if any (`overlap.OverlappedEvaluation`)."""
        settle = getattr(self.evaluate, "settle", None)
        if settle is not None:
            settle()

    @contextlib.contextmanager
    def preparing(self) -> Iterator[concurrent.futures.Future]:
        """Inside: the compiled loop is traced and instantiated, and the policy's SavedModel traced, in a thread
        (`prepare_loop`), beside the random fill. Both are mostly Python under the GIL (~1.2 s of CPU), the fill
        mostly TensorFlow's C++ (its env steps call back into Python): with the switch interval down to 0.1 ms
        while both run, the fill's callbacks get the GIL within ~0.1 ms, and the other core runs what releases it.
        Yields the future loop (`ChunkedLoop`), for a fresh run of one process; a learner, whose data come from
        collectors, or a resumed run prepares nothing (its first chunk traces)."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare") as pool:
            if self.pipeline.initial_driver is None:
                done: concurrent.futures.Future = concurrent.futures.Future()
                done.set_result(None)
                yield done
                return
            interval = sys.getswitchinterval()
            sys.setswitchinterval(PREPARE_SWITCH_INTERVAL_S)
            try:
                yield pool.submit(self.prepare_loop)
            finally:
                sys.setswitchinterval(interval)

    def prepare_loop(self) -> ChunkedLoop:
        """The compiled loop, traced and ready (`ChunkedLoop.prepare`), and the exporter's SavedModel graph."""
        loop = self.make_loop()
        tf_env = self.pipeline.envs.tf_env
        loop.prepare(tf_env.time_step_spec(), tf_env.batch_size)
        self.exporter.prepare()
        return loop

    def make_loop(self) -> ChunkedLoop:
        """The compiled loop of `make_train`'s step (and the collect driver), in chunks that end on every trigger's
        interval."""
        cfg = self.config
        intervals = [cfg.training.log_interval, cfg.evaluation.eval_interval, cfg.training.checkpoint_interval]
        return ChunkedLoop(make_iterations(self.make_train(), self.pipeline.collect_driver), intervals)

    def fill_replay(self) -> tuple[Any, Any]:
        """Fills the buffer with a random policy, so the first samples have data (unless other processes collect)."""
        if self.pipeline.initial_driver is None:
            return (), ()
        tf_env = self.pipeline.envs.tf_env
        tf.function(self.pipeline.initial_driver.run, autograph=False)(tf_env.reset(), ())
        self.pipeline.collect_returns.take()  # the random policy's episodes are not the collect policy's
        self.checkpoints.time_step = tf_env.current_time_step()
        return self.checkpoints.time_step, self.pipeline.agent.collect_policy.get_initial_state(tf_env.batch_size)

    def iterate(self, time_step: Any, policy_state: Any) -> None:
        """Runs compiled chunks of iterations, stopping at every due trigger and at a stop request."""
        with self.phases(phase.LOOP):
            self.run_loop(time_step, policy_state)

    def run_loop(self, time_step: Any, policy_state: Any) -> None:
        cfg, state, pipeline, timed = self.config, self.state, self.pipeline, self.phases.timed
        self.trained = True
        total = cfg.training.num_iterations
        periodic = [(cfg.training.log_interval, timed(phase.TRAIN_ROWS, self.log_train)),
                    (cfg.evaluation.eval_interval, timed(phase.EVALUATIONS, self.evaluate)),
                    # last: after the rows it keeps (and the evaluation in flight, taken in first)
                    (cfg.training.checkpoint_interval,
                     timed(phase.CHECKPOINTS, triggers.PeriodicCheckpoint(self.checkpoints.save, state, total,
                                                                          before=self.settle_evaluations)))]
        loop = self.loop or self.make_loop()  # (the same intervals as `periodic`'s)
        if isinstance(pipeline.collect_driver, build.PyCollection):  # it goes on from the Python env's time step
            time_step = pipeline.envs.collect.current_time_step()
        due = [triggers.every(interval, trigger, state.iteration) for interval, trigger in periodic]
        if self.checkpoints.restored is None:
            with self.phases(phase.FIRST_EVALUATION):
                self.evaluate()  # iteration 0: the untrained policy, as in the tutorial
        while state.iteration < total and not state.stop and not self.stop_request.requested:
            first = not loop.traced
            with self.phases(phase.FIRST_CHUNK if first else phase.LOOP), self.running_chunk():
                chunk = loop.run(state.iteration, total, time_step, policy_state)
                if first and self.host.owns_process:
                    freeze_heap()
            state.loop_s, state.loop_iterations = loop.loop_s, loop.loop_iterations
            bad = chunk.first_bad_loss()
            if bad is not None:  # (an evaluation in flight is dropped with its worker)
                self.checkpoints.diverge(*bad, self.progress.message)
                return
            time_step, policy_state = chunk.time_step, chunk.policy_state
            state.iteration += chunk.size
            state.add_losses(chunk.losses)  # the train row logs their mean and max over its interval
            self.checkpoints.time_step = time_step
            self.after_chunk(chunk)
            for trigger in due:
                trigger(state.iteration)
            self.progress.update(state.iteration, state.loss, state.last_return)
        self.settle_evaluations()
        if self.stop_request.requested and state.iteration < total and not state.stop:
            state.stopped_by = signals.signal_name(self.stop_request.signum)
        if not self.stop_request.requested:
            self.final_evaluation()
            self.settle_evaluations()
        with self.phases(phase.CHECKPOINTS):
            self.checkpoints.save()

    def final_evaluation(self) -> None:
        """The final policy always has a measured return (unless its iteration was just evaluated, or it solved:
        policy/final then holds the weights that passed)."""
        if not self.state.stop and self.state.iteration % self.config.evaluation.eval_interval != 0:
            with self.phases(phase.EVALUATIONS):
                self.evaluate()

    def make_train(self) -> Callable:
        """One iteration's gradient step(s) on batches from the replay's sampler (a hook)."""
        cfg = self.config
        sample = self.pipeline.replay.sampler(cfg.training.batch_size, sequence_length_for(cfg.agent.n_step))
        return make_train_step(self.pipeline.agent, sample, cfg.training.train_steps_per_iteration,
                               cfg.training.jit_compile)

    def running_chunk(self) -> contextlib.AbstractContextManager:
        """Wraps each compiled chunk's call (hook: the learner makes it cancellable from another thread)."""
        return contextlib.nullcontext()

    def after_chunk(self, chunk: Chunk) -> None:
        """Runs after each compiled chunk, before the triggers (hook: e.g. the chunk's `extras` into `row_extras`)."""

    def finish(self) -> dict:
        """Exports policy/final, then the videos and the plots (child processes: see `artifacts`); returns the
        summary."""
        layout, state, checkpoints = self.layout, self.state, self.checkpoints
        artifacts = state.artifacts
        artifacts.update({"config": layout.config, "train metrics": layout.train_metrics,
                          "eval metrics": layout.eval_metrics})
        newest = checkpoints.newest()
        trained = state.diverged_at_iteration is None or newest is not None
        if checkpoints.rolled_back_to is not None:
            good = checkpoints.rolled_back_to
            self.exporter.save(layout.final_policy, good["run_state"].get("last_return"),
                               keep_solved=self.solved_elsewhere, iteration=good["iteration"],
                               env_steps=good["env_steps"])
        elif trained and not self.keeps_solved_policy():
            self.exporter.save(layout.final_policy, state.last_return, keep_solved=self.solved_elsewhere)
        for name, path in (("best policy", layout.best_policy), ("final policy", layout.final_policy)):
            if os.path.exists(path):
                artifacts[name] = path
        if newest is not None:
            artifacts["checkpoint"] = newest
        summary_inputs = (self.pipeline.train_step_count(), self.pipeline.env_step_count())
        # The logs are closed (complete, to be plotted) and the envs and servers released in there.
        light = self.finishes_lightly()
        if trained and not light:
            artifacts.update(self.policy_atoms())
        artifacts.update(self.workers.make(self.final_greedy_policy(), trained and not light,
                                           close_logs=self.stack.close, with_plots=not light))
        if self.config.output.tensorboard:
            artifacts["tensorboard"] = layout.tensorboard
        state.end(self.stop_request.signum)
        summary = state.summary(layout.root, *summary_inputs, self.clock.wall(), checkpoints.last, self.clock.cpu())
        return {**summary, **self.phases.as_dict(), **self.workers.peak_rss_mb,
                "evaluator_peak_rss_mb": getattr(self.evaluate, "peak_rss_mb", None)}  # (a child process's)

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
        solved = getattr(self.evaluate, "solved_policy", lambda: None)()
        return solved if solved is not None else greedy_policy(self.pipeline.agent)

    def finishes_lightly(self) -> bool:
        """Only the checkpoint, policy/final and the summary, no videos or plots (hook: a learner stopped by a
        signal, which has `signals.ROLE_GIVE_UP_S` to end)."""
        return False

    def keeps_solved_policy(self) -> bool:
        """policy/final is the policy the solve check confirmed (so it is not exported again): this process stopped
        on the solve (at its iteration, or one eval interval later when the check ran beside the training), or
        resumed a run that had (and had nothing left to do)."""
        state = self.state
        return state.solved_at_iteration is not None and os.path.exists(self.layout.final_policy) and (
            state.stop or not self.trained)


def make_evaluation(pipeline: Pipeline, config: Config, state: RunState, exporter: triggers.PolicyExport,
                    layout: RunLayout, scalars: Scalars, clock: triggers.Clock, progress: Progress,
                    stack: contextlib.ExitStack, phases: Optional[Phases] = None) -> triggers.Evaluate:
    """The Evaluate trigger (eval_metrics.csv, policy/best) with its solve check (policy/final), on `pipeline`."""
    eval_log = stack.enter_context(contextlib.closing(CsvLog(layout.eval_metrics, EVAL_COLUMNS)))
    solve_check = triggers.SolveCheck(pipeline, config, state, exporter, layout.final_policy, solve_return(config),
                                      clock, progress, phases)
    return triggers.Evaluate(pipeline, config, state, exporter, layout.best_policy, eval_log, scalars, clock,
                             progress, solve_check)


def train(config: Config, layout: RunLayout, progress: Progress,
          plan: Optional[checkpointing.ResumePlan] = None, host: Optional[Host] = None) -> dict:
    """Trains an agent as `config` says (or continues `plan`), writing everything under `layout.root`, in a process
    of its own (`host` None) or a shared one (`host.shared_process()`).

    Returns the run's summary (what summary.json holds).
    """
    return TrainingSession(config, layout, progress, plan, host).run()
