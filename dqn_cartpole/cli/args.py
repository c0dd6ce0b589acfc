"""What every command's arguments share: a parser whose errors are one line, the config flags."""

from __future__ import annotations

import argparse
import os
from typing import Optional

from dqn_cartpole.errors import UserError

REPO_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
DEFAULT_CONFIG = os.path.join(REPO_CONFIGS, "default.yaml")


class ArgParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see --help)")


def add_config_args(parser: argparse.ArgumentParser, example: str = "agent.learning_rate=5e-4") -> None:
    """`--config PATH` and repeatable `--set SECTION.KEY=VALUE` (into `overrides`)."""
    parser.add_argument("--config", metavar="PATH", help="YAML config (default: configs/default.yaml)")
    parser.add_argument("--set", metavar="SECTION.KEY=VALUE", action="append", default=[], dest="overrides",
                        help=f"override one config key, e.g. --set {example} (repeatable)")


def config_path(given: Optional[str]) -> Optional[str]:
    """`--config`, else the repo's configs/default.yaml (when installed from a clone), else the defaults."""
    return given or (DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else None)


def check_positive(label: str, value: Optional[int]) -> None:
    if value is not None and value <= 0:
        raise UserError(f"{label}: must be positive, got {value}")
