"""`compare`'s report.html: the verdicts, the table with formatted numbers, the plots with their captions, the
config keys that differ and a link to each run's own page, labelled by group and seed. Built from the run report's
blocks (`report.html`), so it looks like a run's page and works as a copied or zipped folder."""

from __future__ import annotations

import os
from typing import Sequence

from dqn_cartpole.experiments import compare_table
from dqn_cartpole.report import html

CAPTIONS = {
    "returns.png": "{statistic} of the greedy evaluation return across each group's seeds, with its 95% stratified "
                   "bootstrap CI; each seed faint. A run that stopped (on its solve, or at its budget) keeps its last "
                   "evaluated return, that of the policy it holds, to the end of the x-axis (dashed), so a run that "
                   "stops does not leave the statistic.",
    "solved.png": "The share of each group's runs whose solve was confirmed by each env step (runs that checked for "
                  "a solve). A run that never solved keeps the line below 1.",
    "profile.png": "Performance profile (rliable): the fraction of each group's runs whose final policy scores above "
                   "each return, with 95% bootstrap bands; the dotted line is the solve target. A profile to the "
                   "right of another is better everywhere.",
}


def write(comparison, statistic_name: str) -> str:
    """Writes `comparison.page` (a `compare.Comparison`); returns its path."""
    page_dir = os.path.dirname(os.path.abspath(comparison.page))
    plots = [os.path.join(comparison.folder, name) for name in CAPTIONS]
    captions = [text.format(statistic=statistic_name.upper()) for text in CAPTIONS.values()]
    sections = [html.Section("Table", table_section(comparison.rows)),
                html.Section("Plots", html.images(plots, page_dir, captions)),
                html.Section("Config keys that differ", keys_section(comparison.groups)),
                html.Section("Runs", runs_section(comparison.groups, page_dir))]
    return html.write_page(comparison.page, title(comparison.groups), sections,
                           intro=verdicts_intro(comparison.verdicts, comparison.groups))


def title(groups: Sequence) -> str:
    runs = sum(len(g.runs) for g in groups)
    if 1 < len(groups) <= 3:
        return f"Compare: {' vs '.join(g.label for g in groups)} ({runs} runs)"
    return f"Compare: {len(groups)} group{'s' if len(groups) != 1 else ''}, {runs} runs"


def verdicts_intro(found: Sequence, groups: Sequence) -> str:
    """Each group against the first: which is better on which measure, with what probability, or that its seeds
    cannot tell; what the probability means, under them."""
    if not found:
        return (f'<p class="outcome unchecked">One group ({html.esc(groups[0].label)}): nothing to compare it '
                f"with.</p>")
    parts = []
    for pair in found:
        kind = "solved" if any(v.winner for v in pair.measures) else "unchecked"
        items = "".join(f"<li>{html.esc(v.words())}</li>" for v in pair.measures)
        parts.append(f'<p class="outcome {kind}">{html.esc(pair.group)} vs {html.esc(pair.base)}</p><ul>{items}</ul>')
    return "".join(parts) + ('<p class="note">P: the probability that a run of one group does better than a run of '
                             "the other (rliable's probability of improvement; ties count half, so 0.5 is no "
                             "difference), with its 95% bootstrap CI. A group is better when the whole CI lies "
                             "beyond 0.5; else its seeds cannot tell.</p>")


def raw_table(header: Sequence[str], rows: Sequence[Sequence[str]], key_columns: int = 1) -> str:
    """`html.table`'s table from cells that are HTML already (links, an interval on a line of its own), in a box
    that scrolls rather than widen the page."""
    return f'<div class="scroll">{html.table(header, rows, key_columns=key_columns, html_cells=True)}</div>'


def cell(text: str) -> str:
    """A table cell's text, its `[low, high]` interval on a line of its own, in the notes' grey."""
    value, bracket, interval = text.partition(" [")
    return html.esc(value) + (f'<br><span class="note">[{html.esc(interval)}</span>' if bracket else "")


def table_section(rows: Sequence[dict]) -> str:
    body = raw_table(compare_table.TABLE_COLUMNS, [[cell(c) for c in compare_table.cells(row)] for row in rows])
    notes = "".join(f'<p class="note">{html.esc(note)}</p>' for note in compare_table.notes(rows))
    return body + notes


def keys_section(groups: Sequence) -> str:
    header, rows = compare_table.keys_table(groups)
    if not rows:
        return '<p class="note">None: the runs read the same values of every key but the seed.</p>'
    note = ('<p class="note">The keys whose values differ among the runs that read them; <code>not read</code>: the '
            "group's agent or network does not use the key (its value there changes nothing). Floats at 4 "
            "significant digits.</p>")
    return note + f'<div class="scroll">{html.table(header, rows)}</div>'


def run_labels(groups: Sequence) -> list[tuple[str, object]]:
    """(`group, seed N`, run) of every run; the run's folder name is added where a group holds a seed twice."""
    labels = []
    for group in groups:
        seeds = [run.config_value("training.seed") for run in group.runs]
        for run, seed in zip(group.runs, seeds):
            label = f"{group.label}, seed {seed}"
            if seeds.count(seed) > 1:
                label += f" ({os.path.basename(os.path.normpath(run.root))})"
            labels.append((label, run))
    return labels


def runs_section(groups: Sequence, page_dir: str) -> str:
    """A row per run: its link (group and seed), how it ended, its final policy's score and its folder."""
    rows = []
    for label, run in run_labels(groups):
        score = compare_table.final_score(run)
        solved = (f"{run.get('solved_env_steps'):,}" if run.solved and run.get("solved_env_steps") is not None
                  else "not solved" if run.solve_checked else "no check")
        final = "-" if score is None else \
            f"{score.score:.1f} ({score.episodes or '?'} episodes{', held' if score.held else ''})"
        link = (f'<a href="{html.esc(html.rel(run.layout.report, page_dir))}">{html.esc(label)}</a>'
                if os.path.exists(run.layout.report) else html.esc(label))
        rows.append([link, f"<code>{html.esc(html.rel(run.root, page_dir))}</code>", html.esc(solved),
                     html.esc(final)])
    return (raw_table(("run", "folder", "solved at env step", "final policy score"), rows, key_columns=2) +
            '<p class="note">Each run links to its own page. Final policy score: average return over fresh greedy '
            "episodes; held: the run stopped on its solve, and the score is its solve check's.</p>")
