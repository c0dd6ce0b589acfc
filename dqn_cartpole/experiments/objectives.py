"""`tune --objective`: what a trial minimises, read from a finished run's summary.json.

The study (`tune`) and its outputs (`tune_outputs`, best.yaml's header) name the objectives from here.
A run that never solves scores `PENALTY_FACTOR` x its budget (env steps, or the seconds that whole budget takes at the
run's own speed), so any solving config beats any unsolved one.
"""

from __future__ import annotations

PENALTY_FACTOR = 2
# --objective: (what it measures, the summary's key for a solved run, the key of the run's own total)
OBJECTIVES = {"env_steps": ("env steps to a confirmed solve", "solved_env_steps", "env_steps"),
              "wall_s": ("wall seconds to a confirmed solve", "solved_wall_s", "wall_s"),
              "cpu_s": ("CPU seconds to a confirmed solve", "solved_cpu_s", "cpu_s")}


def env_step_budget(config: dict) -> int:
    """The env steps a run takes if it never stops early."""
    training = config["training"]
    return int(training["initial_collect_steps"] + training["num_iterations"] * training["collect_steps_per_iteration"])


def score(run, objective: str = "env_steps") -> float:
    """The objective of a finished run (a RunRecord): its env steps or seconds to solve, or the penalty."""
    _, solved_key, total_key = OBJECTIVES[objective]
    if run.solved and run.get(solved_key) is not None:
        return float(run.get(solved_key))
    budget = env_step_budget(run.config)
    if objective == "env_steps":
        return float(PENALTY_FACTOR * budget)
    # The seconds the whole budget takes at this run's speed (a diverged or stopped run ended early).
    done = max(1, int(run.get("env_steps") or 0))
    return float(PENALTY_FACTOR * float(run.get(total_key) or 0.0) * max(1.0, budget / done))
