"""A run's checkpoints, all in one place: what goes in (the run state, RNGs, the replay seam: `checkpoint_record`),
when one is written, resuming a stopped run and rolling back a diverged one.

The files' format (writing, verifying, finding the newest good one) is `run_folder.checkpointing`'s job; this
module decides what goes in and puts it back into a built pipeline.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from dqn_cartpole.config import Config, to_dict
from dqn_cartpole.core import build
from dqn_cartpole.run_folder import checkpointing, policy_files
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training import final_policy
from dqn_cartpole.training.finished import already_done
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.state import RunState
from dqn_cartpole.training.triggers import Clock


def resume_seed(seed: int, iteration: int) -> int:
    """The seed a run resumed at `iteration` re-seeds TensorFlow and the envs with."""
    return (seed * 1_000_003 + iteration) % (2**31 - 1)


def metrics_files(layout: RunLayout) -> dict[str, str]:
    """The CSVs a checkpoint keeps a copy of, by file name."""
    return {os.path.basename(p): p for p in (layout.train_metrics, layout.eval_metrics)}


def prepare_folder(layout: RunLayout, plan: Optional[checkpointing.ResumePlan]) -> Optional[checkpointing.Found]:
    """Before anything is built (under the run folder's lock): finishes interrupted policy swaps and sets aside bad
    checkpoints. Returns the checkpoint to resume from, if any; its metrics are put back only once it is restored
    (`Checkpoints.restore`), so a restore that fails leaves the CSVs as they were."""
    os.makedirs(layout.checkpoints, exist_ok=True)
    for path in (layout.best_policy, layout.final_policy):
        policy_files.recover_policy(path, remove_leftovers=True)
    if plan is None:
        return None
    checkpointing.set_aside(list(plan.bad))
    metrics = metrics_files(layout)
    if plan.found is None:  # stopped before its first checkpoint: start again, from the run's config
        for path in metrics.values():
            if os.path.exists(path):
                os.remove(path)
        shutil.rmtree(layout.tensorboard, ignore_errors=True)
        return None
    return plan.found


def adopt_best_on_disk(best_policy: str, state: RunState) -> None:
    """Keeps policy/best if it beats the checkpoint's best (it was saved after the checkpoint)."""
    info = policy_files.read_info(best_policy)
    if not info or info.get("average_return") is None:
        return
    best = state.best_return
    if best is None or info["average_return"] > best or (
            info["average_return"] == best and info.get("iteration", -1) > (state.best_iteration or -1)):
        state.best_return, state.best_iteration = float(info["average_return"]), info.get("iteration")


class Checkpoints:
    """The run's checkpoints: write one per iteration at most, restore one, roll back to the last good one."""

    def __init__(self, layout: RunLayout, pipeline: Pipeline, config: Config, state: RunState, clock: Clock):
        self.layout, self.pipeline, self.config, self.state, self.clock = layout, pipeline, config, state, clock
        self.writer = checkpointing.CheckpointWriter(layout.checkpoints, pipeline.agent, pipeline.env_steps,
                                                     pipeline.replay, config.training.keep_checkpoints)
        self.last: Optional[checkpointing.Saved] = None  # the last one this process wrote
        self.restored: Optional[checkpointing.Found] = None
        self.rolled_back_to: Optional[dict] = None  # after a divergence: the good checkpoint's state.json
        self.time_step: Any = None  # the envs' current time step, kept by the loop for the replay seam

    def save(self) -> None:
        """Writes a checkpoint of this iteration, unless one is already there (or training diverged)."""
        iteration = self.state.iteration
        if self.state.diverged_at_iteration is not None:
            return
        if any(c is not None and c.iteration == iteration for c in (self.last, self.restored)):
            return
        finished = iteration >= self.config.training.num_iterations or self.state.stop
        record = checkpoint_record(self.state, finished, self.pipeline.train_step_count(),
                                   self.pipeline.env_step_count(), self.pipeline.replay, self.time_step,
                                   self.clock.wall(), to_dict(self.config))
        self.last = self.writer.save(iteration, record, metrics_files(self.layout))

    def restore(self, found: checkpointing.Found, announce: Callable[[str], None]) -> tuple[Any, Any]:
        """Loads `found` into the pipeline and the run state; returns a fresh time step and policy state."""
        pipeline, cfg, saved = self.pipeline, self.config, found.state
        self.writer.restore(found)
        self.restored = found
        self.state.resume_from(saved, found.iteration)
        self.state.resumed_from = found.path
        if found.finished and not already_done(found, cfg):
            self.state.stop = False  # more iterations were asked for: train on
        adopt_best_on_disk(self.layout.best_policy, self.state)
        self.clock.continue_from(float(saved["wall_s"]))
        pipeline.agent.set_learning_rate(final_policy.learning_rate(cfg, self.state.solved_at_iteration is not None))
        restore_rng_state(saved["rng"])
        size = pipeline.replay.size()  # before the seam is written
        # Collectors in other processes (no collect driver here) write on while checkpoints are taken.
        if size != saved["replay_size"] and pipeline.collect_driver is not None:
            raise checkpointing.CheckpointError(
                f"{found.path}: the replay buffer holds {size} items after restoring, expected {saved['replay_size']}")
        # TF ops' random streams and the envs' episodes cannot be checkpointed: they restart from a
        # seed derived from (seed, iteration), so resuming from the same checkpoint is repeatable.
        seed = resume_seed(cfg.training.seed, found.iteration)
        tf.random.set_seed(seed)
        for env, offset in ((pipeline.envs.collect, 0), (pipeline.envs.evaluate, build.EVAL_SEED_OFFSET)):
            env.reset()
            env.gym_env.reset(seed=seed + offset)
        time_step = pipeline.envs.tf_env.reset()
        self.time_step = time_step
        stream = saved.get("stream")
        if stream is not None:  # checkpoints written before the seam was kept have none
            pipeline.replay.write_seam(np.asarray(stream["observation"]), stream["held"])
        # Last: rows written after the checkpoint are dropped only once nothing of the restore can fail.
        checkpointing.restore_metrics(found, metrics_files(self.layout))
        announce(f"Resumed from {found.name}: iteration {found.iteration} of {cfg.training.num_iterations}, "
                 f"train step {pipeline.train_step_count()}, {size} transitions in replay.")
        return time_step, pipeline.agent.collect_policy.get_initial_state(pipeline.envs.tf_env.batch_size)

    def roll_back(self) -> Optional[str]:
        """Puts back the agent of the last good checkpoint (after a divergence); returns its folder."""
        good = self.newest()
        if good is not None:
            self.writer.restore_agent(os.path.join(good, checkpointing.TF_PREFIX))
            self.rolled_back_to = checkpointing.read_state(good)
        return good

    def diverge(self, at_iteration: int, value: float, announce: Callable[[str], None]) -> None:
        """The loss is NaN or Inf: stop, and go back to the weights of the last good checkpoint."""
        self.state.diverged_at_iteration = at_iteration
        good = self.roll_back()
        where = (f"The last good checkpoint ({os.path.basename(good)}) is kept and exported as policy/final"
                 if good else "No checkpoint had been written yet, so there is no policy/final")
        announce(f"Training diverged: the loss became {value} at iteration {at_iteration}, so training stopped. "
                 f"{where}; policy/best is the best evaluated policy.")

    def newest(self) -> Optional[str]:
        """The newest checkpoint of this run: written by this process, or the one it resumed from."""
        return self.last.path if self.last is not None else (self.restored.path if self.restored else None)


def rng_state() -> dict:
    """Python's and NumPy's global RNG states, as JSON."""
    numpy_state = np.random.get_state()
    return {"python": list(random.getstate()),
            "numpy": [numpy_state[0], numpy_state[1].tolist(), *[np.asarray(x).item() for x in numpy_state[2:]]]}


def restore_rng_state(saved: dict) -> None:
    python_state = saved["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    name, keys, *rest = saved["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))


def checkpoint_record(state: RunState, finished: bool, train_steps: int, env_steps: int, replay: Any,
                      time_step: Any, wall_s: float, config: dict) -> dict:
    """The loop's part of a checkpoint (state.json): counters, run state, replay seam, RNGs, config."""
    return {
        "finished": bool(finished),
        "train_step": train_steps,
        "env_steps": env_steps,
        "replay_size": replay.size(),
        "replay_inserts": replay.inserts(),
        "run_state": state.resumed_fields(),
        # Where each env's stored stream stands: a resumed run ends it there (Replay.write_seam).
        # A learner (time_step None) has no env stream: its collectors' writers end theirs.
        "stream": None if time_step is None else {"observation": np.asarray(time_step.observation).tolist(),
                                                  "held": replay.held_steps()},
        "wall_s": wall_s,
        "rng": rng_state(),
        "config": config,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
