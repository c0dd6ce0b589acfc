"""The online network's value estimate, mean max_a Q(s, a), on given states.

Two uses, both logged:

- At each evaluation, on the states its greedy episodes start from (`MaxQ`): max_a Q(s0, a) is
  what the agent believes the discounted return from s0 is, and the evaluation measures the
  discounted return the greedy policy really gets from those same states. The report plots the
  two together, so over- or under-estimation reads directly (eval_metrics.csv).
- At each train row, on a fixed set of states collected once, before training, by a seeded
  uniformly random policy (`QProbe`, as in the DQN paper's figure 2): the same states every row
  (and after a resume), so the curve shows how the estimate moves (train_metrics.csv,
  `mean_max_q`). Random-policy states are often close to failing, so their values sit below
  those of a fresh start: this one is not compared with the returns.
"""

from __future__ import annotations

from typing import Any, Optional

import gymnasium
import numpy as np
import tensorflow as tf

from dqn_cartpole.core.agents.protocol import ValueAgent
NUM_STATES = 500  # enough for a steady mean; one batched forward pass costs well under a millisecond
SEED_OFFSET = 40_000  # a random stream of its own (see the offsets in training.py)
NUM_ATOM_STATES = 4  # the probe's states at which the report draws a distributional agent's atoms


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


class MaxQ:
    """`max_q(states)` -> mean over `states` of max_a Q(s, a), the Q-values `q_values(states)` gives now (an agent's
    `ValueAgent.q_values`: the expected ones for a distributional agent): in NumPy when the agent has a NumPy twin
    (`numpy_q`, see `of_agent`: ~0.1 ms, where a compiled call costs ~2.5 ms), else compiled once."""

    def __init__(self, q_values, numpy_q: Any = None):
        self._numpy = numpy_q

        @tf.function(autograph=False, reduce_retracing=True)
        def mean_max_q(states: tf.Tensor) -> tf.Tensor:
            q_values_now, _ = q_values(states, training=False)
            return tf.reduce_mean(tf.reduce_max(q_values_now, axis=-1))

        self._mean_max_q = mean_max_q

    @classmethod
    def of_agent(cls, agent: ValueAgent) -> "MaxQ":
        """The max-Q estimate of `agent`'s (expected) Q-values, in NumPy when the agent has a NumPy greedy policy."""
        greedy = agent.numpy_greedy()
        return cls(agent.q_values, None if greedy is None else greedy.q_network)

    def __call__(self, states: np.ndarray) -> float:
        if self._numpy is not None:
            q_values = self._numpy.snapshot()(np.asarray(states, dtype=np.float32))
            return float(np.mean(np.max(q_values, axis=-1)))
        return float(self._mean_max_q(tf.constant(states, dtype=tf.float32)).numpy())


class QProbe:
    """`probe()` -> mean over the fixed states of max_a Q(s, a), in one compiled call."""

    @staticmethod
    def states_of(env_id: str, seed: int, max_episode_steps: Optional[int] = None) -> np.ndarray:
        """The probe's fixed states for a run of `env_id` with seed `seed` (the same after a resume)."""
        return random_policy_states(env_id, NUM_STATES, seed + SEED_OFFSET, max_episode_steps)

    @staticmethod
    def atom_state_indices() -> np.ndarray:
        """Which of the probe's states the report's atoms figure shows: evenly spread over the random episodes."""
        return np.linspace(0, NUM_STATES - 1, NUM_ATOM_STATES).astype(int)

    def __init__(self, q_values, states: np.ndarray, max_q: Optional[MaxQ] = None):
        self.states = np.asarray(states, dtype=np.float32)
        self.num_states = len(states)
        self.max_q = max_q or MaxQ(q_values)

    def __call__(self) -> float:
        return self.max_q(self.states)

    @classmethod
    def for_agent(cls, agent: ValueAgent, env_id: str, seed: int, max_episode_steps: Optional[int] = None) -> "QProbe":
        """A probe of `agent`'s online (expected) Q-values on NUM_STATES random-policy states of `env_id`."""
        return cls(agent.q_values, cls.states_of(env_id, seed, max_episode_steps), MaxQ.of_agent(agent))
