"""What a report needs to know about a run beyond its CSVs: the env's limits, the discount, the best evaluation.

Derived from the run's config.yaml and gymnasium's env registry; no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import gymnasium

from dqn_cartpole.env_ids import max_return, min_return, reward_threshold
from dqn_cartpole.run_folder import RunRecord
from dqn_cartpole.run_folder.metrics import number


@dataclass(frozen=True)
class RunFacts:
    """The numbers every figure and the page draw in."""

    env_id: str
    gamma: float
    max_episode_steps: Optional[int]
    solve_return: Optional[float]
    max_return: Optional[float]  # the best possible episode return, where known (CartPole: the time limit)
    train_steps_per_iteration: int
    num_eval_episodes: Optional[int]
    min_return: Optional[float] = None  # the worst possible one, where known (Acrobot, MountainCar: -time limit)

    @property
    def max_discounted_return(self) -> Optional[float]:
        """sum_{t<T} gamma^t r for the best constant reward per step: (1 - gamma^T) / (1 - gamma) on CartPole."""
        return self._discounted(self.max_return)

    @property
    def min_discounted_return(self) -> Optional[float]:
        """The same for the worst return (Acrobot, MountainCar: -1 per step for the whole episode)."""
        return self._discounted(self.min_return)

    def _discounted(self, episode_return: Optional[float]) -> Optional[float]:
        if episode_return is None or not self.max_episode_steps:
            return None
        if self.gamma == 1.0:
            return episode_return
        per_step = episode_return / self.max_episode_steps
        return per_step * (1 - self.gamma ** self.max_episode_steps) / (1 - self.gamma)


def run_facts(record: RunRecord) -> RunFacts:
    """The env limits and settings of a run, from its config and the gymnasium registry."""
    env_id = record.config_value("env.id") or "CartPole-v1"
    spec = gymnasium.registry.get(env_id)
    steps = record.config_value("env.max_episode_steps") or (spec.max_episode_steps if spec else None)
    solve = record.config_value("evaluation.solve_return")
    if solve is None:
        solve = reward_threshold(env_id)
    gamma = record.config_value("agent.gamma")
    return RunFacts(env_id=env_id, gamma=1.0 if gamma is None else float(gamma), max_episode_steps=steps,
                    solve_return=solve, max_return=max_return(env_id, steps),
                    train_steps_per_iteration=int(record.config_value("training.train_steps_per_iteration") or 1),
                    num_eval_episodes=record.config_value("evaluation.num_eval_episodes"),
                    min_return=min_return(env_id, steps))


def best_eval_row(eval_rows: list[dict]) -> Optional[dict]:
    """The evaluation policy/best was saved at: the highest average return, the later one on ties."""
    best = None
    for row in eval_rows:
        value = number(row.get("average_return"))
        if value is not None and (best is None or value >= number(best["average_return"])):
            best = row
    return best


MUCH_WORSE = 0.1  # policy/final is much worse than policy/best below it by this share of the best (or the target)


def policy_score(policies: Optional[dict], name: str) -> Optional[tuple[float, Optional[int], Optional[int]]]:
    """(average return, episodes, iteration) of summary.json's `policies[name]`, or None."""
    entry = (policies or {}).get(name) or {}
    value = number(entry.get("average_return"))
    return None if value is None else (value, entry.get("episodes"), entry.get("iteration"))


def final_much_worse_line(policies: Optional[dict], solve_return: Optional[float]) -> Optional[str]:
    """One line when policy/final scores much worse than policy/best (by more than MUCH_WORSE of the larger of the
    best's and the target's magnitude); None otherwise, or when the two cannot be compared (`comparable`)."""
    final, best = policy_score(policies, "final"), policy_score(policies, "best")
    if not comparable(final, best):
        return None
    scale = max(abs(best[0]), abs(solve_return or 0.0))
    if best[0] - final[0] <= MUCH_WORSE * scale:
        return None
    at = f" at iteration {best[2]:,}" if best[2] is not None else ""
    return (f"policy/final ({final[0]:.1f} over {final[1] or '?'} episodes) is much worse than policy/best "
            f"({best[0]:.1f}{at}): the agent lost what it had learnt; keep policy/best "
            f"(evaluate RUN uses it by default).")


def comparable(final: Optional[tuple], best: Optional[tuple]) -> bool:
    """Whether policy/final's score may be held against policy/best's: both scored, over as many episodes as each
    other (a best of 3 or 10 episodes is the luckiest of many small samples, a final of 100 is not), and the best
    learnt something (a best at iteration 0 is the untrained network's: there was nothing to lose)."""
    if final is None or best is None or best[1] is None or final[1] != best[1]:
        return False
    return best[2] is None or best[2] > 0
