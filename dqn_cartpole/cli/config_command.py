"""The `config` command: every key with its type, default and description, and the resolved config, without running.

Needs neither TensorFlow nor a run: it loads and checks the config exactly as `train` does.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Any

from dqn_cartpole.cli.args import add_config_args, config_overrides, print_preset_note
from dqn_cartpole.cli.shortcuts import add_track_arg
from dqn_cartpole.config import locate_config


def add_parsers(sub: Any) -> None:
    """Adds `config` to `sub` (argparse subparsers)."""
    config = sub.add_parser("config", help="print the resolved config with every key's type, default and meaning",
                            description="Load and check the config as train would (--config, --set and the "
                                        "shortcuts), then print it as YAML: each key with its type, its "
                                        "description and its default, and the keys this config changes marked. "
                                        "Nothing runs; the output is a valid --config file.")
    add_config_args(config, shortcuts=True)
    add_track_arg(config)
    shown = config.add_mutually_exclusive_group()
    shown.add_argument("--plain", action="store_true", help="the resolved YAML only, as a run's config.yaml")
    shown.add_argument("--reference", action="store_true",
                       help="every key as a Markdown reference (docs/configuration-reference.md)")


def cmd_config(args: argparse.Namespace) -> int:
    import dqn_cartpole.config_docs as config_docs
    from dqn_cartpole.config import dump_yaml, load

    if args.reference:
        print(config_docs.reference_markdown(), end="")
        return 0
    path = locate_config(args.config)
    with contextlib.redirect_stderr(io.StringIO()):  # gymnasium's import-time notices
        loaded = load(path, config_overrides(args))
    print_preset_note(path, loaded.config)  # on stderr: stdout stays a config file
    # Changed means written with another value than the default: what the user wrote, not what `auto` became.
    print(dump_yaml(loaded.config) if args.plain else config_docs.annotated_yaml(loaded.config, loaded.written),
          end="")
    return 0


COMMANDS = {"config": cmd_config}
