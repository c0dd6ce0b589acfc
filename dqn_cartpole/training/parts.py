"""The three parts a training session is built from (`session.TrainingSession`), as interfaces: `DataSource`
(what the agent trains on), `Evaluation` (where the returns come from) and `FinishPolicy` (the end, and who owns the
solve check). A way of running picks one of each, which the session calls at fixed points of its phases, and
overrides nothing; which way of running picks which is the table in docs/internals.md.

Each part method receives the session (`TrainingSession`): its config, layout, progress, run state, clock,
phases, ExitStack and, once built, its pipeline, checkpoints, exporter and periodic evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional, Protocol

from dqn_cartpole.console import signals
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training.loop import Chunk, ChunkedLoop
from dqn_cartpole.training.pipeline import Pipeline


class DataSource(Protocol):
    """Where the agent's experience comes from."""

    def make_pipeline(self, session: Any, found: Optional[checkpointing.Found]) -> Pipeline:
        """Envs, agent, replay, drivers (none when other processes collect); `found`: the checkpoint to resume."""

    def fill(self, session: Any) -> tuple[Any, Any, Optional[ChunkedLoop]]:
        """A fresh run's start: (time step, policy state) where collection starts, and the compiled loop if it was
        prepared meanwhile (else None: the session makes it at the loop)."""

    def make_train(self, session: Any) -> Callable:
        """One iteration's gradient step(s) on the replay's samples, as one graph function."""

    def feeding(self, session: Any, time_step: Any, policy_state: Any) -> ContextManager[Optional[tuple]]:
        """Around the loop: yields where it starts, (time step, policy state), or None not to run it (no data came);
        ends it on a lost data stream."""

    def running_chunk(self) -> ContextManager:
        """Around each compiled chunk's call."""

    def after_chunk(self, session: Any, chunk: Chunk) -> None:
        """After each compiled chunk, before the triggers."""


class Evaluation(Protocol):
    """What measures the greedy policy's returns during the run."""

    def make(self, session: Any, scalars: Scalars) -> Callable[[], None]:
        """The periodic evaluation, run at every `evaluation.eval_interval` (and at iteration 0)."""

    def after_chunk(self, session: Any, chunk: Chunk) -> None:
        """After each compiled chunk (results that arrive from elsewhere)."""

    def settle(self) -> None:
        """Takes in an evaluation still in flight, if any."""

    def final(self, session: Any) -> None:
        """After the last iteration, unless stopped by a signal: the final weights get a measured return."""

    def solved_policy(self) -> Optional[Any]:
        """The greedy policy of the weights that passed a solve check taken in here, if any."""

    def solved_weights(self) -> Optional[tuple]:
        """The values of the greedy policy's variables that passed the run's confirmed solve check, if they are not
        the live ones (None: they are, or none passed)."""


class FinishPolicy(Protocol):
    """What the end of the run writes, and who owns the solve check."""

    # Whether a solve check in another process may export policy/final: the finish then never replaces a solved
    # policy/final with its own (the two may race).
    solved_elsewhere: bool

    def keeps_solved_policy(self, session: Any) -> bool:
        """policy/final is the solved policy already on disk: it is not exported again."""

    def lightly(self, session: Any) -> bool:
        """Only the checkpoint, policy/final and the summary: no videos, no plots."""

    def seal(self, session: Any, summary: dict) -> dict:
        """The summary as this way of running reports it."""


@dataclass
class Parts:
    """One choice of each part, and the stop request the run answers (a role's ends the process after a while)."""

    data: DataSource
    evaluation: Evaluation
    finish: FinishPolicy
    stop_request: signals.StopRequest
