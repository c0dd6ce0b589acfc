"""Train, watch and understand a Deep Q-Network on CartPole with TF-Agents and Reverb.

From Python (a notebook), as from the command line (docs/python-api.md):

    import dqn_cartpole as dq

    config = dq.load_config("tutorial", {"training.num_iterations": 5000})
    run = dq.train(config)          # a Run: its folder, summary, metrics, policy; shows itself in Jupyter
    run.evaluate(episodes=10)

The API's names are imported when first used, so `python -m dqn_cartpole` starts as fast as without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dqn_cartpole.console.quiet import filter_kernel_stderr
from dqn_cartpole.errors import ConfigError, UserError

filter_kernel_stderr()  # in a Jupyter kernel only: TensorFlow's and Reverb's C++ noise, as the commands filter it

__version__ = "0.1.0"

# name -> the module that defines it (imported on first use: see __getattr__)
_LAZY = {"load_config": "dqn_cartpole.api.configs", "train": "dqn_cartpole.api.training",
         "Run": "dqn_cartpole.api.run", "RunFailed": "dqn_cartpole.api.run", "Evaluation": "dqn_cartpole.api.run",
         "sweep": "dqn_cartpole.api.experiments", "compare": "dqn_cartpole.api.experiments",
         "Comparison": "dqn_cartpole.api.experiments", "Config": "dqn_cartpole.config"}
__all__ = ["__version__", "UserError", "ConfigError", *_LAZY]

if TYPE_CHECKING:  # what type checkers and IDEs see
    from dqn_cartpole.api import Comparison, Evaluation, Run, RunFailed, compare, load_config, sweep, train
    from dqn_cartpole.config import Config


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once
        return value
    raise AttributeError(f"module 'dqn_cartpole' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
