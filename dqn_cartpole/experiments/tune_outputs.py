"""What a study leaves in outputs/tune/NAME/: best.yaml, trials.csv/.md, history.png, importance.png.

Every worker rewrites them (atomically) when it finishes, so they describe the whole study,
including the trials of other processes and machines.
"""

from __future__ import annotations

import fcntl
import os
import warnings

from dqn_cartpole.experiments import grid
from dqn_cartpole.experiments.objectives import OBJECTIVES
from dqn_cartpole.processes.commands import continue_command
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.csv_files import dict_rows, write_csv_atomic

BEST_FILE = "best.yaml"
TRIALS_CSV = "trials.csv"
TRIALS_MD = "trials.md"
HISTORY_PLOT = "history.png"
IMPORTANCE_PLOT = "importance.png"
OUTPUTS_LOCK = ".outputs.lock"
ATTR_COLUMNS = ("objective", "solved_seeds", "per_seed", "solved_env_steps", "best_return", "final_policy_return",
                "wall_s", "reason", "run_dir")


def write_outputs(study, plan) -> list[str]:
    """Writes every output that the study's trials allow; returns lines to print.

    Workers on this machine take turns (a blocking flock on the folder's OUTPUTS_LOCK): each reads
    the study and writes all its files in one turn, so the last writer has seen every trial that
    finished before it. Without the turns, a worker that read the study before another's trial
    completed could write its older best.yaml last.
    """
    os.makedirs(plan.folder, exist_ok=True)
    with open(os.path.join(plan.folder, OUTPUTS_LOCK), "a", encoding="utf-8") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes
        lines = [write_trials(study, plan.folder)]
        lines.append(write_best(study, plan))
        lines += write_plots(study, plan.folder)
    return [line for line in lines if line]


def trial_rows(study) -> list[dict]:
    """One row per trial: number, state, value, each parameter, and the recorded attributes."""
    from optuna.trial import TrialState

    names = sorted({name for t in study.trials for name in t.params})
    rows = []
    for trial in study.trials:
        complete = trial.state == TrialState.COMPLETE  # a pruned trial's value is its last report: not a score
        row = {"number": trial.number, "state": trial.state.name, "value": _cell(trial.value) if complete else ""}
        row.update({name: _cell(trial.params.get(name)) for name in names})
        row.update({key: _cell(trial.user_attrs.get(key)) for key in ATTR_COLUMNS})
        rows.append(row)
    return rows


def _cell(value) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def write_trials(study, folder: str) -> str:
    rows = trial_rows(study)
    if not rows:
        return ""
    columns = list(rows[0])
    write_csv_atomic(os.path.join(folder, TRIALS_CSV), columns, dict_rows(columns, rows))
    md = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(str(row[c]).replace("|", "\\|") for c in columns) + " |" for row in rows]
    write_text_atomic(os.path.join(folder, TRIALS_MD), "\n".join(md) + "\n")
    return f"wrote {os.path.join(folder, TRIALS_CSV)} and {TRIALS_MD} ({len(rows)} trials)"


def write_best(study, plan) -> str:
    """best.yaml: the full config of the best completed trial, ready for `train --config`."""
    from optuna.trial import TrialState

    import yaml

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return "no completed trial yet: best.yaml not written"
    best = study.best_trial
    overrides = [*plan.overrides, *best.user_attrs.get("overrides", [])]
    (config,) = grid.check_configs(plan.config_path, [[*overrides, "output.run_name=null"]])
    grid.first_error([config])
    what = OBJECTIVES[getattr(plan, "objective", "env_steps")][0]
    seeds = f", mean over seeds {best.user_attrs['per_seed']}" if best.user_attrs.get("per_seed") else ""
    if not seeds and "solved_env_steps" in best.user_attrs and best.user_attrs["solved_env_steps"] is None:
        seeds = "; unsolved: the penalty"
    header = (f"# Best trial {best.number} of study {plan.study_name}: objective {best.value:g} ({what}{seeds}).\n"
              f"# {os.path.basename(plan.config_path)} with: {', '.join(best.user_attrs.get('overrides', []))}\n")
    path = os.path.join(plan.folder, BEST_FILE)
    write_text_atomic(path, header + yaml.safe_dump(config, sort_keys=False, default_flow_style=None))
    return f"wrote {path} (trial {best.number}, objective {best.value:g}); train it with: " \
           f"{continue_command(['train', '--config', path])}"


def write_plots(study, folder: str) -> list[str]:
    """Optuna's optimisation history and parameter importances (the latter needs >= 2 completed trials
    whose parameters vary; otherwise it is skipped with a note)."""
    from optuna.visualization import matplotlib as optuna_plots

    from dqn_cartpole.experiments import figures

    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning, and notes on ties that the plot already shows
        if study.trials:
            path = figures.save_optuna_axes(optuna_plots.plot_optimization_history(study),
                                            os.path.join(folder, HISTORY_PLOT))
            lines.append(f"wrote {path}")
        try:
            ax = optuna_plots.plot_param_importances(study)
        except (ValueError, RuntimeError) as exc:
            return lines + [f"no parameter-importance plot: {str(exc).splitlines()[0]}"]
        if not ax.has_data():
            figures.close(ax)
            return lines + ["no parameter-importance plot yet: needs 2 or more completed trials with varying "
                            "parameters"]
        lines.append(f"wrote {figures.save_optuna_axes(ax, os.path.join(folder, IMPORTANCE_PLOT))}")
    return lines
