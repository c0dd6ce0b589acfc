"""`report.html` of one run folder: the outcome, the plots, the videos, the evaluations, the config and the links.

Reads the run only through `read_run` (summary.json, the CSVs, config.yaml) and never imports
TensorFlow or matplotlib: the plots are drawn by `figures`, this page only shows them.
"""

from __future__ import annotations

import glob
import os
from typing import Optional

from dqn_cartpole.report import html
from dqn_cartpole.report.facts import RunFacts, best_eval_row, final_much_worse_line, run_facts
from dqn_cartpole.run_folder import RunRecord, read_run
from dqn_cartpole.run_folder.layout import TENSORBOARD_DIR
from dqn_cartpole.run_folder.metrics import number

# eval_metrics.csv column -> (header, digits; None: a count with thousands separators). "train_step" is shown as
# the iteration. Short headers keep the table within a 1280 px window.
EVAL_TABLE = {"train_step": ("iteration", None), "env_steps": ("env steps", None),
              "average_return": ("average return", 1), "min_return": ("min", 1), "max_return": ("max", 1),
              "std_return": ("std", 1), "average_discounted_return": ("discounted return", 2),
              "average_max_q_at_reset": ("max-Q at start", 2), "average_episode_length": ("episode length", 1),
              "num_episodes": ("episodes", None), "wall_s": ("wall s", 1)}
PROVENANCE_LABELS = {"package_version": "dqn_cartpole", "git_commit": "git commit", "python": "Python",
                     "tensorflow": "TensorFlow", "tf_agents": "TF-Agents", "reverb": "Reverb",
                     "gymnasium": "gymnasium", "cpu_model": "CPU", "cpu_cores": "cores", "os": "OS"}
PLOT_CAPTIONS = {
    "returns": "The greedy policy's average return at each evaluation, against iterations, env steps and "
               "wall-clock seconds; the band spans the worst and best episode; grey: the mean return of the "
               "collect policy's (epsilon-greedy) episodes in each log interval; the star is the policy saved as "
               "policy/best.",
    "loss": "The TD loss's mean (blue) and max (red) over each log interval. It is not a score: it often grows "
            "while the agent improves, because the targets grow with the values. Watch for sudden jumps or NaN.",
    "epsilon": "How often the collect policy acts at random: exploration early, mostly greedy later.",
    "q_values": "At each evaluation: what the network believes the discounted return from its episodes' first "
                "states is (red, max over actions of Q) against what the greedy policy then gets from those same "
                "states (blue), both with the agent's gamma. Red above blue is over-estimation, below it "
                "under-estimation.",
    "atoms": "A distributional agent (C51) learns, for each action, a probability over a fixed set of returns (the "
             "atoms); its Q-value is that distribution's expectation (dashed), and the greedy action has the "
             "highest. Shown at a few of the fixed random-policy states the Q probe watches, under the weights of "
             "the saved policy named in the title. A narrow peak is a confident estimate; a spread or two-humped "
             "one, an uncertain return (near a fall, the next steps decide).",
    "priorities": "Prioritized replay: left, the importance weights that scale each sampled item's loss, from the "
                  "smallest in each log interval up to 1 (each batch's largest); they undo the bias of sampling by "
                  "priority, fully as beta reaches 1. Right, the mean and largest priority the learner wrote back "
                  "(|TD error| + epsilon, or C51's cross-entropy): they follow the TD errors, which grow with the "
                  "values early on and shrink as the targets settle; a largest far above the mean is a few items "
                  "sampled often.",
    "collectors": "A distributed run: each collector's env steps/s and how long ago it pulled its weights; right, "
                  "the policy lag, how many train steps older than the learner the weights that collected its "
                  "sampled items were.",
}


def fmt(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def outcome_line(record: RunRecord, facts: RunFacts) -> tuple[str, str]:
    """One sentence: solved (where and when), not solved, or not checked, and how the run ended. Returns (text,
    kind): kind is "solved", "unsolved", "unchecked" (the solve check was off) or "unfinished"."""
    if not record.finished:
        return ("Unfinished: this run has no summary.json yet (still running, or stopped before its end; "
                "resume it with train --resume)."), "unfinished"
    target = f"{facts.solve_return:g}" if facts.solve_return is not None else "the target"
    iterations = f"after {record.get('iterations', 0):,} iterations"
    best = record.get("best_return")
    if record.solved:
        kind, text = "solved", (f"Solved at iteration {record.get('solved_at_iteration'):,}, after "
                                f"{fmt(record.get('solved_env_steps'), 0)} env steps and "
                                f"{fmt(record.get('solved_wall_s'))} s (greedy average return >= {target}).")
    elif not record.solve_checked:
        kind, text = "unchecked", (f"No solve check ran (evaluation.stop_when_solved: false): "
                                   f"{unchecked_words(best, facts)}, {iterations}.")
    elif best is not None and facts.solve_return is not None and best >= facts.solve_return:
        kind, text = "unsolved", (f"Not solved: no solve check confirmed it; {unchecked_words(best, facts)}, "
                                  f"{iterations}.")
    else:
        kind, text = "unsolved", (f"Not solved: the best greedy average return was {fmt(best)}, the target is "
                                  f"{target}, {iterations}.")
    if record.get("stopped_by"):
        text += f" Stopped early by {record.get('stopped_by')}; it can be resumed."
    if record.get("diverged_at_iteration") is not None:
        text += f" Training diverged at iteration {record.get('diverged_at_iteration'):,}."
    return text, kind


def unchecked_words(best: Optional[float], facts: RunFacts) -> str:
    """A run without a solve check: its best evaluation against the threshold, without calling it solved (the
    check would have played `evaluation.solve_episodes` fresh episodes)."""
    said = f"the best greedy average return was {fmt(best)}"
    if best is None or facts.solve_return is None:
        return said
    if best >= facts.solve_return:
        return (f"{said}, at or above the target {facts.solve_return:g} in an evaluation, not confirmed on fresh "
                f"episodes")
    return f"{said}, below the target {facts.solve_return:g}"


def policy_fact(record: RunRecord, name: str) -> str:
    """`500.0 over 100 episodes, iteration 20,000: the weights at the last step` (summary.json's `policies`)."""
    entry = (record.get("policies") or {}).get(name)
    if not entry:
        return "-"
    score = number(entry.get("average_return"))
    iteration = entry.get("iteration")
    return (f"{fmt(score)} over {entry.get('episodes') or '?'} episodes"
            + (f", iteration {iteration:,}" if iteration is not None else "") + f": {entry.get('what')}")


def header(record: RunRecord, facts: RunFacts) -> str:
    text, kind = outcome_line(record, facts)
    warning = final_much_worse_line(record.get("policies"), facts.solve_return)
    best = best_eval_row(record.eval_rows)
    best_at = ""
    if best is not None:
        iteration = number(best["train_step"]) / facts.train_steps_per_iteration
        best_at = f" (iteration {fmt(iteration, 0)}, {fmt(number(best['env_steps']), 0)} env steps)"
    peak = record.get("peak_rss_mb")
    facts_html = "".join(f"<div><span>{html.esc(k)}</span>{html.esc(v)}</div>" for k, v in (
        ("best average return", fmt(record.get("best_return", number(best["average_return"]) if best else None))
         + best_at),
        ("final average return", fmt(record.get("final_return"))),
        ("policy/final", policy_fact(record, "final")),
        ("policy/best", policy_fact(record, "best")),
        ("wall time", f"{fmt(record.get('wall_s'))} s"),
        ("iterations", fmt(record.get("iterations"), 0)),
        ("env steps", fmt(record.get("env_steps"), 0)),
        ("peak memory", f"{fmt(peak, 0)} MB" if peak is not None else "-"),
    ))
    warned = f'<p class="outcome unsolved final-worse">{html.esc(warning)}</p>' if warning else ""
    return f'<p class="outcome {kind}">{html.esc(text)}</p>{warned}<div class="facts">{facts_html}</div>'


def plots_section(record: RunRecord, page_dir: str) -> str:
    layout = record.layout
    wide = html.images([layout.returns_plot], page_dir, [PLOT_CAPTIONS["returns"]], wide=True)
    others = html.images([layout.loss_plot, layout.epsilon_plot, layout.q_values_plot], page_dir,
                         [PLOT_CAPTIONS["loss"], PLOT_CAPTIONS["epsilon"], PLOT_CAPTIONS["q_values"]])
    optional = "".join(  # each wide plot that exists (atoms.png only with its atoms.json)
        html.images([plot], page_dir, [PLOT_CAPTIONS[name]], wide=True)
        for name, plot in (("priorities", layout.priorities_plot), ("atoms", layout.atoms_plot),
                           ("collectors", layout.collectors_plot))
        if os.path.exists(plot) and (name != "atoms" or os.path.exists(layout.atoms)))
    return wide + others + optional


def videos_section(record: RunRecord, page_dir: str) -> str:
    layout = record.layout
    trained = record.config_value("video.num_episodes")
    random = record.config_value("video.random_episodes")
    return html.videos([
        (f"Trained agent (greedy), {trained or 'several'} episodes", [layout.trained_video]),
        (f"Random agent, {random or 'several'} episodes", [layout.random_video]),
    ], page_dir)


def eval_table(record: RunRecord, facts: RunFacts) -> str:
    """The evaluations, one row each, formatted (thousands separators, one or two decimals)."""
    if not record.eval_rows:
        return '<p class="note">No evaluations yet.</p>'
    columns = [c for c in EVAL_TABLE if any(row.get(c) not in (None, "") for row in record.eval_rows)]
    rows = []
    for row in record.eval_rows:
        cells = []
        for column in columns:
            value = number(row.get(column))
            if value is not None and column == "train_step":
                value /= facts.train_steps_per_iteration
            digits = EVAL_TABLE[column][1]
            cells.append(fmt(value, 0 if digits is None else digits))
        rows.append(cells)
    return '<div class="scroll">' + html.table([EVAL_TABLE[c][0] for c in columns], rows, key_columns=0) + "</div>"


def default_config() -> tuple[dict, str]:
    """The config every run is compared with: the shipped configs/default.yaml (every key's default)."""
    from dqn_cartpole.config import default_config_path, read_resolved

    return read_resolved(default_config_path()), "configs/default.yaml"


def config_section(record: RunRecord) -> str:
    """The keys that apply to this kind of run, with the default; a key the user changed is highlighted.

    Changed means written (config.written.yaml: the run's --config file and flags) with another value than the
    default, so an `auto` the run resolved is no change; such a value shows what it was written as. A run folder
    without that file (an older version's, a distributed run's) is compared by `written_differs`.
    """
    from dqn_cartpole.config import applies
    from dqn_cartpole.report.changed_keys import changes, written_differs

    defaults, source = default_config()
    distributed = os.path.isdir(record.layout.roles)
    changed_keys = None if record.written is None else set(changes(record.written))
    rows, changed, hidden = [], [], 0
    for section, keys in record.config.items():
        for key, value in (keys or {}).items():
            dotted = f"{section}.{key}"
            if not applies(record.config, dotted, distributed):
                hidden += 1
                continue
            default = defaults.get(section, {}).get(key, "(not in defaults)")
            differs = written_differs(record.config, defaults, dotted) if changed_keys is None \
                else dotted in changed_keys
            given = (record.written or {}).get(dotted, value if differs else default)
            shown = f"{_show(value)} (from auto)" if given == "auto" and value != given else _show(value)
            rows.append((dotted, shown, _show(default)))
            changed.append(differs)
    kind = "a distributed run" if distributed else "a single-process run"
    note = (f'<p class="note">The resolved config of this run (config.yaml): {len(rows)} keys that apply to {kind}'
            f"{f' ({hidden} that do not are left out)' if hidden else ''}. {changed_words(sum(changed), source)} "
            f"(an <code>auto</code> the run resolved is no change).</p>")
    return note + html.table(("key", "this run", source), rows, highlight=changed)


def changed_words(count: int, source: str) -> str:
    """How many keys the user changed from `source`, in words: none, one, or the number highlighted."""
    if count == 0:
        return f"Every key has {html.esc(source)}'s value: the user changed none"
    keys = "the key" if count == 1 else f"the {count} keys"
    return f"Highlighted: {keys} the user changed from {html.esc(source)}"


def provenance_section(record: RunRecord) -> str:
    """What produced the run: the package and its commit, the libraries, the machine (summary.json)."""
    found = record.get("provenance") or {}
    if not found:
        return '<p class="note">This run\'s summary.json records no provenance (written by an older version).</p>'
    rows = []
    for key, label in PROVENANCE_LABELS.items():
        value = found.get(key)
        if key == "git_commit":
            value = "not a git checkout" if value is None else value + (" (with uncommitted changes)"
                                                                        if found.get("git_dirty") else "")
        rows.append((label, "-" if value is None else value))
    return html.table(("", "version or value"), rows)


def placement_section(run_dir: str) -> Optional[str]:
    """A distributed run's roles/placement.json: where each role runs now (or ran last), its pid, its restarts
    and where it ran before; None for a run without one."""
    from dqn_cartpole.run_folder.placement import read_placement

    found = read_placement(run_dir)
    if not found:
        return None
    def order(name: str) -> tuple:
        kind, _, index = name.rpartition(" ")
        first = {"replay server": 0, "learner": 1, "evaluator": 2}
        return (first[name], 0) if name in first else (3, int(index) if index.isdigit() else 0)

    rows = []
    for role, entry in sorted(found["roles"].items(), key=lambda item: order(item[0])):
        earlier = "; ".join(f"{_node(b)} pid {b.get('pid')} ({b.get('ended') or 'replaced'})"
                            for b in entry.get("before", [])) or "-"
        node = _node(entry)
        state = entry.get("ended") if entry.get("state") == "ended" else entry.get("state")
        rows.append((role, node, entry.get("pid") or "-", entry.get("restarts", 0), state or "-", earlier))
    note = (f'<p class="note">From roles/placement.json (topology {html.esc(found.get("topology", "?"))}), kept '
            f"current as roles are restarted or move.</p>")
    return note + '<div class="scroll">' + html.table(("role", "node", "pid", "restarts", "last state",
                                                      "where it ran before"), rows, key_columns=2) + "</div>"


def _node(entry: dict) -> str:
    """`10.0.0.3 (node 8f3a01c2)`: a node's IP and the start of its Ray id (nodes on one machine share an IP)."""
    node = str(entry.get("node_ip") or "-")
    return node + (f" (node {str(entry['node_id'])[:8]})" if entry.get("node_id") else "")


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
        html.Section("Evaluations", eval_table(record, facts)),
        *([html.Section("Where the roles ran", placed)] if (placed := placement_section(run_dir)) else []),
        html.Section("Config", config_section(record)),
        html.Section("Files", links_section(record, page_dir)),
        html.Section("Provenance", provenance_section(record)),
    ]
    title = f"DQN on {facts.env_id}: {os.path.basename(os.path.abspath(run_dir))}"
    return html.write_page(record.layout.report, title, sections, intro=header(record, facts))
