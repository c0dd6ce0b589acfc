"""What a run that does not stop on its solve does about it: at the first confirmed solve the weights that passed
the check come back and the learning rate changes (`agent.solved_learning_rate`: 0 in the default, which holds
them to the last step), and so do the target network's updates (`agent.solved_target_update_period` and `_tau`);
policy/final, the weights at the last step, is scored over `evaluation.final_episodes` fresh episodes (the
fixed-budget protocol's score).

What they do to the default is measured in docs/benchmarks.md (issue 37). A run that stops at its solve (the
default's headline protocol) never reaches them: its time to solve is unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any

from dqn_cartpole.config import Config
from dqn_cartpole.core import build
from dqn_cartpole.core.evaluation import make_episode_runner
from dqn_cartpole.core.policies import greedy_policy

FINAL_SEED_OFFSET = 40_000  # the final score's env copies: seeds neither training nor the checks use


def acts_on_solve(config: Config) -> bool:
    """Whether a run that trains on past its solve changes something there (`agent.solved_learning_rate`,
    `agent.solved_target_update_*`): then it checks for its solve, as a run that stops on it does
    (`checks_for_solve`)."""
    agent = config.agent
    return any(value is not None for value in (agent.solved_learning_rate, agent.solved_target_update_period,
                                                agent.solved_target_update_tau))


def learning_rate(config: Config, solved: bool) -> float:
    """The learning rate of a run that is (`solved`: its solve confirmed) or is not past its solve."""
    after = config.agent.solved_learning_rate
    return after if solved and after is not None else config.agent.learning_rate


def checks_for_solve(config: Config) -> bool:
    """Whether an evaluation that reaches the solve return starts the solve check: in a run that stops on its solve
    (`evaluation.stop_when_solved`), and in one that acts on it (`acts_on_solve`). The tutorial's does neither."""
    return config.evaluation.stop_when_solved or acts_on_solve(config)


def held_since(config: Config, state: Any) -> dict:
    """policy/final's record of weights held since the solve (`agent.solved_learning_rate` 0): `{"held_since":
    iteration}` for those the solve check passed, with `"held_weights": "live"` when they were the live weights (a
    learner that no longer kept those: `state.unchecked_since`); else nothing."""
    if config.agent.solved_learning_rate != 0 or state.solved_at_iteration is None or state.stop:
        return {}
    if state.unchecked_since is not None:
        return {"held_since": state.unchecked_since, "held_weights": "live"}
    return {"held_since": state.solved_at_iteration}


class AfterSolve:
    """After each compiled chunk: the run's first confirmed solve (its own check, or the evaluator's), for a run that
    trains on after it, brings back the weights that passed the check and sets the learning rate
    (`agent.solved_learning_rate`), and changes the target updates (`agent.solved_target_update_*`), once. A resumed
    run's target updates come back with its checkpoint (their variables are the agent's), its rate with
    `learning_rate`."""

    def __init__(self, config: Config, solved_already: bool):
        self.config, self.applied = config, solved_already  # a resumed run's are set at its restore (`restore`)

    def __call__(self, session: Any) -> None:
        state, agent_config = session.state, self.config.agent
        if self.applied or state.solved_at_iteration is None or state.stop:
            return
        self.applied = True
        agent = session.pipeline.agent
        agent.set_target_updates(agent_config.solved_target_update_period, agent_config.solved_target_update_tau)
        if agent_config.solved_learning_rate is None:
            return
        solved = session.evaluation.solved_weights()  # None: the live weights are those that passed
        if solved is not None:
            for variable, value in zip(agent.policy.variables(), solved):
                variable.assign(value)
        agent.set_learning_rate(agent_config.solved_learning_rate)
        what = ("held to the last step" if agent_config.solved_learning_rate == 0 else
                f"trained on at a learning rate of {agent_config.solved_learning_rate:g}")
        weights = (f"the weights that passed the solve check (iteration {state.solved_at_iteration}) are"
                   if state.unchecked_since is None else "the live weights are")
        session.progress.message(f"iteration {state.iteration}: {weights} {what} (agent.solved_learning_rate)")


def score_final(session: Any) -> None:
    """Plays `evaluation.final_episodes` fresh greedy episodes with the live weights (policy/final's) and keeps their
    average in the run state, for policy/final's policy_info.json and the summary."""
    cfg, state, agent = session.config, session.state, session.pipeline.agent
    episodes = cfg.evaluation.final_episodes
    with contextlib.ExitStack() as stack:
        env = build.make_env_copies(cfg, episodes, cfg.training.seed + FINAL_SEED_OFFSET, stack)
        result = make_episode_runner(agent.numpy_greedy() or greedy_policy(agent), env)()
    state.final_policy_return, state.final_policy_episodes = result.average_return, len(result.returns)
    session.progress.message(f"policy/final (iteration {state.iteration}) averaged {result.average_return:.1f} over "
                             f"{len(result.returns)} fresh greedy episodes")
