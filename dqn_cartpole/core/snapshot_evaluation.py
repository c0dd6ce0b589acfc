"""Evaluations of weight snapshots beside the training, without TensorFlow.

The trainer takes a snapshot of the greedy policy's weights at each evaluation (arrays:
`numpy_episodes.DenseLayer`s) and hands it to a worker as a `Job`; `SnapshotEvaluator` plays the
evaluation's greedy episodes and, when their average reaches the solve return, the solve check's,
and the worker sends an `Outcome` back. The trainer trains on meanwhile and takes the outcome at a
later, fixed iteration (`training.overlap`). The episodes are the ones the trainer's own NumPy
evaluation would play (the same loop over the same seeded copies: `numpy_episodes`, `vector_env`).

Two workers, one interface (`submit`, `result`, `close`):
- `ProcessWorker`: a child process (`processes.child`), which imports NumPy and gymnasium only (~0.3 s) and is
  sent the spec, then the jobs. It runs on the other core
  without sharing the trainer's GIL: the trainer's compiled chunk needs the GIL at every env step
  (the collect env is Python), and the episodes here are Python too.
- `ThreadWorker`: the same evaluator in a thread of the trainer (it shares the GIL; see docs/benchmarks.md
  for the two measured side by side).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dqn_cartpole.core.numpy_episodes import EvalResult, greedy_act, mean_max_q, run_episodes
from dqn_cartpole.core.vector_env import VectorSteps, make_vector_steps
from dqn_cartpole.processes.child import WorkerChild, ChildFailed, serve

CLOSE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EvaluationSpec:
    """What every evaluation of a run plays (sent to a worker once)."""

    env_id: str
    max_episode_steps: Optional[int]
    episodes: int  # evaluation episodes, side by side
    seed: int  # the evaluation copies' first reset; later evaluations continue their stream
    gamma: float  # for the discounted returns
    minimum_action: int
    check_above: Optional[float]  # an evaluation averaging at least this is followed by the solve check (None: never)
    check_episodes: int
    check_seed: int  # the check's copies are seeded with this plus the iteration of the first check
    max_return: Optional[float]  # the most an episode can return: a check that can no longer pass stops early


@dataclass(frozen=True)
class Job:
    """One snapshot to evaluate: the iteration it was taken at, and its weights."""

    iteration: int
    layers: list  # [numpy_episodes.DenseLayer]
    check: bool = True  # whether an evaluation reaching `check_above` is followed by the solve check


@dataclass(frozen=True)
class Outcome:
    """A job's evaluation, and its solve check's episodes if the evaluation reached `check_above`."""

    iteration: int
    result: EvalResult
    max_q_at_reset: float  # mean max_a Q(s0, a) over the evaluation's first states, under the snapshot's weights
    check: Optional[EvalResult]
    seconds: float  # the worker's wall seconds for the evaluation and the check


class SnapshotEvaluator:
    """Plays each job's episodes in the spec's seeded copies (the check's are made at the first check)."""

    def __init__(self, spec: EvaluationSpec):
        self.spec = spec
        self.env = make_vector_steps(spec.env_id, spec.episodes, spec.seed, spec.max_episode_steps)
        self.check_env: Optional[VectorSteps] = None

    def __call__(self, job: Job) -> Outcome:
        started, spec = time.perf_counter(), self.spec
        act = greedy_act(job.layers, spec.minimum_action)
        result = run_episodes(act, self.env, spec.gamma)
        check = None
        if job.check and spec.check_above is not None and result.average_return >= spec.check_above:
            if self.check_env is None:
                self.check_env = make_vector_steps(spec.env_id, spec.check_episodes, spec.check_seed + job.iteration,
                                                   spec.max_episode_steps)
            check = run_episodes(act, self.check_env, give_up_below=spec.check_above, max_return=spec.max_return)
        return Outcome(job.iteration, result, mean_max_q(job.layers, result.first_observations), check,
                       time.perf_counter() - started)

    def close(self) -> None:
        for env in (self.env, self.check_env):
            if env is not None:
                env.close()


class EvaluatorFailed(RuntimeError):
    """The worker could not evaluate (its process died or raised): one line saying why."""


class ProcessWorker:
    """The evaluator in a child process (see the module docstring): `submit` never waits, even while the child is
    still importing or the job is larger than the pipe holds."""

    where = "another process"

    def __init__(self, spec: Any, module: str = __name__):
        """`spec`: what `module`'s `serve_child` builds its evaluator from (here an `EvaluationSpec`; a population's
        evaluator is `core.population_episodes`')."""
        self.child = WorkerChild(module, what="the evaluator process")
        self.child.send(spec)

    @property
    def peak_rss_mb(self) -> Optional[float]:
        return self.child.peak_rss_mb

    def submit(self, job: Job) -> None:
        self.child.send(job)

    def result(self) -> Outcome:
        """The next job's outcome, waiting for it."""
        try:
            return self.child.receive()
        except ChildFailed as failed:
            raise EvaluatorFailed(str(failed)) from None

    def close(self) -> None:
        """Ends the child (the end of its input; an evaluation in flight is dropped)."""
        self.child.close(CLOSE_TIMEOUT_S)


class ThreadWorker:
    """An evaluator (a callable from a job to its outcome, with `close`: a `SnapshotEvaluator`, or a population's)
    in a thread of this process (it shares this process's GIL)."""

    where = "a thread"
    peak_rss_mb = None

    def __init__(self, evaluator: Any):
        self.evaluator = evaluator
        self.jobs: queue.Queue = queue.Queue()
        self.outcomes: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._work, daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                self.outcomes.put(self.evaluator(job))
            except Exception as exc:  # pylint: disable=broad-except  # raised again where the result is taken
                self.outcomes.put(exc)

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    def result(self) -> Outcome:
        outcome = self.outcomes.get()
        if isinstance(outcome, Exception):
            raise EvaluatorFailed(f"{type(outcome).__name__}: {outcome}")
        return outcome

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(CLOSE_TIMEOUT_S)
        self.evaluator.close()


WORKERS = {"process": ProcessWorker, "thread": lambda spec: ThreadWorker(SnapshotEvaluator(spec))}


def serve_evaluator(make: Callable[[Any], Any], failure: str) -> int:
    """An evaluator's process: its first message is the spec, `make(spec)` the evaluator (a callable from a job to
    its outcome, with `close`); then an outcome for each job. `failure` begins its one line if it fails."""
    evaluator: Any = None

    def answer(message, reply) -> None:
        nonlocal evaluator
        if evaluator is None:
            evaluator = make(message)
        else:
            reply(evaluator(message))

    try:
        return serve(answer, failure=failure)
    finally:
        if evaluator is not None:
            evaluator.close()


def serve_child() -> int:
    """The evaluator's process: the spec, then an outcome for each job."""
    return serve_evaluator(SnapshotEvaluator, "the evaluator failed: ")
