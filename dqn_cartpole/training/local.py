"""The single-process run's parts (`parts.Parts`): it collects its own data, evaluates in this process (in line or
beside the training), and its own solve check exports policy/final.

* `LocalCollection`: the run's envs, agent, replay and drivers (`build_pipeline`), the random fill with the compiled
  loop prepared beside it, and the train step on the replay's samples;
* `InProcessEvaluation`: the greedy episodes played here (`triggers.Evaluate`), or by a worker beside the training
  (`overlap`); the evaluator role plays its evaluations with the same `make_evaluation`;
* `OwnSolveCheck`: policy/final is this process's to export.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
from typing import Any, Callable, Iterator, Optional

import tensorflow as tf
from tf_agents.metrics import tf_metrics

import dqn_cartpole.env_ids as env_ids
from dqn_cartpole.config import Config
from dqn_cartpole.console import signals
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core import build
from dqn_cartpole.core.episode_returns import EpisodeReturns
from dqn_cartpole.core.evaluation import make_episode_runner
from dqn_cartpole.core.policies import compiled_act_fn, greedy_policy
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.csv_files import CsvLog
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training import checkpoints as run_checkpoints, overlap, phases as phase, prioritized, triggers
from dqn_cartpole.training.loop import Chunk, ChunkedLoop, make_train_step
from dqn_cartpole.training.parts import Parts
from dqn_cartpole.training.phases import Phases
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.state import RunState

PREPARE_SWITCH_INTERVAL_S = 1e-4  # Python's GIL hand-over while the loop is prepared beside the fill (default 5 ms)


def single_process_parts() -> Parts:
    """The parts of a run in one process: `train`, and the Python API's `run_here`."""
    return Parts(LocalCollection(), InProcessEvaluation(), OwnSolveCheck(), signals.StopRequest())


# ---------------------------------------------------------------------------- the data: local collection


def build_pipeline(config: Config, stack: contextlib.ExitStack, announce: Callable[[str], None],
                   replay_checkpoint_dir: Optional[str] = None) -> Pipeline:
    """Builds envs, agent, replay and drivers; `stack` closes everything they open."""
    envs = build.make_envs(config, stack, graph_env=build.uses_graph_env(config))
    agent = build.make_agent(config, envs.tf_env)
    replay = build.make_replay(config, agent, stack, replay_checkpoint_dir, announce)
    env_steps = tf_metrics.EnvironmentSteps()
    # The random fill's driver watches the returns too, so the first collect episode's return is whole.
    collect_returns = EpisodeReturns(config.env.num_envs)
    observers = [replay.add_batch, env_steps, collect_returns]
    initial_driver = build.make_random_driver(envs.tf_env, observers, config.training.initial_collect_steps)
    steps = config.training.collect_steps_per_iteration
    if config.collection.driver == "py":
        collect_driver = build.make_py_collection(envs.collect, agent.collect_policy, replay, env_steps, steps)
    else:  # the compiled loop's TF driver, through the fill's observers: `Replay.add_batch` stays the one write path
        collect_driver = build.make_collect_driver(envs.tf_env, agent.collect_policy, observers, steps)
    return Pipeline(envs, agent, replay, env_steps, initial_driver, collect_driver, compiled_act_fn(agent.policy),
                    make_episode_runner(greedy_policy(agent), envs.evaluate, gamma=config.agent.gamma), stack,
                    collect_returns)


class LocalCollection:
    """The run's own envs and drivers fill its replay (`parts.DataSource`)."""

    def __init__(self):
        self.priorities: Optional[prioritized.IntervalPriorities] = None  # prioritized replay's train-row columns

    def make_pipeline(self, session: Any, found: Optional[checkpointing.Found]) -> Pipeline:
        """What this process is made of; an embedded Reverb server loads its table from `found`'s copy."""
        reverb_dir = None if session.config.replay.backend != "reverb" else \
            checkpointing.stage_reverb(session.layout.checkpoints, found)
        return build_pipeline(session.config, session.stack, session.progress.message, reverb_dir)

    def fill(self, session: Any) -> tuple[Any, Any, Optional[ChunkedLoop]]:
        """Fills the buffer with a random policy, so the first samples have data, while the compiled loop is
        prepared beside it (`preparing`)."""
        with self.preparing(session) as prepared:
            with session.phases(phase.INITIAL_COLLECT):
                pipeline = session.pipeline
                tf_env = pipeline.envs.tf_env
                tf.function(pipeline.initial_driver.run, autograph=False)(tf_env.reset(), ())
                pipeline.collect_returns.take()  # the random policy's episodes are not the collect policy's
                time_step = session.checkpoints.time_step = tf_env.current_time_step()
                policy_state = pipeline.agent.collect_policy.get_initial_state(tf_env.batch_size)
            with session.phases(phase.FIRST_CHUNK):  # what the preparation did not finish beside the fill
                return time_step, policy_state, prepared.result()

    @contextlib.contextmanager
    def preparing(self, session: Any) -> Iterator[concurrent.futures.Future]:
        """Inside: the compiled loop is traced and instantiated, and the policy's SavedModel traced, in a thread
        (`prepare_loop`), beside the random fill. Both are mostly Python under the GIL (~1.2 s of CPU), the fill
        mostly TensorFlow's C++ (its env steps call back into Python): with the switch interval down to 0.1 ms
        while both run, the fill's callbacks get the GIL within ~0.1 ms, and the other core runs what releases it.
        Yields the future loop (`ChunkedLoop`). (A resumed run prepares nothing: its first chunk traces.)"""
        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare") as pool:
            interval = sys.getswitchinterval()
            sys.setswitchinterval(PREPARE_SWITCH_INTERVAL_S)
            try:
                yield pool.submit(self.prepare_loop, session)
            finally:
                sys.setswitchinterval(interval)

    @staticmethod
    def prepare_loop(session: Any) -> ChunkedLoop:
        """The compiled loop, traced and ready (`ChunkedLoop.prepare`), and the exporter's SavedModel graph."""
        loop = session.make_loop()
        tf_env = session.pipeline.envs.tf_env
        loop.prepare(tf_env.time_step_spec(), tf_env.batch_size)
        session.exporter.prepare()
        return loop

    def make_train(self, session: Any) -> Callable:
        """One iteration's gradient step(s) on batches of the agent's windows from the replay's sampler."""
        cfg, agent = session.config, session.pipeline.agent
        if cfg.replay.prioritized:
            self.priorities = prioritized.IntervalPriorities(cfg.training.log_interval)
            return prioritized.train_step_for(cfg, agent, session.pipeline.replay)
        sample = session.pipeline.replay.sampler(cfg.training.batch_size, agent.window_length)
        return make_train_step(agent, sample, cfg.training.train_steps_per_iteration, cfg.training.jit_compile)

    def feeding(self, session: Any, time_step: Any, policy_state: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext((time_step, policy_state))  # the data are this process's own

    def running_chunk(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def after_chunk(self, session: Any, chunk: Chunk) -> None:
        if self.priorities is not None:  # prioritized replay: the train row's priority columns
            session.state.row_extras = self.priorities.row(chunk.first, chunk.extras)


# ---------------------------------------------------------------------------- the evaluation: in this process


def solve_return(config: Config) -> float:
    """The average return that counts as solved: the config's, else the env's threshold, else never."""
    if config.evaluation.solve_return is not None:
        return config.evaluation.solve_return
    threshold = env_ids.reward_threshold(config.env.id)
    return float("inf") if threshold is None else threshold


def make_evaluation(pipeline: Pipeline, config: Config, state: RunState, exporter: triggers.PolicyExport,
                    layout: RunLayout, scalars: Scalars, clock: triggers.Clock, progress: Progress,
                    stack: contextlib.ExitStack, phases: Optional[Phases] = None) -> triggers.Evaluate:
    """The Evaluate trigger (eval_metrics.csv, policy/best) with its solve check (policy/final), on `pipeline`."""
    eval_log = stack.enter_context(contextlib.closing(CsvLog(layout.eval_metrics, EVAL_COLUMNS)))
    solve_check = triggers.SolveCheck(pipeline, config, state, exporter, layout.final_policy, solve_return(config),
                                      clock, progress, phases)
    return triggers.Evaluate(pipeline, config, state, exporter, layout.best_policy, eval_log, scalars, clock,
                             progress, solve_check)


class InProcessEvaluation:
    """The greedy episodes and the solve check, played in line or beside the training (`parts.Evaluation`)."""

    def __init__(self):
        self.evaluate: Any = None

    def make(self, session: Any, scalars: Scalars) -> Callable[[], None]:
        """The periodic evaluation, beside the training (`overlap`) or in line."""
        s = session
        evaluate = make_evaluation(s.pipeline, s.config, s.state, s.exporter, s.layout, scalars, s.clock, s.progress,
                                   s.stack, s.phases)
        restored, seed = s.checkpoints.restored, s.config.training.seed
        first_reset = seed if restored is None else run_checkpoints.resume_seed(seed, restored.iteration)
        beside = overlap.beside(evaluate, s.config, s.pipeline, s.state, s.clock, s.phases,
                                first_reset + build.EVAL_SEED_OFFSET)
        if beside is None:
            self.evaluate = evaluate
            return evaluate
        s.stack.callback(beside.close)
        # A solve taken in: its atoms, video and plots start at once, while this process writes its final checkpoint.
        beside.on_solved = s.on_solved
        self.evaluate = beside
        return beside

    def after_chunk(self, session: Any, chunk: Chunk) -> None:
        pass

    def settle(self) -> None:
        """Takes in an evaluation still running beside the training, if any (`overlap.OverlappedEvaluation`)."""
        settle = getattr(self.evaluate, "settle", None)
        if settle is not None:
            settle()

    def final(self, session: Any) -> None:
        """The final policy always has a measured return (unless its iteration was just evaluated, or it solved:
        policy/final then holds the weights that passed)."""
        if not session.state.stop and session.state.iteration % session.config.evaluation.eval_interval != 0:
            with session.phases(phase.EVALUATIONS):
                self.evaluate()

    def solved_policy(self) -> Optional[Any]:
        """The weights that passed the solve check beside the training (the live ones trained on up to the stop)."""
        return getattr(self.evaluate, "solved_policy", lambda: None)()

    def solved_weights(self) -> Optional[tuple]:
        """The weights that passed the solve check beside the training (an eval interval before they are taken in);
        None in line, where the check ran on the live weights."""
        solved = getattr(self.evaluate, "solved", None)
        return None if solved is None else solved.values


# ---------------------------------------------------------------------------- the finish: this process's check


class OwnSolveCheck:
    """This process's solve check exports policy/final; the finish makes the videos and the plots
    (`parts.FinishPolicy`)."""

    solved_elsewhere = False

    def keeps_solved_policy(self, session: Any) -> bool:
        """policy/final is the policy the solve check confirmed (so it is not exported again): this process stopped
        on the solve (at its iteration, or one eval interval later when the check ran beside the training), or
        resumed a run that had (and had nothing left to do)."""
        state = session.state
        return state.solved_at_iteration is not None and os.path.exists(session.layout.final_policy) and (
            state.stop or not session.trained)

    def lightly(self, session: Any) -> bool:
        return False

    def seal(self, session: Any, summary: dict) -> dict:
        return summary
