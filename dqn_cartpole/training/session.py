"""The training run, as a story: envs -> agent -> replay -> collection -> loop -> artifacts.

Speed comes from amortising TensorFlow's per-call cost: collection (a TF-Agents
`DynamicStepDriver` over the env), sampling and `agent.train` for many iterations run inside a
single compiled call, and the Python loop only wakes up when a trigger (log, eval, checkpoint)
is due. Each iteration inside that call is exactly: collect, then sample, then train.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.drivers import dynamic_step_driver
from tf_agents.environments import tf_py_environment
from tf_agents.metrics import tf_metrics
from tf_agents.policies import random_tf_policy
from tf_agents.train import interval_trigger

from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.core import envs
from dqn_cartpole.run_folder import export
from dqn_cartpole.console import quiet
from dqn_cartpole.console import signals
from dqn_cartpole.core.agents import build_agent
from dqn_cartpole.config import Config, dump_yaml, to_dict
from dqn_cartpole.core.evaluation import EvalResult, make_episode_runner
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS, TRAIN_COLUMNS, CsvLog
from dqn_cartpole.core.policies import compiled_act_fn, random_act_fn
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.replay.base import Replay, ReverbReplay, build_replay, sequence_length_for
from dqn_cartpole.core.seeding import seed_everything
from dqn_cartpole.core.q_probe import QProbe

log = logging.getLogger(__name__)

# Offsets keep the collect, eval, solve-check and video envs on different random streams.
EVAL_SEED_OFFSET, SOLVE_SEED_OFFSET, VIDEO_SEED_OFFSET = 10_000, 20_000, 30_000
# A stop request (Ctrl-C, SIGTERM) waits for the compiled call in flight: keep each one about this short.
STOP_LATENCY_S = 0.25
FIRST_CHUNK = 100  # iterations in the first calls, before their speed is known


@dataclass
class RunState:
    """What the loop knows between compiled calls."""

    iteration: int = 0
    loss: Optional[float] = None
    last_return: Optional[float] = None
    best_return: Optional[float] = None
    best_iteration: Optional[int] = None
    solved_at_iteration: Optional[int] = None
    solved_return: Optional[float] = None
    solved_wall_s: Optional[float] = None
    solved_env_steps: Optional[int] = None
    stop: bool = False
    loop_s: float = 0.0  # inside compiled chunks, excluding the first (which traces)
    loop_iterations: int = 0
    eval_s: float = 0.0


# The RunState fields a checkpoint carries over (the timings are per process).
RESUMED_FIELDS = ("loss", "last_return", "best_return", "best_iteration", "solved_at_iteration", "solved_return",
                  "solved_wall_s", "solved_env_steps")


@dataclass
class TrainResult:
    """What the summary reports."""

    run_dir: str
    iterations: int
    train_steps: int
    env_steps: int
    best_return: Optional[float]
    final_return: Optional[float]
    solved_at_iteration: Optional[int]
    solved_wall_s: Optional[float]
    wall_s: float
    solved_env_steps: Optional[int] = None
    iterations_per_s: Optional[float] = None
    eval_s: float = 0.0
    artifacts: dict[str, str] = field(default_factory=dict)
    stopped_by: Optional[str] = None  # "SIGINT" / "SIGTERM": stopped early, resumable
    exit_status: int = 0  # 130 / 143 after a signal, 1 after a divergence
    diverged_at_iteration: Optional[int] = None
    resumed_from: Optional[str] = None
    checkpoint_bytes: Optional[int] = None  # the last checkpoint this process wrote
    checkpoint_write_s: Optional[float] = None


@dataclass
class Pipeline:
    """Everything built for a run; `close()` releases envs and the Reverb server."""

    collect_env: envs.BatchedGymnasiumEnvironment
    tf_env: tf_py_environment.TFPyEnvironment
    eval_env: envs.BatchedGymnasiumEnvironment
    agent: Any
    replay: Replay
    env_steps: tf_metrics.EnvironmentSteps
    initial_driver: dynamic_step_driver.DynamicStepDriver
    collect_driver: dynamic_step_driver.DynamicStepDriver
    greedy_act: Callable
    closers: list = field(default_factory=list)
    evaluate_greedy: Optional[Callable[[], EvalResult]] = None  # one episode per eval_env copy

    def close(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception:  # pylint: disable=broad-except
                log.debug("close failed", exc_info=True)


# ---------------------------------------------------------------------------- building


def build_pipeline(config: Config, layout: RunLayout, announce: Callable[[str], None],
                   replay_checkpoint_dir: Optional[str] = None) -> Pipeline:
    """Builds envs, agent, replay and drivers; everything it opens is closed by `Pipeline.close`."""
    closers: list = []
    try:
        seed = config.training.seed
        collect_env = envs.make_batched_env(config.env.id, config.env.num_envs, seed=seed,
                                            max_episode_steps=config.env.max_episode_steps)
        closers.append(collect_env.close)
        eval_env = envs.make_batched_env(config.env.id, config.evaluation.num_eval_episodes,
                                         seed=seed + EVAL_SEED_OFFSET, max_episode_steps=config.env.max_episode_steps)
        closers.append(eval_env.close)
        tf_env = tf_py_environment.TFPyEnvironment(collect_env)
        agent = build_agent(config.agent, config.network, tf_env.time_step_spec(), tf_env.action_spec())
        if config.replay.backend == "reverb":  # keep Reverb's C++ log lines off the console
            closers.append(quiet.NativeStderrFilter().start().stop)
        replay = build_replay(config.replay, agent.collect_data_spec, config.env.num_envs, config.agent.n_step,
                              checkpoint_dir=replay_checkpoint_dir)
        closers.append(replay.close)
        if isinstance(replay, ReverbReplay):
            announce(reverb_exposure_line(replay.port))
        env_steps = tf_metrics.EnvironmentSteps()
        observers = [replay.add_batch, env_steps]
        random_policy = random_tf_policy.RandomTFPolicy(tf_env.time_step_spec(), tf_env.action_spec())
        initial_driver = dynamic_step_driver.DynamicStepDriver(
            tf_env, random_policy, observers, num_steps=config.training.initial_collect_steps)
        collect_driver = dynamic_step_driver.DynamicStepDriver(
            tf_env, agent.collect_policy, observers, num_steps=config.training.collect_steps_per_iteration)
        greedy_act = compiled_act_fn(agent.policy)
        return Pipeline(collect_env, tf_env, eval_env, agent, replay, env_steps, initial_driver, collect_driver,
                        greedy_act, closers,
                        evaluate_greedy=make_episode_runner(agent.policy, eval_env, gamma=config.agent.gamma))
    except BaseException:
        Pipeline(*([None] * 9), closers=closers).close()
        raise


def reverb_exposure_line(port: int) -> str:
    """The one line every Reverb run prints: the port, and that it is open to the network."""
    return (f"Reverb replay server on port {port}, listening on ALL network interfaces (*:{port}) with no "
            f"authentication; set replay.backend: tf_uniform to open no port.")


def make_run_iterations(pipeline: Pipeline, config: Config) -> Callable:
    """Compiles `num_iterations` x (collect, sample, train) into one graph call.

    Returns f(time_step, policy_state, num_iterations) -> (time_step, policy_state, losses).
    """
    agent, driver = pipeline.agent, pipeline.collect_driver
    sample = pipeline.replay.sampler(config.training.batch_size, sequence_length_for(config.agent.n_step))
    train_steps = config.training.train_steps_per_iteration

    # XLA fuses the small ops of a DQN step: ~30% less time per gradient step on CPU.
    train_step = tf.function(lambda experience: agent.train(experience).loss,
                             jit_compile=config.training.jit_compile, autograph=False)

    def train_once() -> tf.Tensor:
        return train_step(sample())

    def train_many() -> tf.Tensor:
        if train_steps == 1:
            return train_once()
        _, loss = tf.while_loop(lambda j, _: j < train_steps, lambda j, _: (j + 1, train_once()),
                                (tf.constant(0), tf.constant(0.0)))
        return loss

    # autograph=False: TF-Agents is written for graph mode, and skipping autograph cuts the
    # first trace of agent.train from ~6 s to ~0.3 s.
    @tf.function(autograph=False)
    def run_iterations(time_step, policy_state, num_iterations):
        def body(i, time_step, policy_state, losses):
            time_step, policy_state = driver.run(time_step, policy_state)
            loss = train_many()
            return i + 1, time_step, policy_state, losses.write(i, loss)

        losses = tf.TensorArray(tf.float32, size=num_iterations)
        _, time_step, policy_state, losses = tf.while_loop(
            lambda i, *_: i < num_iterations, body, (tf.constant(0), time_step, policy_state, losses))
        return time_step, policy_state, losses.stack()

    return run_iterations


# ---------------------------------------------------------------------------- the run


def process_start_time() -> float:
    """When this process started (Unix time), so reported times include start-up and imports."""
    import psutil  # a declared dependency

    return psutil.Process().create_time()


class TrainingRun:
    """One training run in phases: fill replay (or restore a checkpoint), iterate with triggers, write artifacts."""

    def __init__(self, config: Config, layout: RunLayout, progress: Progress,
                 resume: Optional[checkpointing.ResumePlan] = None):
        self.config, self.layout, self.progress = config, layout, progress
        self.resume = resume
        self.start = process_start_time()  # wall times count from process start, as a user sees them
        self.state = RunState()
        self.max_return = envs.max_return(config.env.id)
        self.solve_return = solve_return(config)
        self.stop_request = signals.StopRequest()
        self.last_checkpoint: Optional[checkpointing.Saved] = None
        self.restored: Optional[checkpointing.Found] = None
        self.diverged_at: Optional[int] = None
        self.cut_short = False  # a signal stopped training before its end
        self.solve_check: Optional[Callable[[], EvalResult]] = None  # built at the first good evaluation
        self.time_step: Any = None  # the envs' current time step between compiled calls
        self.saver: Optional[export.PolicyExporter] = None  # made at the first export
        self.rolled_back_to: Optional[dict] = None  # after a divergence: the good checkpoint's state.json

    # -- phases
    def run(self) -> TrainResult:
        with self.stop_request:
            try:
                return self._run()
            except checkpointing.DiskFullError:
                raise
            except Exception as exc:  # pylint: disable=broad-except
                if checkpointing.is_disk_full(exc):
                    where = getattr(exc, "filename", None) or self.layout.root
                    raise checkpointing.DiskFullError(
                        f"disk full while writing {where} (no space left on device)") from None
                raise

    def _run(self) -> TrainResult:
        seed_everything(self.config.training.seed)
        found = self.prepare_folder()
        reverb_dir = None
        if self.config.replay.backend == "reverb":
            reverb_dir = checkpointing.stage_reverb(self.layout.checkpoints, found)
        with quiet.NativeStderrFilter() if reverb_dir and found else contextlib.nullcontext():
            pipeline = build_pipeline(self.config, self.layout, self.progress.message, replay_checkpoint_dir=reverb_dir)
        self.pipeline = pipeline
        try:
            self.checkpointer = checkpointing.CheckpointWriter(self.layout.checkpoints, pipeline,
                                                               self.config.training.keep_checkpoints)
            if found is not None:
                time_step, policy_state = self.restore(found)
            self.open_logs()
            if found is None:
                time_step, policy_state = self.fill_replay()
            if found is None or not self.already_done(found):
                self.iterate(time_step, policy_state)
            return self.finish()
        finally:
            self.close_logs()
            pipeline.close()

    def prepare_folder(self) -> Optional[checkpointing.Found]:
        """Before building anything: sets aside bad checkpoints and puts back the metrics of the good one."""
        os.makedirs(self.layout.checkpoints, exist_ok=True)
        for path in (self.layout.best_policy, self.layout.final_policy):
            export.recover_policy(path)
        if self.resume is None:
            return None
        checkpointing.set_aside(list(self.resume.bad))
        found = self.resume.found
        metrics = self.metrics_files()
        if found is None:  # stopped before its first checkpoint: start again, from the run's config
            for path in metrics.values():
                if os.path.exists(path):
                    os.remove(path)
            shutil.rmtree(self.layout.tensorboard, ignore_errors=True)
            return None
        checkpointing.restore_metrics(found, metrics)
        return found

    def metrics_files(self) -> dict[str, str]:
        return {os.path.basename(p): p for p in (self.layout.train_metrics, self.layout.eval_metrics)}

    def open_logs(self) -> None:
        checkpointing.write_text_atomic(self.layout.config, dump_yaml(self.config))
        self.train_log = CsvLog(self.layout.train_metrics, TRAIN_COLUMNS)
        self.eval_log = CsvLog(self.layout.eval_metrics, EVAL_COLUMNS)
        self.scalars = Scalars(self.layout.tensorboard if self.config.output.tensorboard else None)
        self.q_probe = QProbe.for_agent(self.pipeline.agent, self.config.env.id, self.config.training.seed,
                                        self.config.env.max_episode_steps)

    def close_logs(self) -> None:
        for name in ("train_log", "eval_log", "scalars"):
            if hasattr(self, name):
                getattr(self, name).close()

    def fill_replay(self) -> tuple[Any, Any]:
        """Fills the buffer with a random policy, so the first samples have data."""
        pipeline = self.pipeline
        time_step = pipeline.tf_env.reset()
        policy_state = pipeline.agent.collect_policy.get_initial_state(pipeline.tf_env.batch_size)
        tf.function(pipeline.initial_driver.run, autograph=False)(time_step, ())
        time_step = pipeline.tf_env.current_time_step()
        self.time_step = time_step
        return time_step, policy_state

    def iterate(self, time_step: Any, policy_state: Any) -> None:
        """Runs compiled chunks of iterations, stopping at every due trigger and at a stop request."""
        cfg = self.config
        run_iterations = make_run_iterations(self.pipeline, cfg)
        triggers = self.make_triggers()
        intervals = [cfg.training.log_interval, cfg.evaluation.eval_interval, cfg.training.checkpoint_interval]
        if self.restored is None:
            self.evaluate()  # iteration 0: the untrained policy, as in the tutorial
        total = cfg.training.num_iterations
        max_chunk = FIRST_CHUNK
        while self.state.iteration < total and not self.state.stop and not self.stop_request.requested:
            iteration = self.state.iteration
            chunk = min([total - iteration, max_chunk] + [i - iteration % i for i in intervals])
            started = time.perf_counter()
            first_call = not getattr(run_iterations, "traced", False)
            with quiet.NativeStderrFilter() if first_call else contextlib.nullcontext():
                time_step, policy_state, losses = run_iterations(time_step, policy_state, tf.constant(chunk))
            run_iterations.traced = True
            losses = losses.numpy()
            if not first_call:  # the first call includes tracing and XLA compilation
                elapsed = time.perf_counter() - started
                self.state.loop_s += elapsed
                self.state.loop_iterations += chunk
                # Keeps each compiled call short, so a Ctrl-C is answered within about STOP_LATENCY_S.
                max_chunk = max(1, int(chunk * STOP_LATENCY_S / max(elapsed, 1e-6)))
            finite = np.isfinite(losses)
            if not finite.all():
                bad = int(np.argmin(finite))
                self.diverge(iteration + bad + 1, float(losses[bad]))
                return
            self.state.iteration += chunk
            self.state.loss = float(losses[-1])
            self.time_step = time_step
            for trigger in triggers:
                trigger(self.state.iteration)
            self.progress.update(self.state.iteration, self.state.loss, self.state.last_return)
        self.cut_short = self.stop_request.requested and self.state.iteration < total and not self.state.stop
        if not self.stop_request.requested and self.state.iteration % cfg.evaluation.eval_interval != 0:
            self.evaluate()  # the final policy always has a measured return
        self.save_checkpoint()

    def make_triggers(self) -> list:
        cfg, iteration = self.config, self.state.iteration

        def trigger(interval: int, fn: Callable[[], None]) -> interval_trigger.IntervalTrigger:
            # Started at the last multiple of the interval, so a resumed run misses no row.
            return interval_trigger.IntervalTrigger(interval, fn, start=iteration - iteration % interval)

        return [
            trigger(cfg.training.log_interval, self.log_train),
            trigger(cfg.evaluation.eval_interval, self.evaluate),
            trigger(cfg.training.checkpoint_interval, self.periodic_checkpoint),  # last: after the rows it keeps
        ]

    # -- periodic work
    def wall(self) -> float:
        return time.time() - self.start

    def env_steps(self) -> int:
        return int(self.pipeline.env_steps.result().numpy())

    def train_step(self) -> int:
        return int(self.pipeline.agent.train_step_counter.numpy())

    def log_train(self) -> None:
        replay = self.pipeline.replay
        samples = self.train_step() * self.config.training.batch_size
        inserts = replay.inserts()
        row = {
            "train_step": self.train_step(), "env_steps": self.env_steps(), "loss": self.state.loss,
            "epsilon": float(self.pipeline.agent.collect_policy._get_epsilon()),  # pylint: disable=protected-access
            "replay_size": replay.size(), "replay_inserts": inserts, "replay_samples": samples,
            "samples_per_insert": samples / inserts if inserts else None, "wall_s": self.wall(),
            "mean_max_q": self.q_probe(),
        }
        self.train_log.write(row)
        self.scalars.write("train", self.train_step(),
                           {k: row[k] for k in ("loss", "epsilon", "samples_per_insert", "mean_max_q")})

    def evaluate(self) -> None:
        started = time.perf_counter()
        result = self.pipeline.evaluate_greedy()
        self.state.eval_s += time.perf_counter() - started
        self.record_eval(result)
        if self.config.evaluation.stop_when_solved and result.average_return >= self.solve_return:
            self.check_solved()

    def record_eval(self, result: EvalResult) -> None:
        state = self.state
        state.last_return = result.average_return
        if state.best_return is None or result.average_return >= state.best_return:  # ties go to the later
            state.best_return, state.best_iteration = result.average_return, state.iteration
            self.save_policy(self.layout.best_policy, result.average_return)
        row = {"train_step": self.train_step(), "env_steps": self.env_steps(),
               "average_return": result.average_return, "average_episode_length": result.average_length,
               "num_episodes": len(result.returns), "wall_s": self.wall(), **result.spread_columns()}
        self.eval_log.write(row)
        self.scalars.write("eval", self.train_step(),
                           {"average_return": result.average_return, "average_episode_length": result.average_length,
                            **result.spread_columns()})
        self.progress.update(state.iteration, state.loss, state.last_return, force=True)

    def check_solved(self) -> None:
        """Confirms a good evaluation on `solve_episodes` fresh episodes before stopping early."""
        cfg = self.config
        if self.solve_check is None:  # built once; later checks continue its random stream
            solve_env = envs.make_batched_env(cfg.env.id, cfg.evaluation.solve_episodes,
                                              seed=cfg.training.seed + SOLVE_SEED_OFFSET + self.state.iteration,
                                              max_episode_steps=cfg.env.max_episode_steps)
            self.pipeline.closers.append(solve_env.close)
            self.solve_check = make_episode_runner(self.pipeline.agent.policy, solve_env)
        result = self.solve_check()
        if result.average_return >= self.solve_return:
            self.state.stop = True
            self.state.solved_at_iteration = self.state.iteration
            self.state.solved_return = result.average_return
            self.state.solved_env_steps = self.env_steps()
            self.save_policy(self.layout.final_policy, result.average_return, episodes=len(result.returns))
            self.state.solved_wall_s = self.wall()
            self.progress.message(
                f"Solved at iteration {self.state.iteration}: average return {result.average_return:.1f} over "
                f"{len(result.returns)} greedy episodes (target {self.solve_return:g}); stopping early.")

    # -- checkpoints
    def periodic_checkpoint(self) -> None:
        if self.state.iteration < self.config.training.num_iterations and not self.state.stop:
            self.save_checkpoint()  # the last one is written after the loop, once the final evaluation is in

    def save_checkpoint(self) -> None:
        """Writes a checkpoint of this iteration, unless one is already there (or training diverged)."""
        if self.diverged_at is not None:
            return
        if self.last_checkpoint is not None and self.last_checkpoint.iteration == self.state.iteration:
            return
        if self.restored is not None and self.restored.iteration == self.state.iteration:
            return
        finished = self.state.iteration >= self.config.training.num_iterations or self.state.stop
        self.last_checkpoint = self.checkpointer.save(self.state.iteration, self.checkpoint_state(finished),
                                                      self.metrics_files())

    def checkpoint_state(self, finished: bool) -> dict:
        numpy_state = np.random.get_state()
        replay = self.pipeline.replay
        return {
            "finished": bool(finished),
            "train_step": self.train_step(),
            "env_steps": self.env_steps(),
            "replay_size": replay.size(),
            "replay_inserts": replay.inserts(),
            "run_state": {name: getattr(self.state, name) for name in RESUMED_FIELDS},
            # Where each env's stored stream stands: a resumed run ends it there (Replay.write_seam).
            "stream": {"observation": np.asarray(self.time_step.observation).tolist(),
                       "held": replay.held_steps()},
            "wall_s": self.wall(),
            "rng": {"python": list(random.getstate()),
                    "numpy": [numpy_state[0], numpy_state[1].tolist(), *[np.asarray(x).item() for x in numpy_state[2:]]]},
            "config": to_dict(self.config),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def restore(self, found: checkpointing.Found) -> tuple[Any, Any]:
        """Loads a checkpoint into the built pipeline and the loop; returns a fresh time step."""
        pipeline, cfg, saved = self.pipeline, self.config, found.state
        self.checkpointer.restore(found)
        self.restored = found
        for name, value in saved["run_state"].items():
            setattr(self.state, name, value)
        self.state.iteration = found.iteration
        if found.finished and not self.already_done(found):
            self.state.stop = False  # more iterations were asked for: train on
        self.adopt_best_on_disk()
        self.start = process_start_time() - float(saved["wall_s"])
        pipeline.agent._optimizer.learning_rate = cfg.agent.learning_rate  # pylint: disable=protected-access
        python_state = saved["rng"]["python"]
        random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
        name, keys, *rest = saved["rng"]["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
        size = pipeline.replay.size()  # before the seam is written
        if size != saved["replay_size"]:
            raise checkpointing.CheckpointError(
                f"{found.path}: the replay buffer holds {size} items after restoring, expected {saved['replay_size']}")
        # TF ops' random streams and the envs' episodes cannot be checkpointed: they restart from a
        # seed derived from (seed, iteration), so resuming from the same checkpoint is repeatable.
        seed = resume_seed(cfg.training.seed, found.iteration)
        tf.random.set_seed(seed)
        for env, offset in ((pipeline.collect_env, 0), (pipeline.eval_env, EVAL_SEED_OFFSET)):
            env.reset()
            env.gym_env.reset(seed=seed + offset)
        time_step = pipeline.tf_env.reset()
        self.time_step = time_step
        stream = saved.get("stream")
        if stream is not None:  # checkpoints written before the seam was kept have none
            pipeline.replay.write_seam(np.asarray(stream["observation"]), stream["held"])
        policy_state = pipeline.agent.collect_policy.get_initial_state(pipeline.tf_env.batch_size)
        self.progress.message(
            f"Resumed from {found.name}: iteration {found.iteration} of {cfg.training.num_iterations}, "
            f"train step {self.train_step()}, {size} transitions in replay.")
        return time_step, policy_state

    def already_done(self, found: checkpointing.Found) -> bool:
        """A finished run is only re-finished (artifacts rewritten) unless more iterations were asked for."""
        if not found.finished:
            return False
        asked_before = found.state.get("config", {}).get("training", {}).get("num_iterations", 0)
        return self.config.training.num_iterations <= max(asked_before, found.iteration)

    def adopt_best_on_disk(self) -> None:
        """Keeps policy/best if it beats the checkpoint's best (it was saved after the checkpoint)."""
        info = export.read_info(self.layout.best_policy)
        if not info or info.get("average_return") is None:
            return
        best = self.state.best_return
        if best is None or info["average_return"] > best or (
                info["average_return"] == best and info.get("iteration", -1) > (self.state.best_iteration or -1)):
            self.state.best_return, self.state.best_iteration = float(info["average_return"]), info.get("iteration")

    def diverge(self, at_iteration: int, value: float) -> None:
        """The loss is NaN or Inf: stop, and go back to the weights of the last good checkpoint."""
        self.diverged_at = at_iteration
        good = self.last_checkpoint.path if self.last_checkpoint else (self.restored.path if self.restored else None)
        if good is not None:
            self.checkpointer.restore_agent(os.path.join(good, checkpointing.TF_PREFIX))
            self.rolled_back_to = checkpointing.read_state(good)
        where = (f"The last good checkpoint ({os.path.basename(good)}) is kept and exported as policy/final"
                 if good else "No checkpoint had been written yet, so there is no policy/final")
        self.progress.message(
            f"Training diverged: the loss became {value} at iteration {at_iteration}, so training stopped. {where}; "
            f"policy/best is the best evaluated policy.")

    # -- the end
    def save_policy(self, path: str, average_return: Optional[float], episodes: Optional[int] = None,
                    **where: int) -> str:
        """Exports the greedy policy with what it is: its step, its iteration, and its measured return.

        `where` overrides the iteration and env steps (after a divergence, the weights are the
        last good checkpoint's, not the current iteration's).
        """
        if self.saver is None:
            self.saver = export.PolicyExporter(self.pipeline.agent.policy, self.pipeline.agent.train_step_counter)
        info = {"train_step": self.train_step(), "iteration": self.state.iteration, "env_steps": self.env_steps(),
                "average_return": average_return,
                "episodes": episodes or self.config.evaluation.num_eval_episodes, "env_id": self.config.env.id}
        info.update(where)
        return export.save_policy(self.saver, path, info)

    def finish(self) -> TrainResult:
        artifacts = {"config": self.layout.config, "train metrics": self.layout.train_metrics,
                     "eval metrics": self.layout.eval_metrics}
        trained = self.diverged_at is None or self.last_checkpoint is not None or self.restored is not None
        if self.rolled_back_to is not None:
            good = self.rolled_back_to
            self.save_policy(self.layout.final_policy, good["run_state"].get("last_return"),
                             iteration=good["iteration"], env_steps=good["env_steps"])
        elif trained and (self.state.solved_at_iteration != self.state.iteration
                          or not os.path.exists(self.layout.final_policy)):
            self.save_policy(self.layout.final_policy, self.state.last_return)
        if os.path.exists(self.layout.best_policy):
            artifacts["best policy"] = self.layout.best_policy
        if os.path.exists(self.layout.final_policy):
            artifacts["final policy"] = self.layout.final_policy
        last = self.last_checkpoint
        if last is not None or self.restored is not None:
            artifacts["checkpoint"] = last.path if last else self.restored.path
        self.close_logs()
        from dqn_cartpole.report import figures  # matplotlib costs ~1 s to import: not before the policy is saved

        for path in figures.plot_run(self.layout):
            artifacts[path.rsplit("/", 1)[-1]] = path
        if self.config.video.enabled and trained:
            artifacts.update(self.record_videos())
        if self.config.output.tensorboard:
            artifacts["tensorboard"] = self.layout.tensorboard
        signum = self.stop_request.signum
        return TrainResult(
            run_dir=self.layout.root, iterations=self.state.iteration, train_steps=self.train_step(),
            env_steps=self.env_steps(), best_return=self.state.best_return, final_return=self.state.last_return,
            solved_at_iteration=self.state.solved_at_iteration, solved_wall_s=self.state.solved_wall_s,
            solved_env_steps=self.state.solved_env_steps, wall_s=self.wall(), artifacts=artifacts, eval_s=self.state.eval_s,
            iterations_per_s=self.state.loop_iterations / self.state.loop_s if self.state.loop_s else None,
            stopped_by=signals.signal_name(signum) if signum and self.cut_short else None,
            exit_status=signals.exit_status(signum) if signum else (1 if self.diverged_at is not None else 0),
            diverged_at_iteration=self.diverged_at,
            resumed_from=self.restored.path if self.restored else None,
            checkpoint_bytes=last.bytes if last else None,
            checkpoint_write_s=last.seconds if last else None)

    def record_videos(self) -> dict[str, str]:
        cfg, pipeline = self.config, self.pipeline
        seed = cfg.training.seed + VIDEO_SEED_OFFSET
        from dqn_cartpole.report import video  # imageio/ffmpeg: only once training is over

        video.record_video(pipeline.greedy_act, cfg.env.id, self.layout.trained_video, cfg.video.num_episodes,
                           cfg.video.fps, seed, cfg.env.max_episode_steps, label="trained agent")
        random_act = random_act_fn(pipeline.tf_env.time_step_spec(), pipeline.tf_env.action_spec(), seed=seed)
        video.record_video(random_act, cfg.env.id, self.layout.random_video, cfg.video.random_episodes,
                           cfg.video.fps, seed, cfg.env.max_episode_steps, label="random agent")
        return {"trained video": self.layout.trained_video, "random video": self.layout.random_video}


def solve_return(config: Config) -> float:
    """The average return that counts as solved: the config's, else the env's threshold, else never."""
    if config.evaluation.solve_return is not None:
        return config.evaluation.solve_return
    threshold = envs.reward_threshold(config.env.id)
    return float("inf") if threshold is None else threshold


def resume_seed(seed: int, iteration: int) -> int:
    """The seed a run resumed at `iteration` re-seeds TensorFlow and the envs with."""
    return (seed * 1_000_003 + iteration) % (2**31 - 1)


def train(config: Config, layout: RunLayout, progress: Progress,
          resume: Optional[checkpointing.ResumePlan] = None) -> TrainResult:
    """Trains an agent as `config` says (or continues `resume`), writing everything under `layout.root`."""
    return TrainingRun(config, layout, progress, resume).run()
