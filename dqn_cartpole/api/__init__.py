"""The Python API: the command line's train, evaluate, record, report, sweep and compare, from a notebook.

`dqn_cartpole` re-exports these names (importing them only when first used, so `python -m dqn_cartpole` starts as
fast as before); see docs/python-api.md.
"""

from dqn_cartpole.api.configs import load_config
from dqn_cartpole.api.experiments import Comparison, compare, sweep
from dqn_cartpole.api.run import Evaluation, Run, RunFailed
from dqn_cartpole.api.training import train

__all__ = ["Comparison", "Evaluation", "Run", "RunFailed", "compare", "load_config", "sweep", "train"]
