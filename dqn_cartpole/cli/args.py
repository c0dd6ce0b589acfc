"""What every command's arguments share: a parser whose errors are one line, the config flags and shortcuts."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from typing import Optional

from dqn_cartpole.cli.shortcuts import add_shortcut_args, shortcut_overrides
from dqn_cartpole.config import MAX_SEED, Config, default_config_path, preset_for
from dqn_cartpole.errors import UserError


class ArgParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2, and a misspelled choice (a command, --topology,
    --objective) gets the nearest valid one."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {suggest_choice(message)} (see --help)")


def suggest_choice(message: str) -> str:
    """argparse's "invalid choice: 'trian' (choose from 'train', ...)" with "did you mean 'train'?" added."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not found:
        return message
    given, options = found.group(1), re.findall(r"'([^']*)'", found.group(2))
    match = difflib.get_close_matches(given, options, n=1, cutoff=0.6)
    return message if not match else message.replace(f"'{given}' (", f"'{given}': did you mean '{match[0]}'? (", 1)


def add_config_args(parser: argparse.ArgumentParser, example: str = "agent.learning_rate=5e-4",
                    shortcuts: bool = False) -> None:
    """`--config PATH`, repeatable `--set SECTION.KEY=VALUE` (into `overrides`) and, with `shortcuts`,
    `--env ID`, `--seed N` and `-n/--iterations N` (read them all with `config_overrides`)."""
    parser.add_argument("--config", metavar="PATH",
                        help="YAML config, or the name of a shipped one (default, tutorial, smoke, acrobot, "
                             "mountaincar, lunarlander); keys it does not name come from configs/default.yaml (the "
                             "default)")
    parser.add_argument("--set", metavar="SECTION.KEY=VALUE", action="append", default=[], dest="overrides",
                        help=f"override one config key, e.g. --set {example} (repeatable)")
    if shortcuts:
        add_shortcut_args(parser)


def config_overrides(args: argparse.Namespace) -> list:
    """The shortcuts given (as `Flagged` overrides, so an error names the flag), then every `--set`, in order: a
    later `--set` wins."""
    return shortcut_overrides(args, flagged=True) + list(args.overrides)


def print_preset_note(config_file: str, config: Config) -> None:
    """On stderr, one line when the default config (CartPole's hyperparameters) is about to train an env that has a
    shipped preset: which one, and how to use it. Nothing otherwise (another config file, or no preset fits)."""
    if os.path.realpath(config_file) != os.path.realpath(default_config_path()):
        return
    name = preset_for(config.env.id)
    if name is not None:
        print(f"note: {config.env.id} has a preset tuned for it: add --config {name} (configs/{name}.yaml) to use "
              f"it; without it, configs/default.yaml's hyperparameters, tuned for {Config().env.id}, are used",
              file=sys.stderr)


def check_positive(label: str, value: Optional[int]) -> None:
    if value is not None and value <= 0:
        raise UserError(f"{label}: must be positive, got {value}")


def check_seed(label: str, value: Optional[int]) -> None:
    if value is not None and not 0 <= value <= MAX_SEED:
        raise UserError(f"{label} {value}: must be in [0, {MAX_SEED}]")
