"""The periodic evaluation beside the training (`evaluation.overlap: process` or `thread`).

At each evaluation (iteration k, a multiple of `eval_interval`) the trainer copies the greedy
policy's weights (`triggers.Snapshot.take`), hands them to a worker (`core.snapshot_evaluation`:
a child process by default) and trains on. The outcome is taken in at the next evaluation
(iteration k + eval_interval), before a checkpoint, or at the end of the loop, waiting for it if
it is not there yet: the eval row (with the train step, env steps and wall time of the snapshot),
policy/best and, if the solve check confirmed a solve, policy/final, both exported from the
snapshot's weights, and the run's stop. So every decision falls at an iteration fixed by the config,
whatever the timing: a seeded run stops one eval interval after the weights that solved, with the
same rows and the same policy, run after run, and with the same solved iteration and eval rows as a
run that evaluates in line (`evaluation.overlap: inline`), which stops at the weights themselves.
"""

from __future__ import annotations

from typing import Callable, Optional

import dqn_cartpole.env_ids as env_ids
from dqn_cartpole.config import Config
from dqn_cartpole.core import build
from dqn_cartpole.core.policies import NumpyGreedy
from dqn_cartpole.core.snapshot_evaluation import WORKERS, EvaluationSpec, Job
from dqn_cartpole.training import final_policy, phases as phase
from dqn_cartpole.training.phases import Phases, measure
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.state import RunState
from dqn_cartpole.training.triggers import Clock, Evaluate, Snapshot, checks_solves


class OverlappedEvaluation:
    """The Evaluate trigger's work, with the episodes played by a worker while the trainer trains on."""

    def __init__(self, evaluate: Evaluate, worker, greedy: NumpyGreedy, pipeline: Pipeline, state: RunState,
                 clock: Clock, phases: Optional[Phases]):
        self.evaluate, self.worker, self.greedy = evaluate, worker, greedy
        self.pipeline, self.state, self.clock, self.phases = pipeline, state, clock, phases
        self.pending: Optional[Snapshot] = None  # the snapshot being evaluated
        self.solved: Optional[Snapshot] = None  # the snapshot whose solve check passed (policy/final's weights)
        self.on_solved: Callable[[NumpyGreedy], None] = lambda policy: None  # told its greedy policy at once
        self.submitted = 0  # snapshots handed to the worker (a test reads where they were taken)
        self.settled: list[tuple[int, int]] = []  # (snapshot's iteration, iteration it was taken in at)
        self.peak_rss_mb: Optional[float] = None

    def __call__(self) -> None:
        """At an evaluation: takes in the previous one, then (unless it solved) hands over these weights."""
        self.settle()
        if not self.state.stop:
            self.submit()

    def submit(self) -> None:
        snapshot = Snapshot.take(self.pipeline, self.greedy, self.state, self.clock)
        # No check after a confirmed solve, nor before the exploration ends in a run that trains on (`checks_solves`).
        self.worker.submit(Job(snapshot.iteration, snapshot.layers,
                               check=checks_solves(self.evaluate.config, self.state, snapshot.train_step)))
        self.pending = snapshot
        self.submitted += 1

    def settle(self) -> None:
        """Takes in the evaluation in flight, if any (waiting for it): its row, policy/best, a confirmed solve."""
        if self.pending is None:
            return
        with measure(self.phases, phase.EVALUATIONS):
            outcome = self.worker.result()
        snapshot, self.pending = self.pending, None
        self.settled.append((snapshot.iteration, self.state.iteration))
        self.state.eval_s += outcome.seconds
        if self.phases is not None:
            self.phases.add_parallel(f"evaluations ({self.worker.where})", outcome.seconds)
        with measure(self.phases, phase.EVALUATIONS):
            self.evaluate.record(outcome.result, snapshot, max_q=outcome.max_q_at_reset)
        if outcome.check is not None:
            with measure(self.phases, phase.SOLVE_CHECK):
                if self.evaluate.solve_check.conclude(outcome.check, snapshot):
                    self.solved = snapshot
                    self.on_solved(self.solved_policy())

    def solved_policy(self) -> Optional[NumpyGreedy]:
        """The greedy policy of the weights that passed the solve check (policy/final's), if one did."""
        return None if self.solved is None else NumpyGreedy.of_layers(self.solved.layers, self.greedy.minimum_action)

    def close(self) -> None:
        """Ends the worker (an evaluation still in flight is dropped: the run failed or is ending)."""
        self.worker.close()
        self.peak_rss_mb = self.worker.peak_rss_mb


def spec_for(config: Config, greedy: NumpyGreedy, eval_seed: int, solve_return: float) -> EvaluationSpec:
    """What a worker plays: the evaluation as `pipeline.evaluate_greedy` and the solve check as
    `triggers.SolveCheck` play them in line (`eval_seed`: the evaluation copies' first reset)."""
    cfg = config.evaluation
    return EvaluationSpec(
        env_id=config.env.id, max_episode_steps=config.env.max_episode_steps, episodes=cfg.num_eval_episodes,
        seed=eval_seed, gamma=config.agent.gamma, minimum_action=greedy.minimum_action,
        check_above=solve_return if final_policy.checks_for_solve(config) else None, check_episodes=cfg.solve_episodes,
        check_seed=config.training.seed + build.SOLVE_SEED_OFFSET,
        max_return=env_ids.max_return(config.env.id, config.env.max_episode_steps))


def beside(evaluate: Evaluate, config: Config, pipeline: Pipeline, state: RunState, clock: Clock,
           phases: Optional[Phases], eval_seed: int) -> Optional[OverlappedEvaluation]:
    """The overlapped evaluation `config.evaluation.overlap` asks for, or None: evaluate in line (`inline`, or a greedy
    policy NumPy cannot play, which only the TF policy can)."""
    greedy = pipeline.agent.numpy_greedy()
    if config.evaluation.overlap == "inline" or greedy is None:
        return None
    worker = WORKERS[config.evaluation.overlap](spec_for(config, greedy, eval_seed, evaluate.solve_check.solve_return))
    return OverlappedEvaluation(evaluate, worker, greedy, pipeline, state, clock, phases)
