"""Whether a tune study can tell its configs apart: checked before its first trial, and looked at after its last.

A study whose objective is measured at a confirmed solve (env steps, wall or CPU seconds to it) learns nothing from
runs that can never report one: every trial scores the same penalty, and best.yaml and the importance plot are
then built from identical scores. `check_can_solve` refuses such a study (one line, exit status 2) before any
trial starts; `all_equal_warning` says so when the finished trials all scored the same anyway. A fixed-budget study
(`--objective final_return`) needs the opposite, runs that train their whole budget: `check_trains_whole_budget`.
"""

from __future__ import annotations

from typing import Optional, Sequence

from dqn_cartpole.config import MAX_SEED, blame, load
from dqn_cartpole.env_ids import max_return, reward_threshold
from dqn_cartpole.errors import UserError


def why_never_solved(config: dict) -> Optional[tuple[str, tuple[str, ...], str]]:
    """Why a run of `config` (resolved, as plain data) can never report a solve: (the problem, the keys that make
    it so, the fix); None when it can."""
    env, evaluation = config["env"], config["evaluation"]
    if not evaluation["stop_when_solved"]:
        return ("is false, so no run stops at a solve (each trains its whole budget past it)", ("evaluation.stop_when_solved",),
                "let runs solve: --set evaluation.stop_when_solved=true")
    target = evaluation["solve_return"]
    target = reward_threshold(env["id"]) if target is None else target
    best = max_return(env["id"], env["max_episode_steps"])
    if target is not None and best is not None and target > best:
        return (f"{target:g} is above the best return {env['id']} allows here ({best:g}), so no run can solve it",
                ("evaluation.solve_return", "env.id", "env.max_episode_steps"),
                "lower evaluation.solve_return or raise env.max_episode_steps")
    return None


def check_can_solve(config_path: str, overrides: Sequence[str], base: dict, trial_configs: Sequence[dict],
                    objective: str, solved_key: str) -> None:
    """Refuses a study whose objective (`solved_key`: the summary's field for it) needs a solve that neither the
    base config nor any value of the search space can report. `trial_configs`: the base with each value the space
    may give one parameter (what `plan_tune` checked)."""
    if not solved_key.startswith("solved_"):
        return  # measured without a solve
    found = why_never_solved(base)
    if found is None or any(why_never_solved(config) is None for config in trial_configs):
        return
    problem, keys, fix = found
    origins = load(config_path, overrides).origins
    raise UserError(f"{blame(origins, config_path, *keys)}: {keys[0]} {problem}; --objective {objective} is measured "
                    f"at a confirmed solve, so every trial would score the same penalty: {fix}")


def check_trains_whole_budget(config_path: str, space_path: str, overrides: Sequence[str], base: dict,
                              candidates: Sequence[tuple], checked: Sequence, objective: str) -> None:
    """Refuses a fixed-budget study (`--objective final_return`) whose runs could stop at their solve: such a run
    never scores policy/final over fresh episodes, so the study would rank its configs by something else.
    `candidates` are the (parameter, value) pairs the space may give, `checked` their configs (plain data, or the
    UserError a value gave)."""
    if base["evaluation"]["stop_when_solved"]:
        origins = load(config_path, overrides).origins
        raise UserError(f"{blame(origins, config_path, 'evaluation.stop_when_solved')}: evaluation.stop_when_solved "
                        f"is true, so a run stops at its solve and never scores its final policy; --objective "
                        f"{objective} scores it after the whole budget: --set evaluation.stop_when_solved=false")
    for (param, value), config in zip(candidates, checked):
        if isinstance(config, dict) and config["evaluation"]["stop_when_solved"]:
            raise UserError(f"--space {space_path}: {param.key}: {value!r} would let a run stop at its solve, and --objective "
                            f"{objective} scores the final policy after the whole budget: leave it out of the space")


def check_sampler_seed(seed: Optional[int]) -> None:
    """tune's --seed seeds the TPE sampler (NumPy), which takes [0, 2^32): one line instead of NumPy's traceback."""
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed {seed}: must be in [0, {MAX_SEED}]")


def all_equal_warning(values: Sequence[float]) -> Optional[str]:
    """A warning when two or more completed trials all scored the same: the study cannot rank their configs."""
    if len(values) < 2 or len(set(values)) > 1:
        return None
    return (f"warning: all {len(values)} completed trials scored the same ({values[0]:g}): the study cannot tell "
            f"their configs apart (did any run solve?), so best.yaml is the first of them and the importance plot "
            f"means nothing")
