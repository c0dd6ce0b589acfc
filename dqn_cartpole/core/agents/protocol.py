"""What a run needs from an agent: the one interface training, resuming, checkpoints, evaluation, the Q probe and
the logs use.

A value-based agent (DQN and Double DQN in `dqn.py`, C51 in `c51.py`) implements it in its own module of
`core/agents/`, usually as an adapter around a TF-Agents agent (`common.TfAgentAdapter`), and `build_agent`
(`registry.py`) picks it from `agent.kind`. Nothing outside `core/agents/` touches the library agent, its
networks or their private names: the greedy action, the Q-values and the window length come from here.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Protocol, runtime_checkable

import numpy as np


class ReturnDistribution(NamedTuple):
    """A distributional agent's belief about the return at some states: `probabilities[b, a, i]` is the probability
    that taking action a at state b returns `support[i]`; each action's row sums to 1, and its expectation is the
    action's (expected) Q-value."""

    support: np.ndarray  # [atoms], increasing
    probabilities: np.ndarray  # [B, actions, atoms]

    def expected_q(self) -> np.ndarray:
        """[B, actions]: each action's expected return."""
        return self.probabilities @ self.support


@runtime_checkable
class ValueAgent(Protocol):
    """A value-based agent as a run sees it."""

    policy: Any  # the greedy action as a TF policy: exports, a saved policy's twin, the fallback evaluation
    collect_policy: Any  # exploring (epsilon-greedy): the drivers and the collectors
    collect_data_spec: Any  # the Trajectory one env step adds to replay
    time_step_spec: Any
    action_spec: Any
    train_step_counter: Any  # a tf.Variable: the train step, which also drives the epsilon schedule
    window_length: int  # steps per sampled window (n_step + 1): what `train` takes per item
    # states [B, obs] -> (Q-values [B, actions], state), the online network's; for a distributional agent the
    # expected Q-values. What the Q probe and the evaluation's max-Q read when there is no NumPy twin.
    q_values: Any

    def numpy_greedy(self) -> Optional[Any]:
        """The greedy action in NumPy (`core.policies.NumpyGreedy`, over the same expected Q-values as `policy`,
        reading the live weights at each `snapshot`), or None: then only `policy` computes it."""

    def return_distribution(self, states: Any) -> Optional[ReturnDistribution]:
        """The online network's distribution over returns at `states` [B, obs], per action, for a distributional
        agent (what the report draws at the Q probe's states); None for one that learns only the expectation."""

    def train(self, experience: Any) -> Any:
        """One gradient step on a [B, window_length] batch of windows; returns TF-Agents' LossInfo (`.loss`)."""

    def epsilon(self) -> float:
        """The collect policy's exploration rate now (the train log's `epsilon` column)."""

    def set_learning_rate(self, learning_rate: float) -> None:
        """A resumed run's learning rate (the config may change it)."""

    def set_target_updates(self, period: Optional[int] = None, tau: Optional[float] = None) -> None:
        """The target network's update period and factor from now on (None: as it is), after a run's solve."""

    def checkpoint_objects(self) -> dict:
        """Named trackables a checkpoint saves and restores: networks, optimizer (slots built), train step."""


@runtime_checkable
class PrioritizedAgent(Protocol):
    """What prioritized replay (`replay.prioritized`) needs from a value agent besides `ValueAgent`: a train step that
    scales each item's loss by its importance weight, and each item's new priority from that step's loss. DQN, Double
    DQN and C51 have both; a registered kind without them cannot train on prioritized replay."""

    def train(self, experience: Any, weights: Any = None) -> Any:
        """`ValueAgent.train`, each item's loss multiplied by `weights` [B] (None: all 1)."""

    def item_priorities(self, loss_info: Any) -> Any:
        """[B] float: each item's priority before epsilon, from its train step's LossInfo: |n-step TD error| for the
        DQN family, the item's cross-entropy for C51 (0 for a window that starts at a LAST step: it has no loss)."""

    def actor_priorities(self, experience: Any) -> Any:
        """[B] float: each window's `item_priorities` as a collector computes it before writing the window (Ape-X):
        from the online weights alone (also as the target), no train step."""
