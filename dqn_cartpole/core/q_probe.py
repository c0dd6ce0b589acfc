"""The online network's value estimate on a fixed set of states, logged with every train row.

The states are collected once, before training, by a seeded uniformly random policy in a fresh
env, so every log row (and a resumed run) measures the same states. Their mean max_a Q(s, a) is
what the agent believes the discounted return from such states is; the report plots it next to
the discounted return the greedy policy actually gets, which shows over- or under-estimation.
"""

from __future__ import annotations

from typing import Optional

import gymnasium
import numpy as np
import tensorflow as tf

NUM_STATES = 500  # enough for a steady mean; one batched forward pass costs well under a millisecond
SEED_OFFSET = 40_000  # a random stream of its own (see the offsets in training.py)


def random_policy_states(env_id: str, num_states: int, seed: int,
                         max_episode_steps: Optional[int] = None) -> np.ndarray:
    """Observations of a uniformly random policy (episodes back to back), `num_states` of them."""
    env = gymnasium.make(env_id, max_episode_steps=max_episode_steps)
    rng = np.random.default_rng(seed)
    states = []
    try:
        observation, _ = env.reset(seed=seed)
        while len(states) < num_states:
            states.append(observation)
            action = int(rng.integers(env.action_space.n))
            observation, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                observation, _ = env.reset()
    finally:
        env.close()
    return np.asarray(states, dtype=np.float32)


class QProbe:
    """`probe()` -> mean over the fixed states of max_a Q(s, a), in one compiled call."""

    def __init__(self, q_network, states: np.ndarray):
        self.states = tf.constant(states)
        self.num_states = len(states)

        @tf.function(autograph=False)
        def mean_max_q() -> tf.Tensor:
            q_values, _ = q_network(self.states, training=False)
            return tf.reduce_mean(tf.reduce_max(q_values, axis=-1))

        self._mean_max_q = mean_max_q

    def __call__(self) -> float:
        return float(self._mean_max_q().numpy())

    @classmethod
    def for_agent(cls, agent, env_id: str, seed: int, max_episode_steps: Optional[int] = None) -> "QProbe":
        """A probe of `agent`'s online Q-network on NUM_STATES random-policy states of `env_id`."""
        states = random_policy_states(env_id, NUM_STATES, seed + SEED_OFFSET, max_episode_steps)
        return cls(agent.q_network, states)
