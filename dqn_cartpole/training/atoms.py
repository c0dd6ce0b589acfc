"""At a run's end, a distributional agent's return distribution at a few of the Q probe's fixed states, under the
weights of policy/final (else policy/best), into `atoms.json` for the report's atoms figure. The numbers come from
the agent's own network through `ValueAgent.return_distribution`; an agent without atoms (DQN) writes nothing.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dqn_cartpole.config import Config
from dqn_cartpole.core.q_probe import QProbe
from dqn_cartpole.run_folder import export
from dqn_cartpole.run_folder.atoms import Atoms, write_atoms
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.policy_files import read_info
from dqn_cartpole.training.triggers import swapped_in


def write_policy_atoms(agent: Any, config: Config, layout: RunLayout) -> dict[str, str]:
    """Writes `atoms.json` for a distributional agent that has a saved policy; returns {"atoms": path}, else {}."""
    indices = QProbe.atom_state_indices()
    states = QProbe.states_of(config.env.id, config.training.seed, config.env.max_episode_steps)[indices]
    if agent.return_distribution(states) is None:  # the live weights: only to ask whether it has atoms
        return {}
    saved = [(name, path) for name, path in (("final", layout.final_policy), ("best", layout.best_policy))
             if os.path.isdir(path)]
    if not saved:
        return {}
    which, path = saved[0]
    weights = export.saved_weights(path)
    variables = agent.policy.variables()
    if [tuple(v.shape) for v in variables] != [np.shape(w) for w in weights]:
        raise ValueError(f"{path}: its weights do not fit this run's network")
    step = agent.train_step_counter
    with swapped_in(variables, weights, step, int(step.numpy())):
        distribution = agent.return_distribution(states)
    info = read_info(path) or {}
    write_atoms(layout.atoms, Atoms(which, info.get("train_step"), states, indices.tolist(),
                                    distribution.support, distribution.probabilities))
    return {"atoms": layout.atoms}
