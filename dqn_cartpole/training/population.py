"""A population: K seeds of one config trained in one process, as one batched graph, each into an ordinary run folder.

The story is the single run's (`session`): build, fill replay (or resume), iterate in compiled chunks, finish. What
differs is that one compiled chunk trains every seed (`population_pipeline`), and after it each seed does its own
periodic work (`population_seed.SeedRun`: logs, evaluations, solve check, policies). The evaluations are played
beside the loop and taken in a fixed number of iterations later (`population_evaluation`, `evaluation_lag`). A seed
that solves is held (its
rows no longer change its weights) and, when its run stops on its solve, finished at once: its summary.json is
written and its plots drawn while the others train on. One checkpoint (POP/checkpoints) holds the whole population;
the members' metrics are kept in it as a single run's are, so a resumed population loses at most one interval.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from dqn_cartpole.config import Config, config_from_dict
from dqn_cartpole.console import signals
from dqn_cartpole.console.exit_status import EXIT_FAILED, EXIT_OK
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core.policies import greedy_policy
from dqn_cartpole.core.seeding import seed_everything
from dqn_cartpole.report import plotter
from dqn_cartpole.report.run_page import write_run_report
from dqn_cartpole.run_folder import checkpointing, read_run
from dqn_cartpole.run_folder import population as population_folder
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training import checkpoints as run_checkpoints, local
from dqn_cartpole.training.artifacts import ArtifactWorkers
from dqn_cartpole.training.host import Host, own_process
from dqn_cartpole.training.loop import ChunkedLoop, run_ops_on_one_thread
from dqn_cartpole.training.outcome import write_run_summary
from dqn_cartpole.training import phases as phase
from dqn_cartpole.training.phases import Phases
from dqn_cartpole.training.population_checkpoints import PopulationCheckpoints
from dqn_cartpole.training.population_evaluation import PopulationEvaluation
from dqn_cartpole.training.population_pipeline import PopulationPipeline, build_population_pipeline
from dqn_cartpole.training.population_seed import PopulationProbe, SeedRun
from dqn_cartpole.training.triggers import Clock, every

EVALUATION_LAG = 50  # iterations between an evaluation handed over and its outcome taken in, at most


def evaluation_lag(eval_interval: int) -> int:
    """The iterations after an evaluation at which its outcome is taken in (waiting for it if it is not in yet): a
    fixed number, so every decision (a solve, a hold) falls at an iteration the config fixes, whatever the timing; the
    largest divisor of `eval_interval` up to `EVALUATION_LAG` (chunks end there). Equal to `eval_interval`: at the
    next evaluation. In line, the outcome is taken in at once."""
    return max(d for d in range(1, min(EVALUATION_LAG, eval_interval) + 1) if eval_interval % d == 0)


def chunk_losses(chunk: Any, seeds: int) -> np.ndarray:
    """A chunk's losses per iteration and seed, [size, K] (the loop splits a vector output into loss and extras)."""
    if chunk.extras is None:
        return chunk.losses[:, np.newaxis]
    return np.column_stack([chunk.losses, chunk.extras])[:, :seeds]


class PopulationRun:
    """The population of `manifest` (a `run_folder.population.Manifest`), from `plan`'s checkpoint or the start."""

    def __init__(self, manifest: population_folder.Manifest, progress: Progress,
                 plan: Optional[checkpointing.ResumePlan] = None, host: Optional[Host] = None):
        self.manifest, self.progress, self.plan = manifest, progress, plan
        self.host = host or own_process()
        self.clock = Clock(self.host.started, self.host.cpu_started)
        source = population_folder.manifest_path(manifest.folder)
        self.config: Config = config_from_dict(manifest.config, source)
        self.member_configs = [config_from_dict(manifest.member_config(i), source) for i in range(len(manifest.seeds))]
        self.stop_request = signals.StopRequest()
        self.stack = contextlib.ExitStack()
        self.pipeline: Optional[PopulationPipeline] = None
        self.evaluation: Optional[PopulationEvaluation] = None
        self.runs: list[SeedRun] = []
        self.checkpoints: Optional[PopulationCheckpoints] = None
        self.loop: Optional[ChunkedLoop] = None
        self.time_step: Any = None  # the envs' current time step (a checkpoint's resume seam)
        self.iteration = 0
        self.plots_written: list[str] = []
        self.plotter: Any = None  # draws the members' plots, as each finishes (a child process)
        self.videos: dict[int, ArtifactWorkers] = {}  # index -> the video seeds' renderer (and plotter)
        self.summaries: dict[int, dict] = {}  # index -> the summary of a member finished by this process
        self.phases = Phases(started_s_ago=self.clock.wall())  # the population's seconds, in every member's summary

    # -- the story
    def run(self) -> int:
        """Trains every unfinished member; returns the population's exit status (0, 1 if a member failed, 128 + the
        signal after a stop)."""
        with self.stop_request, self.stack:
            try:
                with self.phases(phase.BUILD):
                    time_step, policy_state = self.build()
                if any(run.active for run in self.runs):
                    self.run_loop(time_step, policy_state)
                self.finish()
            finally:
                for child in [self.plotter, *self.videos.values()]:
                    if child is not None:
                        child.close()
        return self.exit_status()

    def build(self) -> tuple[Any, Any]:
        cfg, manifest = self.config, self.manifest
        if self.host.owns_process:
            run_ops_on_one_thread()
        seed_everything(manifest.seeds[0])
        pipeline = self.pipeline = build_population_pipeline(cfg, manifest.seeds, self.stack)
        target = local.solve_return(cfg)
        self.evaluation = PopulationEvaluation(pipeline, cfg, self.stack, None if target == float("inf") else target)
        self.make_runs()
        self.checkpoints = PopulationCheckpoints(manifest, pipeline, self.evaluation, self.runs, self.clock,
                                                 cfg.training.keep_checkpoints)
        self.plotter = plotter.start_plotter(on_wrote=self.plots_written.append)
        found = self.prepare_folder()
        if found is not None:
            time_step, policy_state = self.restore(found)
        else:
            time_step, policy_state = self.fill()
        for run in self.runs:
            if not run.finished:
                run.open(self.iteration)
        return time_step, policy_state

    def make_runs(self) -> None:
        """Each member's `SeedRun`, sharing one SavedModel exporter; a member finished before is held."""
        pipeline, manifest = self.pipeline, self.manifest
        saver, probe = None, PopulationProbe(pipeline, self.member_configs)
        for index, run_dir in enumerate(manifest.members):
            os.makedirs(run_dir, exist_ok=True)
            run = SeedRun(pipeline, index, self.member_configs[index], RunLayout(run_dir), self.progress, self.clock,
                          saver, self.phases, probe)
            if saver is None:
                run.exporter.prepare()  # traced once, ahead of the first evaluation's export
                saver = run.exporter.saver
            if population_folder.member_finished(run_dir):
                run.finished = True
                run.hold()
            elif manifest.seeds[index] in manifest.video_seeds and self.member_configs[index].video.enabled:
                self.videos[index] = ArtifactWorkers(self.member_configs[index], run.layout, self.progress, Phases())
            self.runs.append(run)

    def prepare_folder(self) -> Optional[checkpointing.Found]:
        """The checkpoint to resume (the plan's), after interrupted policy swaps are finished in every member."""
        for run in self.runs:
            run_checkpoints.prepare_folder(run.layout, None)
        if self.plan is None:
            return None
        checkpointing.set_aside(list(self.plan.bad))
        return self.plan.found

    def fill(self) -> tuple[Any, Any]:
        """Fills every seed's replay with the random policy's steps."""
        pipeline = self.pipeline
        tf.function(pipeline.initial_driver.run, autograph=False)(pipeline.tf_env.reset(), ())
        pipeline.returns.take_each()  # the random policy's episodes are not the collect policy's
        return pipeline.tf_env.current_time_step(), pipeline.agent.collect_policy.get_initial_state(len(self.runs))

    def run_loop(self, time_step: Any, policy_state: Any) -> None:
        cfg, pipeline = self.config, self.pipeline
        total = cfg.training.num_iterations
        intervals = [cfg.training.log_interval, cfg.evaluation.eval_interval, cfg.training.checkpoint_interval]
        lag = evaluation_lag(cfg.evaluation.eval_interval)
        loop = self.loop = ChunkedLoop(pipeline.make_iterations(cfg), intervals + [lag])
        checkpoint = every(cfg.training.checkpoint_interval, self.periodic_checkpoint, self.iteration)
        evaluate = every(cfg.evaluation.eval_interval, self.evaluate_active, self.iteration)
        if self.checkpoints.restored is None:
            self.evaluate_active()  # iteration 0: the untrained policies, as in the tutorial
            for run in self.runs:
                self.finish_if_stopped(run)
        while self.iteration < total and not self.stop_request.requested and any(run.active for run in self.runs):
            with self.phases(phase.LOOP if loop.traced else phase.FIRST_CHUNK):
                chunk = loop.run(self.iteration, total, time_step, policy_state)
            time_step, policy_state = chunk.time_step, chunk.policy_state
            self.time_step = time_step
            self.iteration += chunk.size
            losses = chunk_losses(chunk, len(self.runs))
            with pipeline.counts_read_once():
                for run in self.runs:
                    if run.active:
                        with self.phases("seeds"):
                            run.after_chunk(self.iteration, losses[:, run.index])
                evaluate(self.iteration)
            if self.iteration % cfg.evaluation.eval_interval == lag:  # (lag < eval_interval)
                self.settle_evaluation()
            for run in self.runs:
                with self.phases("finishing seeds"):
                    self.finish_if_stopped(run)
            with self.phases(phase.CHECKPOINTS):
                checkpoint(self.iteration)
            self.show_progress()
        self.time_step = time_step

    def evaluate_active(self, runs: Optional[list] = None) -> None:
        """The evaluation in flight taken in, then every seed still training (or `runs`) handed over at once: beside
        the training, taken in `evaluation_lag` iterations later (`evaluation.overlap` process or thread), or now
        (inline)."""
        self.settle_evaluation()
        runs = [run for run in self.runs if run.active] if runs is None else runs
        if not runs:
            return
        with self.phases(phase.EVALUATIONS):
            weights = [variable.numpy() for variable in self.pipeline.agent.online_variables()]  # [K, ...] each
            self.evaluation.submit(self.iteration, [run.index for run in runs], [run.checks_solves() for run in runs],
                                   [(run, run.snapshot(weights)) for run in runs])
        if not self.evaluation.beside:
            self.settle_evaluation()

    def settle_evaluation(self) -> None:
        """The evaluation in flight, if any, waiting for it: each seed's result through its own run."""
        with self.phases(phase.EVALUATIONS):
            settled = self.evaluation.settle()
            if settled is None:
                return
            _, kept, outcome = settled
            if self.evaluation.beside:
                self.phases.add_parallel(f"evaluations ({self.evaluation.where})", outcome.seconds * len(kept))
            for (run, snapshot), seed_outcome in zip(kept, outcome.seeds):
                if not run.finished:
                    run.take_evaluation(seed_outcome, snapshot, outcome.seconds)

    def periodic_checkpoint(self) -> None:
        """The evaluation in flight taken in (so the checkpoint holds its rows), the seeds it stopped finished, then
        the checkpoint."""
        self.settle_evaluation()
        for run in self.runs:
            self.finish_if_stopped(run)
        if self.iteration < self.config.training.num_iterations and any(run.active for run in self.runs):
            self.save()

    def show_progress(self) -> None:
        active = [run for run in self.runs if run.active]
        losses = [run.state.loss for run in active if run.state.loss is not None]
        returns = [run.state.last_return for run in active if run.state.last_return is not None]
        self.progress.update(self.iteration, float(np.mean(losses)) if losses else None,
                             float(np.mean(returns)) if returns else None)

    def finish_if_stopped(self, run: SeedRun) -> None:
        """A seed that stopped (on its solve, or diverged) is finished now: the others are not waited for. (One that
        diverged first has its evaluation in flight taken in.)"""
        if run.state.stop and not run.finished:
            self.settle_evaluation()
            self.finish_member(run, None)

    def finish_member(self, run: SeedRun, signum: Optional[int]) -> None:
        """policy/final and summary.json now; its plots (and, for a video seed, its videos) start beside."""
        summary = run.finish(signum, self.checkpoints.newest())
        summary["population"] = {"folder": self.manifest.folder, "seeds": list(self.manifest.seeds),
                                 "index": run.index, "phases": self.phases.as_dict()}
        if self.loop is not None and self.loop.loop_s:  # the population's iterations per second (all its seeds)
            summary["iterations_per_s"] = self.loop.loop_iterations / self.loop.loop_s
        self.summaries[run.index] = summary
        write_run_summary(summary, run.layout.summary)
        workers = self.videos.get(run.index)
        if workers is not None:
            workers.start_final(greedy_policy(self.pipeline.view))  # (run.finish selected this seed)
        else:
            self.plotter.send(run.layout.root)
        line = (f"solved at iteration {run.state.solved_at_iteration}" if run.state.solved_at_iteration is not None
                else f"ended at iteration {run.state.iteration}")
        self.progress.message(f"seed {run.seed}: {line} -> {run.layout.root}")

    # -- checkpoints
    def save(self) -> None:
        """One checkpoint of the whole population, at this iteration."""
        finished = self.iteration >= self.config.training.num_iterations or not any(run.active for run in self.runs)
        self.checkpoints.save(self.iteration, finished, self.time_step)

    def restore(self, found: checkpointing.Found) -> tuple[Any, Any]:
        """Loads `found`: the population and every unfinished member; returns a fresh time step and policy state."""
        self.iteration = found.iteration
        self.time_step = self.checkpoints.restore(found)
        self.progress.message(f"Resumed from {found.name}: iteration {found.iteration} of "
                              f"{self.config.training.num_iterations}, "
                              f"{sum(not run.finished for run in self.runs)} of {len(self.runs)} seeds to go.")
        return self.time_step, self.pipeline.agent.collect_policy.get_initial_state(len(self.runs))

    # -- the end
    def finish(self) -> None:
        """The final evaluations and checkpoint, then every member still open finished; plots, videos, reports."""
        stopped = self.stop_request.requested
        signum = self.stop_request.signum if stopped else None
        self.settle_evaluation()
        open_runs = [run for run in self.runs if not run.finished]
        self.evaluate_active([run for run in open_runs if run.wants_final_evaluation(stopped)])
        self.settle_evaluation()
        for run in open_runs:
            run.score_final(stopped)
        if open_runs and self.time_step is not None:
            self.save()
        for run in open_runs:
            if stopped and run.state.iteration < self.config.training.num_iterations:
                run.state.stopped_by = signals.signal_name(signum)
            self.finish_member(run, signum if stopped else None)
        self.evaluation.close()  # (its process's peak memory, in the summaries rewritten next)
        self.write_artifacts()

    def write_artifacts(self) -> None:
        """Waits for the plots and videos of the members finished here, then rewrites their summaries with them and
        writes their report.html."""
        self.plotter.end_input()
        problem = self.plotter.wait()
        if problem is not None:
            self.progress.message(f"warning: the plots were not drawn: {problem}")
        for index, summary in self.summaries.items():
            run = self.runs[index]
            workers = self.videos.get(index)
            if workers is not None:
                summary["artifacts"].update(workers.make(greedy_policy(self.pipeline.view), True, lambda: None))
            root = os.path.abspath(run.layout.root) + os.sep
            summary["artifacts"].update({os.path.basename(path): path for path in self.plots_written
                                         if os.path.abspath(path).startswith(root)})
            summary["artifacts"]["report"] = run.layout.report
            summary["evaluator_peak_rss_mb"] = self.evaluation.peak_rss_mb
            write_run_summary(summary, run.layout.summary)
            write_run_report(run.layout.root)

    def exit_status(self) -> int:
        statuses = [read_run(run.layout.root).get("exit_status") if os.path.isfile(run.layout.summary) else None
                    for run in self.runs]
        stopped = [s for s in statuses if s not in population_folder.DONE_STATUSES and s is not None]
        if stopped:
            return stopped[0]
        return EXIT_FAILED if any(s != EXIT_OK for s in statuses) else EXIT_OK
