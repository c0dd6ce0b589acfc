"""Greedy episodes in NumPy, without TensorFlow: the Q-values of a stack of Dense layers, the greedy
action, and N episodes played side by side in a batched env, with what an evaluation reports of them.

`core.policies.NumpyGreedy` takes its weights from the agent's Q-network and plays through
`run_episodes` in the trainer; the evaluator process (`core.snapshot_evaluation`) gets the same
weights as arrays and plays the same loop, so both measure the same episodes from the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dqn_cartpole.core.vector_env import LAST

# One Dense layer as arrays: (kernel [in, out], bias [out] or None, activation name). Picklable.
DenseLayer = tuple
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"relu": lambda x: np.maximum(x, 0.0),
                                                             "linear": lambda x: x}
# A distributional head, last in a stack: (support [atoms], None, EXPECTED_Q). The layer before it gives the logits
# of every action's atoms, [B, actions x atoms]; the head turns them into expected Q-values, [B, actions].
EXPECTED_Q = "expected_q_of_atoms"
# A dueling head (`core.networks.DuelingHead`), last in a stack or before an EXPECTED_Q head:
# ((value kernel, value bias), (advantage kernel, advantage bias), DUELING). The value stream gives one unit per atom
# (1 without atoms), the advantage stream actions x atoms; per atom, Q = V + A - mean over actions of A.
DUELING = "dueling_head"
ActFn = Callable[[np.ndarray], np.ndarray]


def expected_q(logits: np.ndarray, support: np.ndarray) -> np.ndarray:
    """[B, actions x atoms] logits -> [B, actions]: sum over atoms of softmax(logits) x support (C51's Q-values)."""
    z = logits.reshape(len(logits), -1, len(support))
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return (z / z.sum(axis=-1, keepdims=True)) @ support


def q_values_of(layers: Sequence[DenseLayer]) -> Callable[[np.ndarray], np.ndarray]:
    """q_values(observations [B, d]) -> [B, actions] of a stack of Dense `layers` (then a `DUELING` head, then an
    `EXPECTED_Q` head, if any)."""
    stack = [_layer_fn(layer) for layer in layers if layer[-1] != EXPECTED_Q]
    heads = [support for support, _, activation in layers if activation == EXPECTED_Q]

    def q_values(observations: np.ndarray) -> np.ndarray:
        x = observations
        for layer in stack:
            x = layer(x)
        return expected_q(x, heads[0]) if heads else x

    return q_values


def _affine(x: np.ndarray, kernel: np.ndarray, bias: Optional[np.ndarray]) -> np.ndarray:
    return x @ kernel if bias is None else x @ kernel + bias


def _layer_fn(layer: DenseLayer) -> Callable[[np.ndarray], np.ndarray]:
    """One layer of a stack as a function of its inputs [B, n]."""
    first, second, activation = layer
    if activation == DUELING:
        return lambda x: dueling(_affine(x, *first), _affine(x, *second))
    return lambda x: ACTIVATIONS[activation](_affine(x, first, second))


def dueling(value: np.ndarray, advantage: np.ndarray) -> np.ndarray:
    """value [B, atoms], advantage [B, actions x atoms] -> [B, actions x atoms]: per atom, V + A - mean_a A
    (atoms = 1: the Q-values)."""
    atoms = value.shape[-1]
    per_action = advantage.reshape(len(advantage), -1, atoms)
    q = value[:, None, :] + per_action - per_action.mean(axis=1, keepdims=True)
    return q.reshape(len(advantage), -1)


def greedy_act(layers: Sequence[DenseLayer], minimum_action: int) -> ActFn:
    """act(observations [B, d]) -> actions [B] (int64): the argmax over actions of Q(s, a)."""
    q_values = q_values_of(layers)

    def act(observations: np.ndarray) -> np.ndarray:
        return np.argmax(q_values(observations), axis=-1).astype(np.int64) + minimum_action

    return act


def mean_max_q(layers: Sequence[DenseLayer], states: np.ndarray) -> float:
    """Mean over `states` of max_a Q(s, a)."""
    return float(np.mean(np.max(q_values_of(layers)(np.asarray(states, dtype=np.float32)), axis=-1)))


@dataclass(frozen=True)
class EvalResult:
    """Per-episode returns and lengths of one evaluation (and discounted returns, sum of gamma^t r_t, from each
    episode's first observation, which `first_observations` holds).

    With `keep_actions` (see `run_episodes`): each episode's actions, [episodes, steps] (row i
    valid up to lengths[i]), and whether it ended by failure rather than by the time limit.
    """

    returns: np.ndarray
    lengths: np.ndarray
    discounted_returns: Optional[np.ndarray] = None
    first_observations: Optional[np.ndarray] = None
    actions: Optional[np.ndarray] = None
    terminated: Optional[np.ndarray] = None

    @property
    def average_return(self) -> float:
        return float(np.mean(self.returns))

    @property
    def standard_error(self) -> float:
        """The standard error of `average_return` (0 for a single episode)."""
        n = len(self.returns)
        return float(np.std(self.returns, ddof=1) / np.sqrt(n)) if n > 1 else 0.0

    @property
    def average_length(self) -> float:
        return float(np.mean(self.lengths))

    def spread_columns(self) -> dict[str, float]:
        """The eval CSV's spread across episodes and the average discounted return."""
        discounted = None if self.discounted_returns is None else float(np.mean(self.discounted_returns))
        return {"min_return": float(np.min(self.returns)), "max_return": float(np.max(self.returns)),
                "std_return": float(np.std(self.returns)), "average_discounted_return": discounted}


def run_episodes(act: ActFn, env: Any, gamma: float = 1.0, keep_actions: bool = False,
                 give_up_below: Optional[float] = None, max_return: Optional[float] = None) -> EvalResult:
    """Exactly one episode in each of `env`'s `batch_size` copies (a `vector_env.VectorSteps`, or TF-Agents'
    batched env: anything whose reset() and step(actions) return batched time steps), step for step as
    `core.evaluation.make_episode_runner`'s compiled loop plays them. `act` maps observations to actions.

    With `give_up_below` and `max_return`, it stops as soon as the average can no longer reach
    `give_up_below` (the finished episodes' returns, plus `max_return` for each unfinished one, fall short).
    """
    n = env.batch_size
    give_up = give_up_below is not None and max_return is not None
    time_step = env.reset()
    first = time_step.observation
    returns, discounted, lengths = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)
    done, terminated, scale, actions = np.zeros(n, bool), np.zeros(n, bool), 1.0, []
    while not done.all() and (not give_up or float(np.where(done, returns, max_return).sum()) >= give_up_below * n):
        action = act(time_step.observation)
        time_step = env.step(action)
        active = ~done
        reward = np.asarray(time_step.reward, np.float64)
        returns += np.where(active, reward, 0.0)
        discounted += np.where(active, scale * reward, 0.0)  # G = sum_t gamma^t r_{t+1}
        last = np.asarray(time_step.step_type) == LAST
        if keep_actions:
            actions.append(action)
            terminated |= active & last & (np.asarray(time_step.discount) == 0.0)
        lengths += active
        done |= last
        scale *= gamma
    kept = {"actions": np.stack(actions, axis=1) if actions else np.zeros((n, 0), np.int64),
            "terminated": terminated} if keep_actions else {}
    return EvalResult(returns=returns, lengths=lengths, discounted_returns=discounted, first_observations=first,
                      **kept)
