"""Every command in the README and docs/*.md pastes: each shell block passes `bash -n`, each `python -m dqn_cartpole`
line parses with the real argument parser (its --config files exist, its --set keys are config keys), each Python
block compiles, the Python API page's examples run as written (in this process, in a fresh folder), every relative
link points at a file, the README stays a front page, and the pages build as a site (mkdocs, strict)."""

from __future__ import annotations

import ast
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

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
    out = capsys.readouterr().out
    assert "greedy episodes: mean" in out and "did you mean 'agent.learning_rate'?" in out
    assert namespace["run"].summary["iterations"] == 300 and namespace["run"].summary["resumed_from"]
    assert os.path.isfile(tmp_path / "outputs" / "api" / "compare" / "returns.png")


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
    assert lines[4:6] == ["```bash", "make train   # creates .venv if missing, installs the pinned dependencies, "
                                     "runs: python -m dqn_cartpole train"] or "make train" in "\n".join(lines[:12])


def test_the_docs_build_as_a_site_in_strict_mode(tmp_path):
    """`make docs`'s build (mkdocs.yml), with --strict: a link to a missing page or anchor, or a page in docs/ that the
    navigation leaves out, fails it. Every page of docs/ is in the site's navigation."""
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pages = {os.path.splitext(os.path.basename(page))[0] for page in glob.glob(os.path.join(REPO, "docs", "*.md"))}
    built = {name for name in pages if (site / ("" if name == "index" else name) / "index.html").is_file()}
    assert built == pages and (site / "search" / "search_index.json").is_file()
