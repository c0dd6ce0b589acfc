"""`compare`'s table: one row per group across its seeds, as markdown (table.md), CSV (table.csv) and a terminal
table that fits 100 columns (one column per group, wrapped into blocks of groups).

The final policy's columns score each run's policy/final over fresh greedy episodes: the fixed-budget protocol's
`evaluation.final_episodes` at the end of a run that did not stop on a solve, or, for a run that stopped on its
solve, the solve check's `evaluation.solve_episodes` of the weights it stopped with and holds (summary.json's
`policies.final`).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Optional, Sequence

from dqn_cartpole.experiments import stats
from dqn_cartpole.report.facts import policy_score
from dqn_cartpole.run_folder import RunRecord
from dqn_cartpole.run_folder.csv_files import csv_text

WIDTH = 100  # the terminal table's and notes' width
TABLE_COLUMNS = ("group", "runs", "solved", "env steps to solve (median)", "wall s to solve (median)",
                 "last evaluation (IQM)", "best evaluation (IQM)", "final policy score (IQM)", "final policy solves")
SHARE_COLUMNS = ("solved", "final policy solves")  # fractions of the group's runs (k/n in the markdown table)
DIGITS = {"wall s to solve (median)": 1, "last evaluation (IQM)": 1, "best evaluation (IQM)": 1,
          "final policy score (IQM)": 1}


@dataclass(frozen=True)
class FinalScore:
    """A run's policy/final scored over fresh greedy episodes, and the solve target it is held against."""

    score: float
    episodes: Optional[int]
    target: Optional[float]
    held: bool  # the run stopped on its solve: the score is the solve check's, of the weights it stopped with


def solve_target(run: RunRecord) -> Optional[float]:
    """The average return that counts as solved for `run`: its config's, else its env's registered threshold."""
    from dqn_cartpole.env_ids import reward_threshold

    target = run.config_value("evaluation.solve_return")
    return target if target is not None else reward_threshold(run.config_value("env.id") or "CartPole-v1")


def final_score(run: RunRecord) -> Optional[FinalScore]:
    """`run`'s policy/final score: the fixed-budget one (final_policy_return), else, for a run that stopped on its
    solve, the solve check's score of the weights it holds; None for a run with neither."""
    if run.get("final_policy_return") is not None:
        return FinalScore(float(run.get("final_policy_return")), run.get("final_policy_episodes"), solve_target(run),
                          False)
    found = policy_score(run.get("policies"), "final") if run.solved else None
    return None if found is None else FinalScore(found[0], found[1], solve_target(run), True)


def final_scores(runs: Sequence[RunRecord]) -> list[FinalScore]:
    return [score for score in map(final_score, runs) if score is not None]


def group_row(group) -> dict:
    """One table row; solve times are over the solved runs only; [low, high] is the 95% bootstrap CI. The final
    policy's columns are over the runs whose policy/final was scored (`final_score`): its IQM, and the share of
    those runs whose score reaches the solve target."""
    runs = group.runs
    solved = [r for r in runs if r.solved]
    checked = [r for r in runs if r.solve_checked]
    steps = [r.get("solved_env_steps") for r in solved if r.get("solved_env_steps") is not None]
    wall = [r.get("solved_wall_s") for r in solved if r.get("solved_wall_s") is not None]
    last = [r.get("final_return") for r in runs if r.get("final_return") is not None]
    best = [r.get("best_return") for r in runs if r.get("best_return") is not None]
    scored = final_scores(runs)
    holds = [s.target is not None and s.score >= s.target for s in scored]
    return {"group": group.label, "runs": len(runs), "checked": len(checked),
            "solved": len(solved) / len(checked) if checked else float("nan"),
            "env steps to solve (median)": stats.estimate(steps, "median"),
            "wall s to solve (median)": stats.estimate(wall, "median"),
            "last evaluation (IQM)": stats.estimate(last, "iqm"),
            "best evaluation (IQM)": stats.estimate(best, "iqm"),
            "final policy score (IQM)": stats.estimate([s.score for s in scored], "iqm"),
            "final policy solves": sum(holds) / len(holds) if holds else None, "scored": len(holds),
            "held": sum(s.held for s in scored), "episodes": sorted({s.episodes for s in scored if s.episodes})}


def cells(row: dict) -> list[str]:
    """The row's cells as printed: estimates with their CI, shares as k/n (%)."""
    shown = [row[c].format(DIGITS.get(c, 0)) if isinstance(row[c], stats.Estimate) else str(row[c])
             for c in TABLE_COLUMNS]
    shown[2] = solved_cell(row)
    share = row["final policy solves"]
    shown[-1] = "-" if share is None else f"{round(share * row['scored'])}/{row['scored']} ({share:.0%})"
    return shown


def solved_cell(row: dict) -> str:
    """`3/5 (60%)` of the runs that checked for a solve; says how many did not check, or that none did."""
    runs, checked = row["runs"], row["checked"]
    if not checked:
        return "no solve check (stop_when_solved: false)"
    cell = f"{round(row['solved'] * checked)}/{checked} ({row['solved']:.0%})"
    return cell if checked == runs else f"{cell}; {runs - checked} of {runs} not checked"


def notes(rows: Sequence[dict]) -> list[str]:
    """What the table's numbers are, one paragraph each."""
    found = ["Medians and IQMs across runs with [95% stratified bootstrap CI] (rliable); solve times over the "
             "solved runs only. Last and best evaluation: the periodic greedy evaluations' average return "
             "(evaluation.num_eval_episodes episodes each)."]
    found.append(final_policy_note(rows))
    if any(row["checked"] < row["runs"] for row in rows):
        found.append("Solved counts only the runs that checked for a solve; a run from before the check ran in every "
                     "run (with evaluation.stop_when_solved: false) did not, and its best return is not a solve.")
    return found


def final_policy_note(rows: Sequence[dict]) -> str:
    """Where the final policy's scores come from: how many runs hold their solve's weights, how many ran their
    whole budget, over how many episodes."""
    held, scored = sum(row["held"] for row in rows), sum(row["scored"] for row in rows)
    if not scored:
        return "Final policy: no run has a scored policy/final (neither a solve check's nor a fixed budget's)."
    episodes = sorted({e for row in rows for e in row["episodes"]})
    over = f" over {' or '.join(map(str, episodes))} fresh greedy episodes" if episodes else ""
    parts = [f"{held} of {scored} scored runs stopped on their solve and hold the weights that passed the solve "
             f"check (the score is that check's)" if held else "",
             f"{scored - held} of {scored} ran their whole budget (scored over evaluation.final_episodes at their "
             f"end)" if held < scored else ""]
    return (f"Final policy: policy/final, scored{over}: {'; '.join(p for p in parts if p)}. Solves: the share whose "
            f"score reaches the solve target.")


def keys_table(groups: Sequence) -> tuple[list[str], list[list[str]]]:
    """(header, rows): each config key that differs among the runs that read it, with each group's value."""
    keys = list(groups[0].settings) if groups else []
    return ["key", *(g.label for g in groups)], [[key, *(g.shown[key] for g in groups)] for key in keys]


def markdown(rows: Sequence[dict], groups: Sequence, found: Sequence) -> str:
    """table.md: the table, its notes, the verdicts and the differing keys."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    lines += [""] + [line for note in notes(rows) for line in (note, "")]
    if found:
        lines += ["Verdicts (probability of improvement over the first group, rliable):", ""]
        lines += [f"- {verdict.line()}" for verdict in found] + [""]
    header, key_rows = keys_table(groups)
    if key_rows and not groups[0].named_by_keys:  # else the group labels say them
        lines += ["The config keys that differ among the runs that read them (every other key they read is the "
                  "same):", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in key_rows]
    return "\n".join(lines).rstrip("\n") + "\n"


def csv_table(rows: Sequence[dict]) -> str:
    header = []
    for name in TABLE_COLUMNS:
        header += [name] if name in ("group", "runs") else ["solve checked", "solved fraction"] if name == "solved" \
            else [f"{name} fraction"] if name in SHARE_COLUMNS else [name, f"{name} ci_low", f"{name} ci_high"]
    lines = []
    for row in rows:
        values = []
        for name in TABLE_COLUMNS:
            value = row[name]
            values += [value.value, value.low, value.high] if isinstance(value, stats.Estimate) \
                else [row["checked"], value] if name == "solved" else [value]
        lines.append(["" if c is None or (isinstance(c, float) and math.isnan(c)) else c for c in values])
    return csv_text(header, lines)


def terminal(rows: Sequence[dict], width: int = WIDTH) -> str:
    """The table turned on its side for a terminal: a line per measure, a column per group, in blocks of as many
    groups as fit `width` columns; long group labels wrap over several header lines."""
    measures = TABLE_COLUMNS[1:]
    label_width = max(len(m) for m in measures) + 2
    body = [cells(row)[1:] for row in rows]
    column = min(max([len(c) for cs in body for c in cs] + [12]) + 2, width - label_width)
    per_block = max(1, (width - label_width) // column)
    blocks = []
    for start in range(0, len(rows), per_block):
        chunk = range(start, min(start + per_block, len(rows)))
        heads = [textwrap.wrap(rows[i]["group"], column - 2) or [""] for i in chunk]
        lines = ["".ljust(label_width) + "".join(h[n].ljust(column) if n < len(h) else " " * column
                                                  for h in heads).rstrip()
                 for n in range(max(len(h) for h in heads))]
        lines += [(measure.ljust(label_width) + "".join(body[i][m].ljust(column) for i in chunk)).rstrip()
                  for m, measure in enumerate(measures)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def wrapped(text: str, indent: str = "", width: int = WIDTH) -> str:
    """A paragraph wrapped at `width` columns, its further lines indented by `indent`."""
    return textwrap.fill(text, width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


def terminal_report(rows: Sequence[dict], groups: Sequence, found: Sequence) -> str:
    """What `compare` prints: the table on its side, the verdicts, the differing keys where the labels do not say
    them, and the notes, every line within WIDTH columns (a path or a label longer than that aside)."""
    parts = [terminal(rows)]
    if found:
        parts.append("\n".join(wrapped(f"- {pair.line()}", "  ") for pair in found))
    else:
        parts.append(wrapped("One group: no verdict (the runs differ in no config key they read but the seed)."))
    header, key_rows = keys_table(groups)
    if key_rows and not groups[0].named_by_keys:
        parts.append("\n".join([f"The config keys that differ ({' | '.join(header[1:])}):"] +
                               [wrapped(f"  {row[0]}: {' | '.join(row[1:])}", "    ") for row in key_rows]))
    parts.append("\n".join(wrapped(note) for note in notes(rows)))
    return "\n\n".join(parts)
