"""One seed of a population, as an ordinary run: its run folder, run state, logs, evaluations, solve check, policies
and summary, made by the single run's own triggers (`triggers.LogTrain`, `local.make_evaluation`'s `Evaluate` and
`SolveCheck`, `PolicyExport`, `final_policy`) on the seed's view of the population (`SeedPipeline`).

Every call here comes between two compiled chunks. A train row reads the seed's counts (once for all seeds:
`PopulationPipeline.counts_read_once`) and its Q-value probe (all seeds' at once: `PopulationProbe`); an evaluation's
row, policy/best and solve are those of the copy of the seed's weights it played (`triggers.Snapshot`); the final
policy is exported from the live weights once `PopulationPipeline.select` gave them to the view agent.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Optional

import numpy as np

from dqn_cartpole.config import Config, dump_yaml
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core.population_episodes import SeedOutcome, ensemble_q_values
from dqn_cartpole.core.q_probe import QProbe
from dqn_cartpole.run_folder import policy_files
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.csv_files import CsvLog
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.metrics import TRAIN_COLUMNS
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training import final_policy, local, phases as phase, triggers
from dqn_cartpole.training.phases import Phases
from dqn_cartpole.training.population_pipeline import PopulationPipeline, SeedPipeline
from dqn_cartpole.training.state import RunState


class SeedConsole:
    """A seed's messages on the population's console, each line naming the seed; its evaluations stay off the
    progress line (the population's shows all seeds)."""

    def __init__(self, progress: Progress, seed: int):
        self.progress, self.seed = progress, seed

    def message(self, text: str) -> None:
        self.progress.message(f"seed {self.seed}: {text}")

    def evaluated(self, *args: Any) -> None:
        pass

    def stage(self, text: str) -> None:
        pass

    def artifact_progress(self, done: int, total: int) -> None:
        pass


class PopulationProbe:
    """Every seed's train-row Q-value probe (`QProbe`: mean max-Q on its own fixed random-policy states), for all
    seeds in one batched NumPy pass per weights version, from the population's weights: no view agent is selected
    for a train row."""

    def __init__(self, population: PopulationPipeline, configs: list):
        self.population = population
        self.states = np.stack([QProbe.states_of(cfg.env.id, cfg.training.seed, cfg.env.max_episode_steps)
                                for cfg in configs])  # [K, S, d]
        self.values: Optional[tuple] = None  # (weights version, [K] mean max-Q)

    def __call__(self, index: int) -> float:
        version = self.population.weights_version()
        if self.values is None or self.values[0] != version:
            seeds, states, dims = self.states.shape
            q_values = ensemble_q_values(self.population.seed_layers(range(seeds)), states)
            self.values = (version, q_values(self.states.reshape(-1, dims)).max(axis=-1).mean(axis=-1))
        return float(self.values[1][index])


class DeferredBestExport(triggers.PolicyExport):
    """`PolicyExport`, with policy/best kept in memory as the evaluations find it (its weights and record) and written
    by `flush`: at every population checkpoint and at the member's finish. An export costs ~15 ms, and sixteen seeds
    improve at most of their early evaluations; a single run writes each one at once."""

    def __init__(self, pipeline: Any, config: Config, state: RunState, phases: Phases, best_policy: str):
        super().__init__(pipeline, config, state, phases)
        self.best_policy = best_policy
        self.pending: Optional[tuple] = None  # (average return, the snapshot with its weights)

    def save(self, path: str, average_return: Optional[float], episodes: Optional[int] = None,
             keep_solved: bool = False, snapshot: Optional[triggers.Snapshot] = None, **where: int) -> str:
        deferred = path == self.best_policy and snapshot is not None and snapshot.values is not None
        if not deferred or episodes is not None or keep_solved or where:
            return super().save(path, average_return, episodes, keep_solved, snapshot, **where)
        self.pending = (average_return, snapshot)  # (a copy of the weights: the evaluation's)
        return path

    def flush(self) -> None:
        """Writes the pending policy/best, if any."""
        if self.pending is not None:
            average_return, at = self.pending
            self.pending = None
            super().save(self.best_policy, average_return, snapshot=at)


class SeedRun:
    """Seed `index` of `population`: its run folder `layout`, its config (its own seed), its state."""

    def __init__(self, population: PopulationPipeline, index: int, config: Config, layout: RunLayout,
                 progress: Progress, clock: triggers.Clock, saver: Any, phases: Phases, probe: PopulationProbe):
        self.population, self.index, self.seed = population, index, population.seeds[index]
        self.probe = probe
        self.config, self.layout, self.clock, self.phases = config, layout, clock, phases
        self.progress = SeedConsole(progress, self.seed)
        self.stack = contextlib.ExitStack()  # its logs (closed when it finishes)
        self.pipeline = SeedPipeline(population, index, population.stack)
        self.state = RunState()
        self.exporter = DeferredBestExport(self.pipeline, config, self.state, phases, layout.best_policy)
        self.exporter.saver = saver  # one SavedModel graph for every seed (the view agent's policy)
        self.evaluate: Optional[triggers.Evaluate] = None
        self.due: list = []
        self.finished = False  # its summary is written: it trains no more
        self.held = False  # its weights no longer change (solved, or stopped)

    # -- start
    def open(self, iteration: int) -> None:
        """Writes config.yaml and opens the logs and triggers (a resumed seed's CSVs are already put back)."""
        cfg, layout, state = self.config, self.layout, self.state
        write_text_atomic(layout.config, dump_yaml(cfg))
        train_log = self.stack.enter_context(contextlib.closing(CsvLog(layout.train_metrics, TRAIN_COLUMNS)))
        scalars = self.stack.enter_context(contextlib.closing(
            Scalars(layout.tensorboard if cfg.output.tensorboard else None)))
        self.evaluate = local.make_evaluation(self.pipeline, cfg, state, self.exporter, layout, scalars, self.clock,
                                              self.progress, self.stack, self.phases)
        log_train = triggers.LogTrain(self.pipeline, cfg, state, train_log, scalars, lambda: self.probe(self.index),
                                      self.clock)
        # (its evaluations are the population's, every seed's episodes at once: `take_evaluation`)
        self.due = [triggers.every(cfg.training.log_interval, self.phases.timed(phase.TRAIN_ROWS, log_train), iteration)]
        state.iteration = iteration

    def snapshot(self, weights: list) -> triggers.Snapshot:
        """Where this seed's training stands, and its weights (the values of a single-seed network's variables, in
        their order) out of `weights`, a copy of the population's online variables ([K, ...] arrays, in order), for
        the evaluation that plays them (`PopulationEvaluation.submit`)."""
        return triggers.Snapshot(self.state.iteration, self.pipeline.train_step_count(),
                                 self.pipeline.env_step_count(), self.clock.wall(), None,
                                 tuple(values[self.index] for values in weights))

    def checks_solves(self) -> bool:
        """Whether an evaluation of the weights as they are now, reaching the solve return, starts the solve check."""
        return triggers.checks_solves(self.config, self.state, self.pipeline.train_step_count())

    def take_evaluation(self, outcome: SeedOutcome, at: triggers.Snapshot, seconds: float) -> None:
        """This seed's greedy episodes of the weights `at` copied, played with the others' (`PopulationEvaluation`),
        through its `Evaluate` trigger as a single run's own: the eval row and policy/best of those weights, and,
        when its solve check ran, the solve it confirmed (policy/final is that copy). A run that trains on holds that
        copy's weights from then on (agent.solved_learning_rate 0), as a single run does (`final_policy.AfterSolve`)."""
        state, evaluate = self.state, self.evaluate
        state.eval_s += seconds
        evaluate.record(outcome.result, at, max_q=outcome.max_q_at_reset)
        if outcome.check is not None and evaluate.solve_check.conclude(outcome.check, at) and not state.stop:
            self.population.put_back(self.index, at.values)
            self.progress.message(f"iteration {state.iteration}: the weights that passed the solve check (iteration "
                                  f"{at.iteration}) are held to the last step (agent.solved_learning_rate)")
        if state.solved_at_iteration is not None and not self.held:
            self.hold()  # stopped on its solve, or (agent.solved_learning_rate 0) held from it to the last step

    # -- after each chunk
    def after_chunk(self, iteration: int, losses: np.ndarray) -> None:
        """This seed's part of a chunk that ended at `iteration`: its losses and its train row when one is due (its
        evaluation is the population's: `take_evaluation`)."""
        state = self.state
        state.iteration = iteration
        if not self.held:
            finite = np.isfinite(losses)
            if not finite.all():
                state.diverged_at_iteration = iteration - len(losses) + int(np.argmin(finite)) + 1
                self.progress.message(f"training diverged (loss {losses[np.argmin(finite)]}) at iteration "
                                      f"{state.diverged_at_iteration}; this seed stops, the others go on")
                self.hold()
                state.stop = True
                return
            state.add_losses(losses)
        if iteration % self.config.training.log_interval == 0:  # (chunks end on every multiple: only then is it due)
            for trigger in self.due:
                trigger(iteration)

    def hold(self) -> None:
        """Its weights change no more, and it stops counting train steps (it costs no update)."""
        self.population.agent.hold_seed(self.index)
        self.held = True

    @property
    def active(self) -> bool:
        return not self.finished and not self.state.stop

    # -- the end
    def wants_final_evaluation(self, stopped: bool) -> bool:
        """After the last iteration (not after a stop), the final weights get a measured return, unless their
        iteration was just evaluated."""
        return not stopped and not self.state.stop and self.state.iteration % self.config.evaluation.eval_interval != 0

    def score_final(self, stopped: bool) -> None:
        """With a fixed budget run to its end: policy/final's score over fresh episodes."""
        state = self.state
        if not stopped and not state.stop and not state.failed and \
                state.iteration >= self.config.training.num_iterations:
            self.population.select(self.index)
            final_policy.score_final(self)

    def finish(self, signum: Optional[int], checkpoint: Optional[str]) -> dict:
        """Exports policy/final (unless its solve already did), writes summary.json; returns the summary."""
        layout, state = self.layout, self.state
        self.population.select(self.index)
        solved_and_stopped = state.solved_at_iteration is not None and state.stop
        if state.diverged_at_iteration is None and not solved_and_stopped:
            scored = state.final_policy_return is not None
            self.exporter.save(layout.final_policy, state.final_policy_return if scored else state.last_return,
                               episodes=state.final_policy_episodes, **final_policy.held_since(self.config, state))
        self.exporter.flush()
        self.stack.close()
        with contextlib.suppress(OSError):  # (made by the run folder's preparation: the checkpoints are POP's)
            os.rmdir(layout.checkpoints)
        state.end(signum)
        summary = state.summary(layout.root, self.pipeline.train_step_count(), self.pipeline.env_step_count(),
                                self.clock.wall(), None, self.clock.cpu())
        target = local.solve_return(self.config)
        summary["solve_return_target"] = target if target != float("inf") else None
        summary["solve_checked"] = summary["solve_return_target"] is not None and \
            final_policy.checks_for_solve(self.config)
        summary["policies"] = {name: policy_files.describe_policy(path, name) for name, path in
                               (("final", layout.final_policy), ("best", layout.best_policy))}
        summary["artifacts"].update({"config": layout.config, "train metrics": layout.train_metrics,
                                     "eval metrics": layout.eval_metrics})
        for name, path in (("best policy", layout.best_policy), ("final policy", layout.final_policy)):
            if os.path.exists(path):
                summary["artifacts"][name] = path
        if checkpoint is not None:
            summary["artifacts"]["checkpoint"] = checkpoint
        self.finished = True
        return summary
