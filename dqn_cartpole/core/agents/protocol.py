"""What a run needs from an agent: the one interface training, resuming, checkpoints, the Q probe and the logs use.

A value-based agent (DQN, Double DQN; C51 or QR-DQN next) implements it in its own module of
`core/agents/`, usually as an adapter around a TF-Agents agent, and `build_agent` picks it from
the config. Nothing outside `core/agents/` touches the library agent or its private names.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ValueAgent(Protocol):
    """A value-based agent as a run sees it."""

    policy: Any  # greedy: evaluations, exports, the trained agent's video
    collect_policy: Any  # exploring (epsilon-greedy): the drivers and the collectors
    collect_data_spec: Any  # the Trajectory one env step adds to replay
    time_step_spec: Any
    action_spec: Any
    train_step_counter: Any  # a tf.Variable: the train step, which also drives the epsilon schedule
    q_network: Any  # states [B, obs] -> (Q-values [B, actions], state): the Q probe's and MaxQ's estimate

    def train(self, experience: Any) -> Any:
        """One gradient step on a [B, n + 1] batch of windows; returns TF-Agents' LossInfo (`.loss`)."""

    def epsilon(self) -> float:
        """The collect policy's exploration rate now (the train log's `epsilon` column)."""

    def set_learning_rate(self, learning_rate: float) -> None:
        """A resumed run's learning rate (the config may change it)."""

    def checkpoint_objects(self) -> dict:
        """Named trackables a checkpoint saves and restores: networks, optimizer (slots built), train step."""
