"""The command line: `python -m dqn_cartpole COMMAND`."""

from dqn_cartpole.cli.main import main

__all__ = ["main"]
