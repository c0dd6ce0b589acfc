"""The run's state: one record the loop updates, that a checkpoint carries and summary.json reports."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from dqn_cartpole.console import exit_status
from dqn_cartpole.console.exit_status import EXIT_FAILED, EXIT_OK

# The fields a checkpoint carries over to a resumed run; the rest are per process or per outcome.
RESUMED_FIELDS = ("loss", "last_return", "best_return", "best_iteration", "solved_at_iteration", "solved_return",
                  "solved_wall_s", "solved_env_steps", "solved_cpu_s", "unchecked_since")


@dataclass
class RunState:
    """What the run knows between compiled calls, and how it ended."""

    iteration: int = 0
    loss: Optional[float] = None
    last_return: Optional[float] = None
    best_return: Optional[float] = None
    best_iteration: Optional[int] = None
    solved_at_iteration: Optional[int] = None
    solved_return: Optional[float] = None
    solved_wall_s: Optional[float] = None
    solved_env_steps: Optional[int] = None
    solved_cpu_s: Optional[float] = None  # CPU seconds of the process that confirmed the solve, until then
    stop: bool = False  # solved: stop early
    # past its solve, the run went on from its live weights from this iteration on, not from those the solve check
    # passed (a learner that no longer kept them: `following.FollowEvaluator`)
    unchecked_since: Optional[int] = None
    final_policy_return: Optional[float] = None  # policy/final's average over evaluation.final_episodes (unsolved end)
    final_policy_episodes: Optional[int] = None
    # per process
    loop_s: float = 0.0  # inside compiled chunks, excluding the first (which traces)
    loop_iterations: int = 0
    eval_s: float = 0.0
    row_extras: dict = field(default_factory=dict)  # train-row columns a way of running adds (a learner's policy lag)
    interval_losses: list = field(default_factory=list)  # each iteration's loss since the last train row
    # how it ended
    diverged_at_iteration: Optional[int] = None
    stopped_by: Optional[str] = None  # "SIGINT" / "SIGTERM": stopped early, resumable
    exit_status: int = 0  # 130 / 143 after a signal, 1 after a divergence or a failure
    failed: bool = False  # stopped by an error, after a checkpoint (exit status 1 even after a signal)
    resumed_from: Optional[str] = None
    artifacts: dict = field(default_factory=dict)

    def end(self, signum: Optional[int]) -> None:
        """Sets the exit status: 1 after a failure, else 128 + the signal after a stop, else 1 after a divergence."""
        if self.failed:
            self.exit_status = EXIT_FAILED
        elif signum:
            self.exit_status = exit_status.for_signal(signum)
        else:
            self.exit_status = EXIT_OK if self.diverged_at_iteration is None else EXIT_FAILED

    def add_losses(self, losses: np.ndarray) -> None:
        """Keeps a chunk's per-iteration losses for the next train row, and the last one as `loss`."""
        self.interval_losses.append(np.asarray(losses, dtype=np.float64))
        self.loss = float(losses[-1])

    def take_interval_loss(self) -> tuple[Optional[float], Optional[float]]:
        """(mean, max) of the losses since the previous call, which starts the next interval; (loss, loss) when
        no iteration ran in between."""
        if not self.interval_losses:
            return self.loss, self.loss
        losses = np.concatenate(self.interval_losses)
        self.interval_losses = []
        return float(np.mean(losses)), float(np.max(losses))

    def resumed_fields(self) -> dict:
        return {name: getattr(self, name) for name in RESUMED_FIELDS}

    def resume_from(self, saved: dict, iteration: int) -> None:
        """Takes over a checkpoint's fields (unknown ones, from older checkpoints, are ignored)."""
        for name, value in saved.get("run_state", {}).items():
            if name in RESUMED_FIELDS:
                setattr(self, name, value)
        self.iteration = iteration

    def summary(self, run_dir: str, train_steps: int, env_steps: int, wall_s: float,
                last_checkpoint: Any = None, cpu_s: Optional[float] = None) -> dict:
        """What summary.json holds (without its version stamp, which `write_summary` adds); `cpu_s`: the run's CPU
        seconds (None: the whole process's)."""
        return {
            "run_dir": run_dir, "iterations": self.iteration, "train_steps": train_steps, "env_steps": env_steps,
            "best_return": self.best_return, "final_return": self.last_return,
            "final_policy_return": self.final_policy_return, "final_policy_episodes": self.final_policy_episodes,
            "solved_at_iteration": self.solved_at_iteration, "solved_wall_s": self.solved_wall_s,
            "solved_env_steps": self.solved_env_steps, "solved_return": self.solved_return,
            "solved_cpu_s": self.solved_cpu_s, "wall_s": wall_s,
            "cpu_s": time.process_time() if cpu_s is None else cpu_s,
            "iterations_per_s": self.loop_iterations / self.loop_s if self.loop_s else None, "eval_s": self.eval_s,
            "artifacts": dict(self.artifacts), "stopped_by": self.stopped_by, "exit_status": self.exit_status,
            "diverged_at_iteration": self.diverged_at_iteration, "resumed_from": self.resumed_from,
            "checkpoint_bytes": last_checkpoint.bytes if last_checkpoint else None,
            "checkpoint_write_s": last_checkpoint.seconds if last_checkpoint else None,
        }
