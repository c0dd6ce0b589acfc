"""Command line: `python -m dqn_cartpole COMMAND`, one module of commands per way of running.

Bad input ends in one line on stderr and exit status 2; each command imports TensorFlow only
after its arguments and config have been checked. A run stopped by Ctrl-C or SIGTERM exits with
130 or 143 and prints the command that resumes it; a diverged run or a full disk exits with 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Optional, Sequence

from dqn_cartpole.cli import config_command, experiments, roles, single_process
from dqn_cartpole.cli.args import ArgParser
from dqn_cartpole.console.exit_status import EXIT_FAILED, EXIT_USAGE, for_signal
from dqn_cartpole.errors import UserError

COMMAND_MODULES = (single_process, config_command, roles, experiments)
COMMANDS = {name: handler for module in COMMAND_MODULES for name, handler in module.COMMANDS.items()}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgParser(prog="dqn-cartpole", description="Train, watch and understand a DQN on CartPole.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgParser)
    sub.required = True
    for module in COMMAND_MODULES:
        module.add_parsers(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of `python -m dqn_cartpole` and the `dqn-cartpole` script."""
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # the disk, permissions, a vanished folder: one line, not a traceback
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return for_signal(signal.SIGINT)
