"""mkdocs hooks (mkdocs.yml `hooks:`): what the site needs to work opened as files, offline.

After each build, next to what the search plugin wrote: search/search_index.js, the index as a script (a page opened
from file:// may load a script but not fetch JSON; docs_theme/search/main.js reads it), and css/pygments.css, the
colours of the code blocks, which the codehilite extension marks up at build time with Pygments (the theme's
highlight.js would come from a CDN at view time).
"""

from __future__ import annotations

import json
import os

from mkdocs.plugins import event_priority

INDEX_JSON = os.path.join("search", "search_index.json")
INDEX_SCRIPT = os.path.join("search", "search_index.js")
CODE_CSS = os.path.join("css", "pygments.css")
CODE_CLASS = ".highlight"  # mkdocs.yml's codehilite css_class, which the readthedocs theme's CSS frames too


@event_priority(-100)  # after the search plugin's own on_post_build, which writes search_index.json
def on_post_build(config, **_) -> None:
    site = config["site_dir"]
    write_index_script(site)
    write_code_css(site)


def write_index_script(site: str) -> None:
    path = os.path.join(site, INDEX_JSON)
    if not os.path.isfile(path):
        return  # no search plugin
    with open(path, encoding="utf-8") as handle:
        index = json.load(handle)
    with open(os.path.join(site, INDEX_SCRIPT), "w", encoding="utf-8") as handle:
        handle.write(f"window.mkdocs_search_index = {json.dumps(index)};\n")


def write_code_css(site: str) -> None:
    try:
        from pygments.formatters import HtmlFormatter  # pylint: disable=import-outside-toplevel
    except ImportError:  # the code blocks stay plain
        return
    os.makedirs(os.path.join(site, "css"), exist_ok=True)
    with open(os.path.join(site, CODE_CSS), "w", encoding="utf-8") as handle:
        handle.write(HtmlFormatter(style="default").get_style_defs(CODE_CLASS) + "\n")
