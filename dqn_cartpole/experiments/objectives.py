"""`tune --objective`: what a trial minimises, read from a finished run's summary.json (docs/experiments.md, 'tune: an
Optuna study'); the study (`tune`) and its outputs (`tune_outputs`, best.yaml's header) name the objectives from here.
"""

from __future__ import annotations

PENALTY_FACTOR = 2
# --objective: (what it measures, the summary's key for a solved run, the key of the run's own total)
OBJECTIVES = {"env_steps": ("env steps to a confirmed solve", "solved_env_steps", "env_steps"),
              "wall_s": ("wall seconds to a confirmed solve", "solved_wall_s", "wall_s"),
              "cpu_s": ("CPU seconds to a confirmed solve", "solved_cpu_s", "cpu_s"),
              "final_return": ("the final policy's average return over fresh episodes, negated", "final_policy_return",
                               "final_return")}
FIXED_BUDGET = ("final_return",)  # the objectives scored after the whole budget, not at a solve


def env_step_budget(config: dict) -> int:
    """The env steps a run takes if it never stops early."""
    training = config["training"]
    return int(training["initial_collect_steps"] + training["num_iterations"] * training["collect_steps_per_iteration"])


def score(run, objective: str = "env_steps") -> float:
    """The objective of a finished run (a RunRecord): its env steps or seconds to solve, or the penalty; or its final
    policy's return, negated (`final_score`)."""
    if objective in FIXED_BUDGET:
        return -final_score(run)
    _, solved_key, total_key = OBJECTIVES[objective]
    if run.solved and run.get(solved_key) is not None:
        return float(run.get(solved_key))
    budget = env_step_budget(run.config)
    if objective == "env_steps":
        return float(PENALTY_FACTOR * budget)
    # The seconds the whole budget takes at this run's speed (a diverged or stopped run ended early).
    done = max(1, int(run.get("env_steps") or 0))
    return float(PENALTY_FACTOR * float(run.get(total_key) or 0.0) * max(1.0, budget / done))


def final_score(run) -> float:
    """policy/final's average return over fresh episodes. A run that ended before it scored one (it diverged: with
    --seeds that seed still counts) counts its last periodic evaluation instead, and one with no evaluation at all
    minus infinity: whatever the env's returns, it ranks below every run that returned something."""
    for key in ("final_policy_return", "final_return"):
        if run.get(key) is not None:
            return float(run.get(key))
    return float("-inf")


def verdict(run, objective: str, value: float) -> str:
    """One seed's or one run's result in words, for a trial's line."""
    if objective in FIXED_BUDGET:
        if run.get("final_policy_return") is not None:
            return f"final policy {-value:.1f} over {run.get('final_policy_episodes')} fresh episodes"
        return f"no final policy score (scores {value:g}, its last evaluation's return negated)"
    return f"solved, {OBJECTIVES[objective][0]} {value:g}" if run.solved else f"not solved (scores {value:g})"
