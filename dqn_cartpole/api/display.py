"""How a run shows itself in a notebook (`Run._repr_html_`): the outcome, the returns plot and the trained agent's
video, read from the run folder's own files and embedded as data URIs, so the saved notebook shows them in any
viewer, also once the run folder is gone or was never on the viewer's machine.

Embedding costs the notebook its size: a file larger than `MAX_EMBED_BYTES` is named, not embedded (a default
run's video is about 0.1-1 MB; the smoke run's about 60 kB).
"""

from __future__ import annotations

import base64
import os
from typing import Optional

from dqn_cartpole.report import html
from dqn_cartpole.report.facts import run_facts
from dqn_cartpole.report.run_page import fmt, outcome_line
from dqn_cartpole.run_folder import RunRecord

MAX_EMBED_BYTES = 8 * 2**20  # per file; base64 makes it a third larger in the .ipynb
STYLE = "font-family: system-ui, sans-serif; line-height: 1.4; max-width: 1250px"
# the outcome's colour by its kind (`outcome_line`): green solved, orange not (or unfinished), grey not checked
OUTCOME_STYLE = {"solved": "color: #1a7f37; font-weight: 600", "unsolved": "color: #b35900; font-weight: 600",
                 "unfinished": "color: #b35900; font-weight: 600", "unchecked": "color: #444; font-weight: 600"}


def data_uri(path: str, mime: str) -> Optional[str]:
    """The file as a `data:` URI; None when it is missing or larger than `MAX_EMBED_BYTES`."""
    if not os.path.isfile(path) or os.path.getsize(path) > MAX_EMBED_BYTES:
        return None
    with open(path, "rb") as handle:
        return f"data:{mime};base64,{base64.b64encode(handle.read()).decode('ascii')}"


def missing(path: str, what: str) -> str:
    """A note in place of a file that is not embedded: why, and where it is."""
    if not os.path.isfile(path):
        return f'<p style="color: #555">No {html.esc(what)} ({html.esc(path)} does not exist).</p>'
    size = os.path.getsize(path) / 2**20
    return (f'<p style="color: #555">The {html.esc(what)} is {size:.1f} MB, too large to embed: open '
            f'{html.esc(path)}.</p>')


def facts_line(record: RunRecord) -> str:
    parts = [("best average return", fmt(record.get("best_return"))),
             ("final average return", fmt(record.get("final_return"))),
             ("iterations", fmt(record.get("iterations"), 0)), ("env steps", fmt(record.get("env_steps"), 0)),
             ("wall time", f"{fmt(record.get('wall_s'))} s")]
    return " &middot; ".join(f'<span style="color: #666">{name}</span> {html.esc(value)}' for name, value in parts)


def run_html(record: RunRecord) -> str:
    """The outcome, the facts, the returns plot and the trained agent's video, as one HTML fragment."""
    layout = record.layout
    text, kind = outcome_line(record, run_facts(record))
    parts = [f'<p><code>{html.esc(record.root)}</code></p>',
             f'<p style="{OUTCOME_STYLE[kind]}">{html.esc(text)}</p>']
    if record.finished:
        parts.append(f"<p>{facts_line(record)}</p>")
    plot = data_uri(layout.returns_plot, "image/png")
    parts.append(f'<img src="{plot}" alt="average return" style="max-width: 100%">' if plot
                 else missing(layout.returns_plot, "returns plot"))
    video = data_uri(layout.trained_video, "video/mp4")
    parts.append(f'<p><b>The trained agent</b> (greedy)</p><video controls loop src="{video}" '
                 f'style="width: 600px; max-width: 100%; background: #222"></video>' if video
                 else missing(layout.trained_video, "trained agent's video"))
    return f'<div style="{STYLE}">' + "".join(parts) + "</div>"
