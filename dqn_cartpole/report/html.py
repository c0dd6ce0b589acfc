"""A self-contained HTML page: inline CSS, relative links only, nothing loaded from the network.

`write_page(out_path, title, sections)` is the generic builder; the `images`, `videos`, `table`,
`csv_table` and `link_list` helpers make the usual section bodies. `render_collection_page` is the
shortcut for a folder of results (a comparison or a sweep: plots, a CSV table, links). Every path
given to a helper is made relative to the page's folder, so a copied or zipped folder still works.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.csv_files import read_csv

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1300px;
       padding: 1rem 1.5rem 3rem; color: #1d1d1f; background: #fff; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { font-size: 1.2rem; margin-top: 2rem;
  border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
.outcome { font-size: 1.15rem; font-weight: 600; margin: .4rem 0; }
.solved { color: #1a7f37; } .unsolved, .unfinished { color: #b35900; } .unchecked { color: #444; }
.facts { display: flex; flex-wrap: wrap; gap: .5rem 2rem; margin: .5rem 0; }
.facts div span { color: #666; margin-right: .4rem; }
.figures { display: flex; flex-wrap: wrap; gap: 1rem; }
.figures figure { margin: 0; } .figures img { max-width: 100%; border: 1px solid #eee; }
.figures.wide img { width: 1200px; } .figures.half img { width: 600px; }
figcaption { font-size: .9rem; color: #555; max-width: 600px; }
.videos { display: flex; flex-wrap: wrap; gap: 1rem; } .videos figure { margin: 0; }
.videos video { width: 600px; max-width: 100%;
  background: #222; }
table { border-collapse: collapse; font-size: .9rem; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ddd; padding: .2rem .55rem; text-align: right; }
th { background: #f5f5f7; } td.key, th.key { text-align: left; }
tr.changed td { background: #fff4ce; font-weight: 600; }
code { background: #f5f5f7; padding: .05rem .3rem; border-radius: 3px; }
.note { color: #555; font-size: .9rem; }
.scroll { overflow-x: auto; max-width: 100%; }
"""


@dataclass(frozen=True)
class Section:
    """One `<section>` of a page: a heading and its HTML body (already escaped)."""

    heading: str
    body: str


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def rel(path: str, page_dir: str) -> str:
    """`path` relative to the page's folder, with forward slashes (a URL path)."""
    return os.path.relpath(path, page_dir).replace(os.sep, "/")


def images(paths: Sequence[str], page_dir: str, captions: Optional[Sequence[str]] = None, wide: bool = False) -> str:
    """Images (that exist) with optional captions, side by side where they fit."""
    figures = []
    for i, path in enumerate(paths):
        if not os.path.exists(path):
            continue
        note = f"<figcaption>{esc(captions[i])}</figcaption>" if captions and captions[i] else ""
        figures.append(f'<figure><img src="{esc(rel(path, page_dir))}" alt="{esc(os.path.basename(path))}">'
                       f"{note}</figure>")
    if not figures:
        return '<p class="note">No plots yet.</p>'
    return f'<div class="figures {"wide" if wide else "half"}">{"".join(figures)}</div>'


def videos(items: Sequence[tuple[str, Sequence[str]]], page_dir: str) -> str:
    """`<video controls>` players side by side; each item is (caption, [files of the same video, best first])."""
    players = []
    for caption, files in items:
        sources = [f for f in files if os.path.exists(f)]
        if not sources:
            continue
        tags = "".join(f'<source src="{esc(rel(f, page_dir))}" type="{_video_type(f)}">' for f in sources)
        players.append(f"<figure><video controls muted preload=\"auto\">{tags}</video>"
                       f"<figcaption>{esc(caption)}</figcaption></figure>")
    return f'<div class="videos">{"".join(players)}</div>' if players else '<p class="note">No videos.</p>'


def _video_type(path: str) -> str:
    return {".webm": "video/webm"}.get(os.path.splitext(path)[1], "video/mp4")


def table(header: Sequence[str], rows: Iterable[Sequence[object]], highlight: Optional[Sequence[bool]] = None,
          key_columns: int = 1, html_cells: bool = False) -> str:
    """A table; the first `key_columns` columns are left-aligned; rows flagged in `highlight` are marked;
    `html_cells`: the cells are HTML already (links, a line break), not text to escape."""
    def cls(i: int) -> str:
        return ' class="key"' if i < key_columns else ""

    head = "".join(f"<th{cls(i)}>{esc(h)}</th>" for i, h in enumerate(header))
    body = []
    for n, row in enumerate(rows):
        marked = ' class="changed"' if highlight and highlight[n] else ""
        cells = "".join(f"<td{cls(i)}>{c if html_cells else esc(c)}</td>" for i, c in enumerate(row))
        body.append(f"<tr{marked}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def csv_table(path: str, columns: Optional[Sequence[str]] = None) -> str:
    """A CSV file as a table (all columns, or `columns` in that order)."""
    if not os.path.exists(path):
        return f'<p class="note">{esc(os.path.basename(path))} is missing.</p>'
    rows = read_csv(path)
    if not rows:
        return f'<p class="note">{esc(os.path.basename(path))} has no rows yet.</p>'
    columns = [c for c in (columns or rows[0].keys()) if c in rows[0]]
    return table(columns, ([row.get(c, "") for c in columns] for row in rows), key_columns=0)


def link_list(links: Sequence[tuple[str, str]], page_dir: str) -> str:
    """A list of (label, path) links to files or folders (that exist) next to the page."""
    items = [f'<li><a href="{esc(rel(path, page_dir))}">{esc(label)}</a> '
             f"<code>{esc(rel(path, page_dir))}</code></li>" for label, path in links if os.path.exists(path)]
    return f"<ul>{''.join(items)}</ul>" if items else '<p class="note">Nothing to link yet.</p>'


def render(title: str, sections: Sequence[Section], intro: str = "") -> str:
    """The whole page as text."""
    parts = [f"<section><h2>{esc(s.heading)}</h2>{s.body}</section>" for s in sections]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
            f"<body><h1>{esc(title)}</h1>{intro}\n" + "\n".join(parts) + "\n</body></html>\n")


def write_page(out_path: str, title: str, sections: Sequence[Section], intro: str = "") -> str:
    """Writes a page atomically; `intro` is HTML under the title. Returns `out_path`."""
    write_text_atomic(out_path, render(title, sections, intro))
    return out_path


def render_collection_page(out_path: str, title: str, image_paths: Sequence[str], table_csv: Optional[str] = None,
                           links: Sequence[tuple[str, str]] = ()) -> str:
    """A page for a folder of results (e.g. compare/sweep: returns.png, table.csv, the runs it covers)."""
    page_dir = os.path.dirname(os.path.abspath(out_path))
    sections = [Section("Plots", images(image_paths, page_dir, wide=True))]
    if table_csv:
        sections.append(Section("Table", csv_table(table_csv)))
    if links:
        sections.append(Section("Links", link_list(links, page_dir)))
    return write_page(out_path, title, sections)
