"""`atoms.json`: a distributional agent's (C51's) return distribution at a few fixed states, under the weights of
one of the run's saved policies; `plots/atoms.png` draws it (`report.figures.plot_atoms`). A run of an agent that
learns only the expected return (DQN) has no such file. No TensorFlow here: the report reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import numpy as np

from dqn_cartpole.run_folder.atomic import write_json_atomic

FORMAT = 1


@dataclass(frozen=True)
class Atoms:
    """`probabilities[s, a, i]`: the probability that action a at `states[s]` returns `support[i]`."""

    policy: str  # which saved policy's weights: "final" or "best"
    train_step: Optional[int]  # that policy's train step (its policy_info.json)
    states: np.ndarray  # [S, obs]
    state_indices: list  # each state's index among the Q probe's fixed states
    support: np.ndarray  # [atoms]
    probabilities: np.ndarray  # [S, actions, atoms]

    def expected_q(self) -> np.ndarray:
        """[S, actions]: each action's expected return (its Q-value; the greedy action maximises it)."""
        return self.probabilities @ self.support


def write_atoms(path: str, atoms: Atoms) -> None:
    write_json_atomic(path, {
        "format": FORMAT, "policy": atoms.policy, "train_step": atoms.train_step,
        "state_indices": [int(i) for i in atoms.state_indices], "states": atoms.states.tolist(),
        "support": atoms.support.tolist(), "probabilities": atoms.probabilities.tolist()}, indent=None)


def read_atoms(path: str) -> Optional[Atoms]:
    """The file's distribution, or None where there is none (or it cannot be read: the report then leaves it out)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return Atoms(data["policy"], data.get("train_step"), np.asarray(data["states"], np.float64),
                     list(data["state_indices"]), np.asarray(data["support"], np.float64),
                     np.asarray(data["probabilities"], np.float64))
    except (OSError, ValueError, KeyError, TypeError):
        return None
