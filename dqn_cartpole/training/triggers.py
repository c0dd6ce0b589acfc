"""The periodic work between compiled chunks, one small class each, as TF-Agents' learner triggers.

Each is a callable the session runs through a TF-Agents `IntervalTrigger` (see `every`): log a
train row, evaluate the greedy policy (and confirm a solve on fresh episodes), write a
checkpoint. `PolicyExport` writes policy/best and policy/final with what they are, from the live
weights or from a `Snapshot` of them (an evaluation that ran beside the training: `overlap`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from tf_agents.train import interval_trigger

from dqn_cartpole.config import Config
from dqn_cartpole.console.progress import Progress
import dqn_cartpole.env_ids as env_ids
from dqn_cartpole.core import build
from dqn_cartpole.core.evaluation import EvalResult, make_episode_runner
from dqn_cartpole.core.policies import greedy_policy
from dqn_cartpole.core.q_probe import MaxQ
from dqn_cartpole.run_folder import export
from dqn_cartpole.run_folder.csv_files import CsvLog
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training import final_policy, phases as phase_names
from dqn_cartpole.training.phases import Phases, measure
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.state import RunState


def every(interval: int, work: Callable[[], None], iteration: int) -> interval_trigger.IntervalTrigger:
    """Runs `work` at every multiple of `interval`; started at the last multiple at or before
    `iteration`, so a resumed run misses no row and repeats none."""
    return interval_trigger.IntervalTrigger(interval, work, start=iteration - iteration % interval)


class Clock:
    """Wall seconds since the run started (for the CLI, the process: as a user counts them), continued across a
    resume, and the CPU seconds this process has spent on the run (from `cpu_start`, a `time.process_time()`)."""

    def __init__(self, start: float, cpu_start: float = 0.0):
        self.start, self.cpu_start = start, cpu_start

    def wall(self) -> float:
        return time.time() - self.start

    def cpu(self) -> float:
        return time.process_time() - self.cpu_start

    def continue_from(self, wall_s: float) -> None:
        """A resumed run counts on from the checkpoint's wall time."""
        self.start = time.time() - wall_s


@dataclass(frozen=True)
class Snapshot:
    """The point of training a policy's weights belong to, and (`take`) a copy of those weights: the arrays a NumPy
    evaluation plays (`layers`) and the value of every variable of the greedy policy (`values`, what an export
    writes). `now` names the live weights (no copy: `values` is None)."""

    iteration: int
    train_step: int
    env_steps: int
    wall_s: float
    layers: Optional[list] = None  # [numpy_episodes.DenseLayer]
    values: Optional[tuple] = None  # agent.policy.variables(), in order

    @classmethod
    def now(cls, pipeline: Pipeline, state: RunState, clock: "Clock") -> "Snapshot":
        return cls(state.iteration, pipeline.train_step_count(), pipeline.env_step_count(), clock.wall())

    @classmethod
    def take(cls, pipeline: Pipeline, greedy: Any, state: RunState, clock: "Clock") -> "Snapshot":
        """Copies the weights as they are now (between two compiled chunks: nothing changes them meanwhile): the
        export's variables, and the arrays of the agent's NumPy greedy policy (`greedy.layers()`)."""
        values = tuple(variable.numpy() for variable in pipeline.agent.policy.variables())
        return cls(state.iteration, pipeline.train_step_count(), pipeline.env_step_count(), clock.wall(),
                   greedy.layers(), values)

    def where(self) -> dict:
        """policy_info.json's record of where these weights come from."""
        return {"train_step": self.train_step, "iteration": self.iteration, "env_steps": self.env_steps}


@contextlib.contextmanager
def swapped_in(variables: list, values: tuple, train_step: Any, step: int) -> Iterator[None]:
    """The `variables` hold `values` (and the train-step counter `step`) inside the block, their own values again
    after it. Between compiled chunks only this thread touches them: an export writes a snapshot's weights
    through the policy's own saver, which reads these variables."""
    live, live_step = [variable.numpy() for variable in variables], train_step.numpy()
    for variable, value in zip(variables, values):
        variable.assign(value)
    train_step.assign(step)
    try:
        yield
    finally:
        for variable, value in zip(variables, live):
            variable.assign(value)
        train_step.assign(live_step)


class PolicyExport:
    """Exports the greedy policy with its step, iteration, env steps and measured return."""

    def __init__(self, pipeline: Pipeline, config: Config, state: RunState, phases: Optional[Phases] = None):
        self.pipeline, self.config, self.state, self.phases = pipeline, config, state, phases
        self.saver: Optional[export.PolicyExporter] = None  # made at the first export

    def save(self, path: str, average_return: Optional[float], episodes: Optional[int] = None,
             keep_solved: bool = False, snapshot: Optional[Snapshot] = None, **where: int) -> str:
        """`snapshot` says where the weights come from and, if it holds a copy of them, exports that copy instead
        of the live weights. `where` overrides the iteration and env steps (after a divergence the weights are the
        last good checkpoint's, not the current iteration's), or marks a solved policy (`solved=True`); with
        `keep_solved`, a solved policy on disk stays (`export.save_policy`)."""
        if snapshot is not None:
            where = {**snapshot.where(), **where}
        with measure(self.phases, phase_names.EXPORT), self.weights_of(snapshot):
            return self._save(path, average_return, episodes, keep_solved, **where)

    def prepare(self) -> None:
        """Builds the saver and writes one throwaway SavedModel, whose graph later exports reuse (the first export's
        ~0.3 s of tracing, done ahead: see `local.LocalCollection.fill`)."""
        import shutil
        import tempfile

        self.saver = export.PolicyExporter(self.pipeline.agent.policy, self.pipeline.agent.train_step_counter)
        folder = tempfile.mkdtemp(prefix="dqn-cartpole-policy-")
        try:
            self.saver.write(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def weights_of(self, snapshot: Optional[Snapshot]) -> contextlib.AbstractContextManager:
        if snapshot is None or snapshot.values is None:
            return contextlib.nullcontext()
        agent = self.pipeline.agent
        return swapped_in(agent.policy.variables(), snapshot.values, agent.train_step_counter, snapshot.train_step)

    def _save(self, path: str, average_return: Optional[float], episodes: Optional[int], keep_solved: bool,
              **where: int) -> str:
        if self.saver is None:
            self.saver = export.PolicyExporter(self.pipeline.agent.policy, self.pipeline.agent.train_step_counter)
        info = {"train_step": self.pipeline.train_step_count(), "iteration": self.state.iteration,
                "env_steps": self.pipeline.env_step_count(), "average_return": average_return,
                "episodes": episodes or self.config.evaluation.num_eval_episodes, "env_id": self.config.env.id}
        info.update(where)
        return export.save_policy(self.saver, path, info, keep_solved)


class LogTrain:
    """A train row: the loss's mean and max over the interval, epsilon, replay counts, speed, the Q-value probe,
    the collect episodes' returns, and the run state's `row_extras`; to the CSV and TensorBoard."""

    def __init__(self, pipeline: Pipeline, config: Config, state: RunState, log: CsvLog, scalars: Scalars,
                 q_probe: Callable[[], float], clock: Clock):
        self.pipeline, self.config, self.state = pipeline, config, state
        self.log, self.scalars, self.q_probe, self.clock = log, scalars, q_probe, clock
        self.previous: Optional[tuple[int, float]] = None  # (train step, wall_s) of this process's last row

    def __call__(self) -> None:
        replay, train_step, wall_s = self.pipeline.replay, self.pipeline.train_step_count(), self.clock.wall()
        samples = replay.samples()
        if samples is None:  # the uniform buffers count nothing: each train step samples one batch
            samples = train_step * self.config.training.batch_size
        inserts = replay.inserts()
        loss, loss_max = self.state.take_interval_loss()
        collect_return, collect_episodes = (None, None) if self.pipeline.collect_returns is None \
            else self.pipeline.collect_returns.take()
        row = {
            "train_step": train_step, "env_steps": self.pipeline.env_step_count(), "loss": loss, "loss_max": loss_max,
            "epsilon": self.pipeline.epsilon(), "replay_size": replay.size(), "replay_inserts": inserts,
            "replay_samples": samples, "samples_per_insert": samples / inserts if inserts else None,
            "wall_s": wall_s, "mean_max_q": self.q_probe(),
            "train_steps_per_s": self.train_steps_per_s(train_step, wall_s),
            "collect_return": collect_return, "collect_episodes": collect_episodes, **self.state.row_extras,
        }
        self.previous = (train_step, wall_s)
        self.log.write(row)
        self.scalars.write("train", train_step, {k: row[k] for k in (
            "loss", "loss_max", "epsilon", "replay_size", "samples_per_insert", "mean_max_q", "train_steps_per_s",
            *self.state.row_extras, "collect_return")})

    def train_steps_per_s(self, train_step: int, wall_s: float) -> Optional[float]:
        """Train steps per wall second since this process's previous row (evaluations included)."""
        if self.previous is None or wall_s <= self.previous[1]:
            return None
        return (train_step - self.previous[0]) / (wall_s - self.previous[1])


def checks_solves(config: Config, state: RunState, train_step: int) -> bool:
    """Whether an evaluation that reaches the solve return starts the solve check now: until the first confirmed
    solve, and in a run that trains on after it (`evaluation.stop_when_solved` false) only once the exploration is
    over (`agent.epsilon_decay_steps`): what its solve changes (`final_policy.AfterSolve`) waits for a policy that
    learnt, not one that balanced by luck in the first few hundred steps."""
    if state.solved_at_iteration is not None or not final_policy.checks_for_solve(config):
        return False
    return config.evaluation.stop_when_solved or train_step >= config.agent.epsilon_decay_steps


class SolveCheck:
    """Confirms a good evaluation on `evaluation.solve_episodes` fresh episodes; on the first success, stops the run
    (with `evaluation.stop_when_solved` false, marks the solve and trains on: `final_policy.AfterSolve`).

    Confirmed means their average is at least the solve return plus `evaluation.solve_margin` standard errors of
    that average. With a margin of 0 (gymnasium's definition), a policy whose true average is just below 475 passes
    a check of 100 episodes about as often as it fails one, and its policy/final then misses 475 on the user's
    own episodes: measured with the default, a policy that averaged 482.3 in its check averaged 467.6-491.2 over
    five other sets of 100 (standard error about 7).
    """

    def __init__(self, pipeline: Pipeline, config: Config, state: RunState, exporter: PolicyExport,
                 final_policy: str, solve_return: float, clock: Clock, progress: Progress,
                 phases: Optional[Phases] = None):
        self.pipeline, self.config, self.state, self.exporter = pipeline, config, state, exporter
        self.final_policy, self.solve_return, self.clock, self.progress = final_policy, solve_return, clock, progress
        self.phases = phases
        self.run_episodes: Optional[Callable[[], EvalResult]] = None  # built once; later checks continue its stream

    def __call__(self) -> None:
        with measure(self.phases, phase_names.SOLVE_CHECK):
            self.check()

    def check(self) -> None:
        """Plays the check's episodes with the live weights, here and now, then `conclude`s."""
        cfg = self.config
        if self.run_episodes is None:
            env = build.make_env_copies(cfg, cfg.evaluation.solve_episodes,
                                        cfg.training.seed + build.SOLVE_SEED_OFFSET + self.state.iteration,
                                        self.pipeline.stack)
            # A check whose average can no longer reach the target stops early (a failed check costs less).
            self.run_episodes = make_episode_runner(
                greedy_policy(self.pipeline.agent), env, give_up_below=self.solve_return,
                max_return=env_ids.max_return(cfg.env.id, cfg.env.max_episode_steps))
        self.conclude(self.run_episodes())

    def conclude(self, result: EvalResult, at: Optional[Snapshot] = None) -> bool:
        """A solve, if the check's episodes (`result`, played by the weights `at` names, else the live ones) average
        at least the solve return plus the margin: the run stops, and policy/final is exported from those
        weights. Returns whether it was one."""
        cfg, state = self.config, self.state
        margin = cfg.evaluation.solve_margin * result.standard_error
        if state.solved_at_iteration is not None or result.average_return < self.solve_return + margin:
            return False
        iteration = state.iteration if at is None else at.iteration
        stops = cfg.evaluation.stop_when_solved
        state.stop = stops
        state.solved_at_iteration, state.solved_return = iteration, result.average_return
        state.solved_env_steps = self.pipeline.env_step_count() if at is None else at.env_steps
        if stops:  # a run that trains on exports policy/final at its last step
            self.exporter.save(self.final_policy, result.average_return, episodes=len(result.returns), solved=True,
                               snapshot=at)
        state.solved_wall_s, state.solved_cpu_s = self.clock.wall(), self.clock.cpu()
        above = f", {cfg.evaluation.solve_margin:g} standard errors ({margin:.1f}) above it" if margin else ""
        if not stops:
            stopping = "training on (evaluation.stop_when_solved is false)"
        elif iteration == state.iteration:
            stopping = "stopping early"
        else:
            stopping = f"policy/final holds that iteration's weights; stopping at iteration {state.iteration}"
        self.progress.message(
            f"Solved at iteration {iteration}: average return {result.average_return:.1f} over "
            f"{len(result.returns)} greedy episodes (target {self.solve_return:g}{above}); {stopping}.")
        return True


class Evaluate:
    """Runs the greedy policy, writes the eval row, keeps policy/best, and asks for a solve check."""

    def __init__(self, pipeline: Pipeline, config: Config, state: RunState, exporter: PolicyExport,
                 best_policy: str, log: CsvLog, scalars: Scalars, clock: Clock, progress: Progress,
                 solve_check: SolveCheck):
        self.pipeline, self.config, self.state, self.exporter = pipeline, config, state, exporter
        self.best_policy, self.log, self.scalars = best_policy, log, scalars
        self.clock, self.progress, self.solve_check = clock, progress, solve_check
        self.max_q = MaxQ.of_agent(pipeline.agent)  # the estimate at the evaluation's own first states

    def __call__(self) -> None:
        started = time.perf_counter()
        result = self.pipeline.evaluate_greedy()
        self.state.eval_s += time.perf_counter() - started
        self.record(result, Snapshot.now(self.pipeline, self.state, self.clock))
        if checks_solves(self.config, self.state, self.pipeline.train_step_count()) and \
                result.average_return >= self.solve_check.solve_return:
            self.solve_check()

    def record(self, result: EvalResult, at: Snapshot, max_q: Optional[float] = None) -> None:
        """The eval row of the weights `at` names (their train step, env steps and wall time), and policy/best from
        those weights if they are the best so far; `max_q`: their estimate at the first states, if known."""
        state = self.state
        state.last_return = result.average_return
        if state.best_return is None or result.average_return >= state.best_return:  # ties go to the later
            state.best_return, state.best_iteration = result.average_return, at.iteration
            self.exporter.save(self.best_policy, result.average_return, snapshot=at)
        spread = result.spread_columns()
        if max_q is not None:
            spread["average_max_q_at_reset"] = max_q
        elif result.first_observations is not None:
            spread["average_max_q_at_reset"] = self.max_q(result.first_observations)
        self.log.write({"train_step": at.train_step, "env_steps": at.env_steps,
                        "average_return": result.average_return, "average_episode_length": result.average_length,
                        "num_episodes": len(result.returns), "wall_s": at.wall_s, **spread})
        self.scalars.write("eval", at.train_step, {"average_return": result.average_return,
                                                   "average_episode_length": result.average_length, **spread})
        self.progress.evaluated(state.iteration, state.loss, result.average_return, at.iteration)


class PeriodicCheckpoint:
    """Writes a checkpoint, except at the end (the last one is written once the final evaluation is in). `before`
    runs first (an evaluation still running beside the training is taken in, so the checkpoint holds its row)."""

    def __init__(self, save: Callable[[], None], state: RunState, total: int,
                 before: Callable[[], None] = lambda: None):
        self.save, self.state, self.total, self.before = save, state, total, before

    def __call__(self) -> None:
        self.before()
        if self.state.iteration < self.total and not self.state.stop:
            self.save()
