"""The command lines of `python -m dqn_cartpole`: what a child process runs, and what a person is told to type.

Every "continue this" line the program prints (resume a run, a topology, a learner, a sweep, a study)
is built by `continue_command`, so each one is quoted the same way.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Sequence

PROGRAM = ("python", "-m", "dqn_cartpole")


def child_command(argv: Sequence[str]) -> list[str]:
    """`python -m dqn_cartpole ARGV` with this interpreter, for a child process."""
    return [sys.executable, "-m", "dqn_cartpole", *argv]


def continue_command(argv: Sequence[str]) -> str:
    """The shell line a person types to run `python -m dqn_cartpole ARGV` (quoted where a word needs it)."""
    return shlex.join([*PROGRAM, *argv])


def set_flags(overrides: Sequence[str]) -> list[str]:
    """`--set ITEM` for each override, as a command line gives them."""
    return [word for item in overrides for word in ("--set", item)]


def train_argv(config_path: str, overrides: Sequence[str], run_dir: str) -> list[str]:
    """Arguments of a fresh run in a child process (quiet: its console output goes to a log)."""
    return ["train", "--config", config_path, "--output-dir", run_dir, "--quiet", *set_flags(overrides)]


def resume_argv(run_dir: str, *extra: str) -> list[str]:
    """Arguments that continue a stopped run from its newest checkpoint (`extra`: e.g. its topology)."""
    return ["train", "--resume", run_dir, *extra]


def resume_command(run_dir: str, *extra: str) -> str:
    """The line that continues the run in `run_dir`."""
    return continue_command(resume_argv(run_dir, *extra))


def parse_train_argv(argv: Sequence[str]) -> argparse.Namespace:
    """The `train` arguments that `train_argv` and `resume_argv` write, read back (`argv[0]` is "train")."""
    parser = argparse.ArgumentParser(prog="train", add_help=False)
    parser.add_argument("--config")
    parser.add_argument("--output-dir")
    parser.add_argument("--resume")
    parser.add_argument("--set", action="append")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(list(argv)[1:])
