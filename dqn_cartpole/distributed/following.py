"""The learner's evaluation and finish parts (`training.parts`): the returns come from the `evaluate-live` role,
whose solve check owns policy/final.

At every `evaluation.eval_interval` the learner asks for an evaluation of its newest weights (the evaluator
evaluates them once the interval has passed) and, after each compiled chunk, takes the evaluator's newest
published result into the run state; a confirmed solve stops the run. After its last iteration it pushes its
final weights, tells every role to stop, and waits for their evaluation.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from dqn_cartpole.console import exit_status
from dqn_cartpole.distributed import status
from dqn_cartpole.run_folder.tensorboard import Scalars
from dqn_cartpole.training.loop import Chunk

WAIT_POLL_S = 0.2


class FollowEvaluator:
    """The evaluator's results, read from the server (`parts.Evaluation`); `link` is the learner's
    `learner.ServerLink` (its pusher and its status watch, opened when the loop starts)."""

    def __init__(self, link: Any):
        self.link = link
        self.solved_train_step: Optional[int] = None  # the weights the evaluator's solve check passed
        self.solved_values: Optional[tuple] = None  # and their values, as this learner pushed them

    def make(self, session: Any, scalars: Scalars) -> Callable[[], None]:
        # At every eval_interval: the evaluator evaluates the newest weights once the interval has passed.
        return lambda: self.link.pusher.request()

    def after_chunk(self, session: Any, chunk: Chunk) -> None:
        evaluation = follow(session, self.link.watch.evaluation)
        if evaluation is not None and evaluation.solved and self.solved_train_step is None:
            self.solved_train_step = step = evaluation.solved_train_step
            self.solved_values = self.link.pusher.pushed(step)  # at once: the pusher keeps only the newest
            if self.solved_values is None and session.config.agent.solved_learning_rate is not None:
                session.state.unchecked_since = session.state.iteration  # policy/final says so
                session.progress.message(f"warning: the weights of train step {step}, whose solve check passed, "
                                         f"are no longer kept here: the live weights go on instead")

    def settle(self) -> None:
        pass  # nothing in flight here: results arrive in `after_chunk`

    def final(self, session: Any) -> None:
        """Pushes the final weights, tells every role to stop, and waits for the evaluation of those weights."""
        state, cfg, link = session.state, session.config, self.link
        if state.solved_at_iteration is not None and state.stop:  # the evaluator confirmed a solve, and has left
            status.publish_stop(link.client, session.pipeline.train_step_count(), solved=True)
            return
        if state.failed:  # the learner crashed (no data, or the server is gone): no evaluation is coming
            return
        train_step = link.pusher.push_now()
        status.publish_stop(link.client, train_step, solved=False)
        deadline = time.monotonic() + cfg.distributed.final_evaluation_timeout_s
        while time.monotonic() < deadline and not session.stop_request.requested and not link.watch.lost:
            evaluation = follow(session, link.watch.evaluation)
            if evaluation is not None and evaluation.train_step >= train_step:
                return
            time.sleep(WAIT_POLL_S)
        why = ("the replay server stopped answering" if link.watch.lost else
               f"{cfg.distributed.final_evaluation_timeout_s:g} s passed (is an evaluate-live role running?)")
        session.progress.message(f"warning: no evaluation of train step {train_step} arrived before {why}; "
                                 f"policy/final is exported without a measured return")
        state.last_return = None

    def solved_policy(self) -> Optional[Any]:
        return None  # the evaluator exported it; the video plays the live weights

    def solved_weights(self) -> Optional[tuple]:
        """The weights the evaluator's solve check passed, as this learner pushed them (`WeightPusher.pushed`)."""
        return self.solved_values


def follow(session: Any, evaluation: Optional[status.Evaluation]) -> Optional[status.Evaluation]:
    """Takes the evaluator's newest result into the run state; a confirmed solve stops the run (with
    `evaluation.stop_when_solved` false it is marked, and the learner trains on: `final_policy.AfterSolve`)."""
    if evaluation is None:
        return None
    state, cfg = session.state, session.config
    state.last_return = evaluation.average_return
    state.best_return, state.best_iteration = evaluation.best_return, evaluation.best_iteration
    if evaluation.solved and state.solved_at_iteration is None:
        state.stop = cfg.evaluation.stop_when_solved
        solved_step = evaluation.solved_train_step if evaluation.solved_train_step >= 0 else evaluation.train_step
        state.solved_at_iteration = solved_step // cfg.training.train_steps_per_iteration
        state.solved_return, state.solved_env_steps = evaluation.solved_return, evaluation.env_steps
        state.solved_wall_s = session.clock.wall()
        going_on = "training on" if not state.stop else f"stopping at iteration {state.iteration}"
        session.progress.message(
            f"Solved at iteration {state.solved_at_iteration} (the evaluator's check: average return "
            f"{evaluation.solved_return:.1f} over {evaluation.solved_episodes} greedy episodes); {going_on}.")
    return evaluation


class EvaluatorSolveCheck:
    """The evaluator's solve check exports policy/final; a learner stopped by a signal ends lightly; a crash is
    the run's exit status (`parts.FinishPolicy`). `crash()`: why the learner left early, if it did."""

    solved_elsewhere = True  # the evaluator's check may export policy/final while this process finishes

    def __init__(self, crash: Callable[[], Optional[str]]):
        self.crash = crash

    def keeps_solved_policy(self, session: Any) -> bool:
        # The evaluator exported the policy it confirmed; the learner trained on a little while the word came. (A run
        # that trains on after its solve exports its last weights.)
        state = session.state
        return state.solved_at_iteration is not None and state.stop and os.path.exists(session.layout.final_policy)

    def lightly(self, session: Any) -> bool:
        # After a stop signal the watchdog ends this process ROLE_GIVE_UP_S later: the checkpoint, policy/final
        # and the summary fit, videos and plots may not (the launcher redraws the plots once every role stopped).
        return session.stop_request.requested

    def seal(self, session: Any, summary: dict) -> dict:
        if self.crash() is not None:
            summary["exit_status"] = session.state.exit_status = exit_status.EXIT_CRASHED
        return summary
