"""Every command in the README and docs/*.md pastes: each shell block passes `bash -n`, each `python -m dqn_cartpole`
line parses with the real argument parser (its --config files exist, its --set keys are config keys), each Python
block compiles, the Python API page's examples run as written (in this process, in a fresh folder), every relative
link points at a file, the README stays a front page, and the pages build as a site (mkdocs, strict) that works
opened as files, offline: its links, its search and its code's colours."""

from __future__ import annotations

import ast
import glob
import os
import re
import shlex
import subprocess
import sys
import urllib.parse

import pytest

from browser import find_chromium, run_chromium
from helpers import REPO

from dqn_cartpole.cli.main import build_parser
from dqn_cartpole.config import SECTIONS, Config, apply_override, locate_config
from dqn_cartpole.errors import UserError

PAGES = sorted([os.path.join(REPO, "README.md")] + glob.glob(os.path.join(REPO, "docs", "*.md")))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SHELL = ("bash", "sh", "shell")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
README_MAX_LINES = 150


def blocks(page: str) -> list[tuple[str, str]]:
    with open(page, encoding="utf-8") as handle:
        return [(match.group(1), match.group(2)) for match in FENCE.finditer(handle.read())]


def commands(block: str) -> list[str]:
    """The `python -m dqn_cartpole ...` commands of a shell block: continuations joined, one per pipeline part."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        for part in re.split(r"\s[|&]\s|\s&$|&&", line):
            words = shlex.split(part, comments=True)
            if words[:3] == ["python", "-m", "dqn_cartpole"]:
                found.append(part.strip())
    return found


def argv_of(command: str) -> list[str]:
    """The arguments after `python -m dqn_cartpole`; synopsis brackets ([--seed N]) are read as if given, and a
    bare `...` after a value is dropped."""
    tokens = shlex.split(command, comments=True)
    tokens = tokens[tokens.index("dqn_cartpole") + 1:]
    argv = []
    for token in tokens:
        token = synopsis_token(token)
        if token in ("", "..."):
            if token == "..." and argv and argv[-1].startswith("-"):
                argv.append("X")  # [--config ...]: some value
            continue
        argv.append("1" if re.fullmatch(r"[A-Z]", token) and argv and argv[-1].startswith("-") else token)
    return argv


def synopsis_token(token: str) -> str:
    """A token without the brackets of synopsis notation: `[--seed`, `N]`, `[--quiet]`; a value's own brackets,
    as in `network.fc_layer_params=[64,64]`, are kept."""
    if token.startswith("[-") and token.endswith("]") and token.count("[") == token.count("]"):
        return token[1:-1]
    if token.startswith("[") and token.count("[") > token.count("]"):
        token = token[1:]
    if token.endswith("]") and token.count("]") > token.count("["):
        token = token[:-1]
    return token


def check_values(args) -> None:
    """The shipped configs it names exist; every concrete --set (section.key=value) applies to the config."""
    config = getattr(args, "config", None)
    if config and config.startswith("configs/"):
        locate_config(config)
    for item in getattr(args, "overrides", None) or []:
        if item.split(".", 1)[0] in SECTIONS:
            apply_override(Config(), item)
    space = getattr(args, "space", None)
    if space and space.startswith("configs/"):
        assert os.path.isfile(os.path.join(REPO, space)), space


SHELL_BLOCKS = [(os.path.relpath(page, REPO), i, text) for page in PAGES
                for i, (lang, text) in enumerate(blocks(page)) if lang in SHELL]
COMMANDS = [(where, command) for where, _, text in SHELL_BLOCKS for command in commands(text)]


def test_the_docs_have_commands_to_check():
    assert len(SHELL_BLOCKS) >= 12 and len(COMMANDS) >= 50  # README and docs/*.md: every page that shows commands


@pytest.mark.parametrize("where, index, text", SHELL_BLOCKS, ids=[f"{w}#{i}" for w, i, _ in SHELL_BLOCKS])
def test_every_shell_block_is_valid_bash(where, index, text):
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, f"{where}, block {index}: {proc.stderr}"


def test_every_command_parses_with_the_real_parser():
    parser, problems = build_parser(), []
    for where, command in COMMANDS:
        try:
            check_values(parser.parse_args(argv_of(command)))
        except (UserError, SystemExit) as exc:
            problems.append(f"{where}: {command}\n    {exc}")
    assert not problems, "\n".join(problems)


def test_the_parser_check_catches_a_broken_command():
    parser = build_parser()
    for broken in ("python -m dqn_cartpole train --learning-rate 5e-4",
                   "python -m dqn_cartpole train --set agent.learning_rat=5e-4",
                   "python -m dqn_cartpole train --config configs/nope.yaml"):
        with pytest.raises(UserError):
            check_values(parser.parse_args(argv_of(broken)))


def test_every_python_block_compiles():
    for page in PAGES:
        for lang, text in blocks(page):
            if lang == "python":
                ast.parse(text, filename=page)


API_PAGE = os.path.join(REPO, "docs", "python-api.md")
# Examples of the API page that are only compiled: a sweep trains its runs as processes (minutes), and the page says so.
COMPILED_ONLY = ("dq.sweep(",)


def test_the_python_api_pages_examples_run_as_written(tmp_path, monkeypatch, capsys):
    """The page's Python blocks, in order, in one namespace (as a notebook's cells): they train, evaluate, resume and
    compare on the short smoke config, in a fresh folder."""
    examples = [text for lang, text in blocks(API_PAGE) if lang == "python"]
    run_now = [text for text in examples if not any(marker in text for marker in COMPILED_ONLY)]
    assert len(examples) - len(run_now) == 1 and len(run_now) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for text in run_now:
        exec(compile(text, API_PAGE, "exec"), namespace)  # pylint: disable=exec-used
    out, err = capsys.readouterr()
    assert "greedy episodes: mean" in out and "did you mean 'agent.learning_rate'?" in out
    assert "much worse" not in out + err  # its best, at iteration 0 over 3 episodes, was the untrained network's
    assert namespace["run"].summary["iterations"] == 300 and namespace["run"].summary["resumed_from"]
    assert os.path.isfile(tmp_path / "outputs" / "api" / "compare" / "returns.png")


# The API page's signatures: its headings (`### `dq.train(...) -> dq.Run``) and its list of a Run's methods.
SIGNATURE = re.compile(r"^(?:### |- )`((?:dq|run)\.[\w.]+)\(([^`]*?)\)\s*(?:->[^`]*)?`", re.M)
REQUIRED = "(required)"


def documented_parameters(params: str) -> list[tuple]:
    """(name, keyword-only, default or REQUIRED) of a signature as the page writes it (`a, b=None, *, c=1`)."""
    args = ast.parse(f"def f({params}): pass").body[0].args
    positional = [(a.arg, False) for a in args.args]
    defaults = [REQUIRED] * (len(args.args) - len(args.defaults)) + [ast.literal_eval(d) for d in args.defaults]
    keyword = [(a.arg, True) for a in args.kwonlyargs]
    keyword_defaults = [REQUIRED if d is None else ast.literal_eval(d) for d in args.kw_defaults]
    return [(*p, d) for p, d in zip(positional + keyword, defaults + keyword_defaults)]


def actual_parameters(function) -> list[tuple]:
    import inspect

    return [(p.name, p.kind == p.KEYWORD_ONLY, REQUIRED if p.default is p.empty else p.default)
            for p in inspect.signature(function).parameters.values() if p.name != "self"]


def test_the_python_api_pages_signatures_are_the_functions_own():
    """Every function and Run method the page lists, with its parameters as the code has them (names, order,
    keyword-only, defaults): `track=` was missing from three."""
    import dqn_cartpole as dq

    with open(API_PAGE, encoding="utf-8") as handle:
        listed = SIGNATURE.findall(handle.read())
    assert len(listed) >= 9, listed
    wrong = []
    for name, params in listed:
        owner, *path = name.split(".")
        function = dq if owner == "dq" else dq.Run
        for part in path:
            function = getattr(function, part)
        if documented_parameters(params) != actual_parameters(function):
            wrong.append(f"{name}({params}): the code has {actual_parameters(function)}")
    assert not wrong, "\n".join(wrong)


def test_every_relative_link_points_at_a_file():
    missing = []
    for page in PAGES:
        with open(page, encoding="utf-8") as handle:
            text = handle.read()
        for target in LINK.findall(text):
            if "://" not in target and not target.startswith("mailto:"):
                if not os.path.exists(os.path.join(os.path.dirname(page), target)):
                    missing.append(f"{os.path.relpath(page, REPO)}: {target}")
    assert not missing, missing


def test_the_readme_is_a_front_page():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert len(lines) <= README_MAX_LINES
    assert lines[4:7] == ["```bash", "make train   # creates .venv if missing, installs uv.lock into it, runs: python -m "
                                     "dqn_cartpole train", "make test    # the same set-up, then runs the test suite "
                                     "(python -m pytest)"]


def test_ci_runs_the_readmes_test_command():
    """.ci/run calls the README's test command (`make test`, set-up included), so tests and README never drift."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as handle:
        command = handle.read().splitlines()[6].split("#")[0].strip()
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as handle:
        assert command == "make test" and command in [line.strip() for line in handle]


SHIPPED = sorted(os.path.splitext(os.path.basename(path))[0] for path in glob.glob(os.path.join(REPO, "configs", "*.yaml")))
PRESETS = [name for name in SHIPPED if name not in ("default", "tutorial", "smoke")]


def table_rows(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [line for line in handle.read().splitlines() if line.startswith("| ")]


def test_every_shipped_config_is_listed_wherever_the_configs_are():
    """configs/*.yaml, each one (Rainbow was missing everywhere but agents.md): in configuration.md's table of config
    files, and each preset in README's table of where to go, on the presets page (whose menu title names them all),
    and the agents' presets in the agents page's menu title."""
    import yaml

    files = "\n".join(table_rows(os.path.join(REPO, "docs", "configuration.md")))
    assert [name for name in SHIPPED if f"| `configs/{name}.yaml` |" not in files] == []
    readme = "\n".join(table_rows(os.path.join(REPO, "README.md"))).lower()
    with open(os.path.join(REPO, "docs", "presets.md"), encoding="utf-8") as handle:
        presets = handle.read()
    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as handle:
        titles = {page: title for section in yaml.safe_load(handle)["nav"] for entry in section.values()
                  for item in (entry if isinstance(entry, list) else [{"": entry}]) for title, page in item.items()}
    assert [name for name in PRESETS if name not in readme] == []
    assert [name for name in PRESETS if f"configs/{name}.yaml" not in presets] == []
    assert [name for name in PRESETS if name not in titles["presets.md"].lower().replace(" ", "")] == []
    assert "C51" in titles["agents.md"] and "Rainbow" in titles["agents.md"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """`make docs`'s build (mkdocs.yml), with --strict, once for this file's checks of the site: its folder."""
    site = str(tmp_path_factory.mktemp("docs") / "site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return site


def test_the_docs_build_as_a_site_in_strict_mode(site):
    """A link to a missing page or anchor, or a page in docs/ that the navigation leaves out, fails the build. Every
    page of docs/ is in the site, as a file of its own (not a folder's index.html: see the next tests)."""
    pages = {os.path.splitext(os.path.basename(page))[0] for page in glob.glob(os.path.join(REPO, "docs", "*.md"))}
    built = {name for name in pages if os.path.isfile(os.path.join(site, f"{name}.html"))}
    assert built == pages and os.path.isfile(os.path.join(site, "search", "search_index.js"))


SRC_OR_STYLESHEET = re.compile(r'<(?:script|img)\b[^>]*\ssrc="([^"]*)"|<link\b[^>]*\shref="([^"]*)"')


def test_the_site_loads_nothing_from_the_network_and_colours_its_code_itself(site):
    """Offline, every page has all it loads: no script, style sheet or image from elsewhere (the theme's highlight.js
    came from a CDN); the code blocks are coloured at build time (Pygments' classes, and their colours in
    css/pygments.css)."""
    remote = []
    for page in glob.glob(os.path.join(site, "*.html")):
        if os.path.basename(page) == "404.html":
            continue  # a web server's page for a missing one (its links start at the server's root)
        with open(page, encoding="utf-8") as handle:
            for found in SRC_OR_STYLESHEET.finditer(handle.read()):
                url = found.group(1) or found.group(2)
                if "//" in url or not os.path.isfile(os.path.join(site, url.split("?")[0])):
                    remote.append(f"{os.path.basename(page)}: {url}")
    assert not remote, remote
    with open(os.path.join(site, "python-api.html"), encoding="utf-8") as handle:
        assert '<span class="kn">import</span>' in handle.read()
    with open(os.path.join(site, "css", "pygments.css"), encoding="utf-8") as handle:
        assert ".highlight .kn {" in handle.read()


def page_dom(browser: str, url: str, profile: str) -> str:
    """The DOM of `url` once its scripts ran, in headless Chromium with every host name unresolvable (offline)."""
    dom, _ = run_chromium(browser, ["--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=10000",
                                    "--dump-dom", url], profile)
    return dom


@pytest.mark.skipif(find_chromium() is None, reason="no chromium or chromium-browser on PATH")
def test_the_site_opened_as_files_follows_its_links_and_searches(site, tmp_path):
    """site/index.html opened from file://, offline, as a new user does after `make docs`: a guide's link in the
    home page opens that guide (it used to open a folder listing), and the search page finds Rainbow (it used to
    stay at "Searching...": a browser refuses a file:// page its Web Worker and its fetch of the index)."""
    browser, profile, home = find_chromium(), str(tmp_path / "profile"), os.path.join(site, "index.html")
    link = re.search(r'<a class="reference internal" href="([^"]+)">Changing hyperparameters</a>',
                     page_dom(browser, f"file://{home}", profile))
    assert link, "the home page's navigation has no link to the configuration guide"
    guide = page_dom(browser, urllib.parse.urljoin(f"file://{home}", link.group(1)), profile)
    assert "<h1" in guide and "Index of" not in guide and "--set" in guide
    found = page_dom(browser, f"file://{os.path.join(site, 'search.html')}?q=rainbow", profile)
    results = found.split('id="mkdocs-search-results"', 1)[1]
    assert "Searching..." not in results
    hits = set(re.findall(r'<h3><a href="\./([a-z-]+)\.html', results))
    assert {"agents", "presets", "configuration"} <= hits, hits
