"""The population's periodic evaluation, every seed at once, beside its training loop.

At an evaluation (iteration k) the seeds still training hand over a copy of their weights (`submit`), which
`core.population_episodes` plays: each seed's `evaluation.num_eval_episodes` greedy episodes side by side with the
others', and a solve check for a seed whose evaluation reaches the solve return.

By default (`evaluation.overlap: process`) they are played in a child process on the other core while the population
trains on, and their outcome is taken in at the next evaluation (k + eval_interval), before a checkpoint, or at the
end (`settle`), as a single run's evaluator's is (`training.overlap`): its eval row names the copy's train step and env
steps, a confirmed solve stops the seed there and policy/final is the copy that passed. `thread` plays them in a
thread of this process instead (it shares the GIL, which the compiled loop needs at every episode's reset), `inline`
at once, the training waiting.

A single run's evaluation env draws every copy's episodes from one generator too (gymnasium's vector CartPole); here
one generator per number of seeds evaluated together, seeded from the first seed, so a seed's evaluation episodes
are not its single run's, though they come from the same distribution. Its solve check's are its single run's.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence

import numpy as np

import dqn_cartpole.env_ids as env_ids
from dqn_cartpole.config import Config
from dqn_cartpole.core import build, population_episodes
from dqn_cartpole.core.population_episodes import CheckSpec, Job, PopulationEvaluator, PopulationSpec
from dqn_cartpole.core.snapshot_evaluation import ProcessWorker, ThreadWorker
from dqn_cartpole.training.population_pipeline import PopulationPipeline

POPULATION_EVAL_SEED_OFFSET = 50_000  # the shared evaluation envs' seeds: neither training nor the checks use them


def population_spec(config: Config, pipeline: PopulationPipeline, seed: int,
                    solve_return: Optional[float]) -> PopulationSpec:
    """What the population's evaluations play (`seed`: the first seed's, or a resumed population's resume seed)."""
    cfg = config.evaluation
    check = None if solve_return is None else CheckSpec(
        cfg.solve_episodes, solve_return, env_ids.max_return(config.env.id, config.env.max_episode_steps),
        build.SOLVE_SEED_OFFSET)
    return PopulationSpec(config.env.id, config.env.max_episode_steps, cfg.num_eval_episodes,
                          seed + POPULATION_EVAL_SEED_OFFSET, config.agent.gamma,
                          int(np.asarray(pipeline.tf_env.action_spec().minimum)), tuple(pipeline.seeds), check)


class PopulationEvaluation:
    """Hands the seeds' weights to the evaluator (a child process, a thread, or played here: `evaluation.overlap`)
    and takes its outcome in (see the module docstring)."""

    def __init__(self, pipeline: PopulationPipeline, config: Config, stack: contextlib.ExitStack,
                 solve_return: Optional[float]):
        self.pipeline, self.config, self.solve_return = pipeline, config, solve_return
        self.overlap = config.evaluation.overlap
        self.worker: Any = None  # a ProcessWorker or ThreadWorker (None: inline)
        self.evaluator: Optional[PopulationEvaluator] = None  # inline
        self.pending: Optional[tuple] = None  # (the job, what the caller keeps with it, its outcome if played here)
        self.peak_rss_mb: Optional[float] = None  # the evaluator process's, once it ended
        self.reseed(pipeline.seeds[0])
        stack.callback(self.close)

    @property
    def beside(self) -> bool:
        return self.worker is not None

    @property
    def where(self) -> str:
        return self.worker.where if self.worker is not None else "in line"

    def reseed(self, seed: int) -> None:
        """The evaluations' episodes from `seed` on (a resumed population's: `checkpoints.resume_seed`), and the
        solve checks' copies made anew at their next check. Nothing may be in flight."""
        assert self.pending is None, "reseeded with an evaluation in flight"
        self.close()
        spec = population_spec(self.config, self.pipeline, seed, self.solve_return)
        if self.overlap == "process":
            self.worker = ProcessWorker(spec, population_episodes.__name__)
        elif self.overlap == "thread":
            self.worker = ThreadWorker(PopulationEvaluator(spec))
        else:
            self.evaluator = PopulationEvaluator(spec)

    def submit(self, iteration: int, indices: Sequence[int], check: Sequence[bool], keep: object) -> None:
        """Seeds `indices`' weights as they are now (between two compiled chunks), to be evaluated; `keep` comes
        back with the outcome (`settle`)."""
        assert self.pending is None, "an evaluation is still in flight"
        job = Job(iteration, tuple(indices), self.pipeline.seed_layers(indices), tuple(check))
        if self.worker is not None:
            self.worker.submit(job)
            self.pending = (job, keep, None)
        else:
            self.pending = (job, keep, self.evaluator(job))

    def settle(self) -> Optional[tuple]:
        """The evaluation in flight, waiting for it: (its job, `keep`, its outcome), or None."""
        if self.pending is None:
            return None
        job, keep, outcome = self.pending
        self.pending = None
        return job, keep, (outcome if outcome is not None else self.worker.result())

    def close(self) -> None:
        """Ends the worker (an evaluation in flight is dropped) and closes the envs."""
        self.pending = None
        if self.worker is not None:
            self.worker.close()
            self.peak_rss_mb = self.worker.peak_rss_mb or self.peak_rss_mb
            self.worker = None
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None
