"""A population's checkpoints (POP/checkpoints): one of the whole population, in the single run's format
(`run_folder.checkpointing`: written under a temporary name, verified by its manifest, the newest good one found): the
batched agent (every seed's weights, target network, Adam moments, train-step counts, which seeds are held), every
seed's env-step count and replay, every member's run state and, for the members still training, their metrics CSVs,
which a resume puts back as they were (rows written after the checkpoint are dropped). Members that finished before
are left as they are."""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from dqn_cartpole.run_folder import checkpointing, population as population_folder
from dqn_cartpole.training import checkpoints as run_checkpoints
from dqn_cartpole.training.population_evaluation import PopulationEvaluation
from dqn_cartpole.training.population_pipeline import PopulationPipeline
from dqn_cartpole.training.triggers import Clock


class PopulationCheckpoints:
    """Writes and restores the population's checkpoints (see the module docstring)."""

    def __init__(self, manifest: population_folder.Manifest, pipeline: PopulationPipeline,
                 evaluation: PopulationEvaluation, runs: list, clock: Clock, keep: int):
        self.manifest, self.pipeline, self.evaluation, self.runs, self.clock = manifest, pipeline, evaluation, runs, clock
        self.writer = checkpointing.CheckpointWriter(population_folder.checkpoints_dir(manifest.folder),
                                                     pipeline.agent, pipeline.env_steps, pipeline.replay, keep)
        self.last: Optional[checkpointing.Saved] = None  # the last one this process wrote
        self.restored: Optional[checkpointing.Found] = None

    def newest(self) -> Optional[str]:
        return self.last.path if self.last is not None else (self.restored.path if self.restored else None)

    def save(self, iteration: int, finished: bool, time_step: Any) -> None:
        """Checkpoint `iteration` (`time_step`: where each env's stored stream stands, for the resume seam)."""
        pipeline = self.pipeline
        for run in self.runs:
            if not run.finished:
                run.exporter.flush()  # policy/best on disk is the checkpoint's best (a resume adopts a later one)
        seeds = {str(run.seed): {"run_state": run.state.resumed_fields(), "held": run.held, "stop": run.state.stop,
                                 "finished": run.finished, "train_steps": run.pipeline.train_step_count(),
                                 "env_steps": run.pipeline.env_step_count()} for run in self.runs}
        record = {"finished": finished, "train_step": int(pipeline.agent.train_step_counter.numpy()),
                  "env_steps": int(pipeline.env_steps.result().numpy()),  # all seeds' (each one's: `seeds`)
                  "replay_size": pipeline.replay.size(), "replay_inserts": pipeline.replay.inserts(),
                  "seeds": seeds,
                  "stream": {"observation": np.asarray(time_step.observation).tolist(),
                             "held": pipeline.replay.held_steps()},
                  "wall_s": self.clock.wall(), "rng": run_checkpoints.rng_state(), "config": self.manifest.config,
                  "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        self.last = self.writer.save(iteration, record, self.metrics_files())

    def metrics_files(self) -> dict[str, str]:
        """The unfinished members' CSVs, by a name unique in the checkpoint."""
        return {f"m{run.index}__{name}": path for run in self.runs if not run.finished
                for name, path in run_checkpoints.metrics_files(run.layout).items()}

    def restore(self, found: checkpointing.Found) -> Any:
        """Loads `found` into the pipeline and every unfinished member; returns the envs' fresh time step."""
        pipeline, saved = self.pipeline, found.state
        self.writer.restore(found)
        self.restored = found
        self.clock.continue_from(float(saved["wall_s"]))
        for run in self.runs:
            if run.finished:
                run.hold()
                continue
            seed_saved = saved["seeds"][str(run.seed)]
            run.state.resume_from(seed_saved, found.iteration)
            run.state.resumed_from = found.path
            run.state.stop = bool(seed_saved.get("stop"))
            run.held = bool(seed_saved.get("held"))
            run_checkpoints.adopt_best_on_disk(run.layout.best_policy, run.state)
        run_checkpoints.restore_rng_state(saved["rng"])
        self.reseed(found.iteration)
        time_step = pipeline.tf_env.reset()
        pipeline.replay.write_seam(np.asarray(saved["stream"]["observation"]), saved["stream"]["held"])
        checkpointing.restore_metrics(found, self.metrics_files())  # last: once nothing of the restore can fail
        return time_step

    def reseed(self, iteration: int) -> None:
        """TF ops' streams and the envs' episodes restart from seeds derived from (seed, iteration), as a single
        run's do (`checkpoints.resume_seed`): the seeds' own envs and the shared evaluation envs."""
        seeds = [run_checkpoints.resume_seed(seed, iteration) for seed in self.manifest.seeds]
        tf.random.set_seed(seeds[0])
        collect = self.pipeline.collect
        collect.reset()
        collect.gym_env.reset(seed=seeds)
        self.evaluation.reseed(seeds[0])
