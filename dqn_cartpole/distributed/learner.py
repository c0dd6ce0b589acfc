"""The `learn` role: the single-process training session, minus collection and evaluation, reading a remote Reverb.

It is `training.session.TrainingSession` with its parts swapped: the pipeline (a Reverb client of
the server at `--replay-address`, with `rate_limiter_timeout_ms`, and no drivers), the replay
fill (wait until the collectors have written `initial_collect_steps` items), a weight push every
`distributed.weight_push_interval` train steps, and the evaluation: the `evaluate-live` role
evaluates the pushed weights, and the learner follows its published results between chunks
(returns, best, a confirmed solve, which stops the run). When it stops (solved, or all iterations
done) it writes the run's `stop`, which the collectors and the evaluator watch; only the learner
writes it, so collectors never leave while it still samples (a samples-per-insert ratio would then
hold its sampling back). After its last iteration it pushes its final weights first and waits for
their evaluation.
The compiled gradient step, checkpoints, exports, metrics and plots are the same code.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from dqn_cartpole.config import Config
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.distributed import parts, status
from dqn_cartpole.distributed.policy_lag import IntervalLag, tagged_sampler
from dqn_cartpole.distributed.variables import WeightSync
from dqn_cartpole.replay.base import sequence_length_for
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training.loop import Chunk, make_train_step
from dqn_cartpole.training.pipeline import Pipeline
from dqn_cartpole.training.session import TrainingSession

WAIT_POLL_S = 0.2


class LearnerSession(TrainingSession):
    """A training session whose data comes from collectors, and whose returns from an evaluator, in other processes."""

    def __init__(self, config: Config, layout: RunLayout, progress: Progress,
                 plan: Optional[checkpointing.ResumePlan], address: str):
        super().__init__(config, layout, progress, plan)
        self.address = address
        self.sync: Optional[WeightSync] = None
        self.pushed_step: Optional[int] = None  # the train step of the weights last pushed
        self.client: Any = None
        self.lag = IntervalLag(config.training.log_interval)

    def stage_replay(self, found: Optional[checkpointing.Found]) -> Optional[str]:
        return None  # the server loaded its table when it started (the launcher staged it)

    def make_pipeline(self, reverb_dir: Optional[str]) -> Pipeline:
        import reverb

        pipeline = parts.remote_pipeline(self.config, self.address, self.stack,
                                         rate_limiter_timeout_ms=self.config.distributed.rate_limiter_timeout_ms)
        self.client = reverb.Client(self.address)
        return pipeline

    def make_evaluation(self, scalars: Scalars) -> Callable[[], None]:
        return self.push_weights  # at every eval_interval: the evaluator sees the weights of that step

    def fill_replay(self) -> tuple[Any, Any]:
        return (), ()  # the collectors fill it: `iterate` waits for them

    def iterate(self, time_step: Any, policy_state: Any) -> None:
        # Made only now: a restore re-seeds TensorFlow, which clears the eager kernels and with them the
        # TF Reverb client a container made before it ("Resource ... ReverbClient does not exist").
        self.sync = WeightSync(self.address, self.pipeline.agent)
        self.push_weights()  # the collectors and the evaluator start from these weights
        if self.wait_for_data():
            super().iterate((), ())

    def make_train(self) -> Callable:
        """The session's gradient step, on samples that carry their collecting train step (policy lag)."""
        cfg = self.config
        sample = self.pipeline.replay.sampler(cfg.training.batch_size, sequence_length_for(cfg.agent.n_step),
                                              with_info=True)
        return make_train_step(self.pipeline.agent, tagged_sampler(sample), cfg.training.train_steps_per_iteration,
                               cfg.training.jit_compile, tagged=True)

    def after_chunk(self, chunk: Chunk) -> None:
        self.checkpoints.time_step = None  # no env stream here: checkpoints keep no seam
        self.state.policy_lag, self.state.policy_lag_max = self.lag.add(chunk.first, chunk.lags)
        self.follow_evaluator()

    def wait_for_data(self) -> bool:
        """Waits until the replay holds `initial_collect_steps` items, so the first sample finds data."""
        wanted = self.config.training.initial_collect_steps
        while self.pipeline.replay.size() < wanted:
            if self.stop_request.requested:
                return False
            time.sleep(WAIT_POLL_S)
        parts.count_env_steps(self.pipeline)
        return True

    def push_weights(self) -> None:
        """Pushes the weights once per train step (the push trigger and the eval trigger can both be due)."""
        train_step = self.pipeline.train_step_count()
        if train_step == self.pushed_step:
            return
        self.sync.push()
        self.pushed_step = train_step
        parts.count_env_steps(self.pipeline)

    def extra_triggers(self) -> list:
        return [(self.config.distributed.weight_push_interval, self.push_weights)]

    # -- the evaluator's results
    def follow_evaluator(self) -> Optional[status.Evaluation]:
        """Takes the evaluator's newest result into the run state; a confirmed solve stops the run."""
        evaluation = status.read_evaluation(self.client)
        if evaluation is None:
            return None
        state, per_iteration = self.state, self.config.training.train_steps_per_iteration
        state.last_return = evaluation.average_return
        state.best_return, state.best_iteration = evaluation.best_return, evaluation.best_iteration
        if evaluation.solved and state.solved_at_iteration is None and self.config.evaluation.stop_when_solved:
            state.stop = True
            state.solved_at_iteration = evaluation.train_step // per_iteration
            state.solved_return, state.solved_env_steps = evaluation.solved_return, evaluation.env_steps
            state.solved_wall_s = self.clock.wall()
            self.progress.message(
                f"Solved at iteration {state.solved_at_iteration} (the evaluator's check: average return "
                f"{evaluation.solved_return:.1f} over {evaluation.solved_episodes} greedy episodes); stopping at "
                f"iteration {state.iteration}.")
        return evaluation

    def final_evaluation(self) -> None:
        """Pushes the final weights, tells every role to stop, and waits for the evaluation of those weights."""
        if self.state.solved_at_iteration is not None:  # the evaluator confirmed a solve, and has left
            status.publish_stop(self.client, self.pipeline.train_step_count(), solved=True)
            return
        self.push_weights()
        train_step = self.pipeline.train_step_count()
        status.publish_stop(self.client, train_step, solved=False)
        deadline = time.monotonic() + self.config.distributed.final_evaluation_timeout_s
        while time.monotonic() < deadline and not self.stop_request.requested:
            evaluation = self.follow_evaluator()
            if evaluation is not None and evaluation.train_step >= train_step:
                return
            time.sleep(WAIT_POLL_S)
        self.progress.message(f"warning: no evaluation of train step {train_step} arrived within "
                              f"{self.config.distributed.final_evaluation_timeout_s:g} s (is an evaluate-live role "
                              f"running?); policy/final is exported without a measured return")
        self.state.last_return = None

    def keeps_solved_policy(self) -> bool:
        # The evaluator exported the policy it confirmed; the learner trained on a little while the word came.
        return self.state.solved_at_iteration is not None and os.path.exists(self.layout.final_policy)


def learn(config: Config, layout: RunLayout, progress: Progress, plan: Optional[checkpointing.ResumePlan],
          address: str) -> dict:
    """Trains from the server at `address`, writing everything under `layout.root`; returns the summary."""
    return LearnerSession(config, layout, progress, plan, address).run()
