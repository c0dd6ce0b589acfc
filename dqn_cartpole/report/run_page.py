"""`report.html` of one run folder: the outcome, the plots, the videos, the evaluations, the config and the links.

Reads the run only through `read_run` (summary.json, the CSVs, config.yaml) and never imports
TensorFlow or matplotlib: the plots are drawn by `figures`, this page only shows them.
"""

from __future__ import annotations

import glob
import os
from typing import Optional

from dqn_cartpole.report import html
from dqn_cartpole.report.facts import RunFacts, best_eval_row, run_facts
from dqn_cartpole.run_folder import RunRecord, read_run
from dqn_cartpole.run_folder.layout import TENSORBOARD_DIR
from dqn_cartpole.run_folder.metrics import number

REPO_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                   "configs", "default.yaml")
EVAL_TABLE_COLUMNS = ("train_step", "env_steps", "average_return", "min_return", "max_return", "std_return",
                      "average_discounted_return", "average_episode_length", "num_episodes", "wall_s")
PLOT_CAPTIONS = {
    "loss": "The TD loss is not a score: it often grows while the agent improves, because the targets grow with "
            "the values. Watch for sudden jumps or NaN.",
    "epsilon": "How often the collect policy acts at random: exploration early, mostly greedy later.",
    "q_values": "What the network believes (red) against what the greedy policy gets (blue), both discounted "
                "with the agent's gamma. Red far above blue is over-estimation; both level off at most at the "
                "grey line. The red states come from a random policy, so the two differ in where they start.",
    "collectors": "A distributed run: each collector's env steps/s and how long ago it pulled its weights; right, "
                  "the policy lag, how many train steps older than the learner the weights that collected its "
                  "sampled items were.",
}


def fmt(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def outcome_line(record: RunRecord, facts: RunFacts) -> tuple[str, bool]:
    """One sentence: solved (where and when) or not, and how the run ended. Returns (text, solved)."""
    if not record.finished:
        return ("Unfinished: this run has no summary.json yet (still running, or stopped before its end; "
                "resume it with train --resume)."), False
    target = f"{facts.solve_return:g}" if facts.solve_return is not None else "the target"
    if record.solved:
        text = (f"Solved at iteration {record.get('solved_at_iteration'):,}, after "
                f"{fmt(record.get('solved_env_steps'), 0)} env steps and {fmt(record.get('solved_wall_s'))} s "
                f"(greedy average return >= {target}).")
    else:
        text = (f"Not solved: the best greedy average return was {fmt(record.get('best_return'))}, the target is "
                f"{target}, after {record.get('iterations', 0):,} iterations.")
    if record.get("stopped_by"):
        text += f" Stopped early by {record.get('stopped_by')}; it can be resumed."
    if record.get("diverged_at_iteration") is not None:
        text += f" Training diverged at iteration {record.get('diverged_at_iteration'):,}."
    return text, record.solved


def header(record: RunRecord, facts: RunFacts) -> str:
    text, solved = outcome_line(record, facts)
    best = best_eval_row(record.eval_rows)
    best_at = ""
    if best is not None:
        best_at = f" (train step {best['train_step']}, {int(float(best['env_steps'])):,} env steps)"
    peak = record.get("peak_rss_mb")
    facts_html = "".join(f"<div><span>{html.esc(k)}</span>{html.esc(v)}</div>" for k, v in (
        ("best average return", fmt(record.get("best_return", number(best["average_return"]) if best else None))
         + best_at),
        ("final average return", fmt(record.get("final_return"))),
        ("wall time", f"{fmt(record.get('wall_s'))} s"),
        ("iterations", f"{record.get('iterations', '-')}"),
        ("env steps", f"{record.get('env_steps', '-')}"),
        ("peak memory", f"{fmt(peak, 0)} MB" if peak is not None else "-"),
    ))
    cls = "solved" if solved else "unsolved"
    return f'<p class="outcome {cls}">{html.esc(text)}</p><div class="facts">{facts_html}</div>'


def plots_section(record: RunRecord, page_dir: str) -> str:
    layout = record.layout
    wide = html.images([layout.returns_plot], page_dir, [
        "The greedy policy's average return at each evaluation, against iterations and env steps; the band spans "
        "the worst and best episode; the star is the policy saved as policy/best."], wide=True)
    others = html.images([layout.loss_plot, layout.epsilon_plot, layout.q_values_plot], page_dir,
                         [PLOT_CAPTIONS["loss"], PLOT_CAPTIONS["epsilon"], PLOT_CAPTIONS["q_values"]])
    collectors = html.images([layout.collectors_plot], page_dir, [PLOT_CAPTIONS["collectors"]], wide=True) \
        if os.path.exists(layout.collectors_plot) else ""
    return wide + others + collectors


def videos_section(record: RunRecord, page_dir: str) -> str:
    layout = record.layout
    trained = record.config_value("video.num_episodes")
    random = record.config_value("video.random_episodes")
    return html.videos([
        (f"Trained agent (greedy), {trained or 'several'} episodes", [layout.trained_video]),
        (f"Random agent, {random or 'several'} episodes", [layout.random_video]),
    ], page_dir)


def default_config() -> tuple[dict, str]:
    """The config every run is compared with: configs/default.yaml when present, else the built-in defaults."""
    from dqn_cartpole.config import Config, read_resolved, to_dict

    if os.path.isfile(REPO_DEFAULT_CONFIG):
        return read_resolved(REPO_DEFAULT_CONFIG), "configs/default.yaml"
    return to_dict(Config()), "the built-in defaults"


def config_section(record: RunRecord) -> str:
    defaults, source = default_config()
    rows, changed = [], []
    for section, keys in record.config.items():
        for key, value in (keys or {}).items():
            default = defaults.get(section, {}).get(key, "(not in defaults)")
            rows.append((f"{section}.{key}", _show(value), _show(default)))
            changed.append(value != default)
    note = (f'<p class="note">The resolved config of this run (config.yaml). Highlighted: {sum(changed)} keys that '
            f"differ from {html.esc(source)}.</p>")
    return note + html.table(("key", "this run", source), rows, highlight=changed)


def _show(value: object) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def links_section(record: RunRecord, page_dir: str) -> str:
    layout = record.layout
    checkpoints = sorted(glob.glob(os.path.join(layout.checkpoints, "ckpt-*")), key=_checkpoint_number)
    links = [("best policy (SavedModel)", layout.best_policy), ("final policy (SavedModel)", layout.final_policy)]
    links += [(f"checkpoint {os.path.basename(path)}", path) for path in checkpoints]
    links += [("checkpoints folder", layout.checkpoints), ("config.yaml", layout.config),
              ("train metrics (CSV)", layout.train_metrics), ("eval metrics (CSV)", layout.eval_metrics),
              ("summary.json", layout.summary)]
    tensorboard = ""
    if os.path.isdir(layout.tensorboard):
        tensorboard = (f"<p>TensorBoard (scalars under train/ and eval/): from this folder run "
                       f"<code>tensorboard --logdir {TENSORBOARD_DIR}</code></p>")
    return html.link_list(links, page_dir) + tensorboard


def _checkpoint_number(path: str) -> int:
    tail = os.path.basename(path).split("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def write_run_report(run_dir: str, record: Optional[RunRecord] = None) -> str:
    """Writes `report.html` into a run folder (from what is on disk now); returns its path."""
    record = record or read_run(run_dir)
    facts = run_facts(record)
    page_dir = os.path.abspath(run_dir)
    sections = [
        html.Section("Plots", plots_section(record, page_dir)),
        html.Section("Videos", videos_section(record, page_dir)),
        html.Section("Evaluations", html.csv_table(record.layout.eval_metrics, EVAL_TABLE_COLUMNS)),
        html.Section("Config", config_section(record)),
        html.Section("Files", links_section(record, page_dir)),
    ]
    title = f"DQN on {facts.env_id}: {os.path.basename(os.path.abspath(run_dir))}"
    return html.write_page(record.layout.report, title, sections, intro=header(record, facts))
