"""C51's target, checked against numbers computed by hand: the categorical projection of an n-step return onto
the atoms.

A stream of steps with a termination (discount 0 into its LAST step), a time-limit truncation (discount 1) and
a running episode is cut into every [n + 1]-step window; for each, the agent's target distribution must equal
the hand computation (NumPy below):

* the n-step return G stops at the window's first LAST step, and the bootstrap discount is D = gamma^k times
  the discounts up to it: 0 after the termination, gamma^k after the truncation (never bootstrapping into the
  next episode's steps, whose rewards are large so that a wrong window shows);
* the next distribution is the target network's, at its greedy action under the expected Q (the online network
  is made to differ from it);
* G + D z is clipped to [v_min, v_max] and each atom's probability split between its two neighbours on the
  support (Bellemare et al., 2017, eq. 7).

The loss is then the cross-entropy of the online network's distribution for the taken action, windows that start
at a LAST step masked.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.networks import categorical_q_network
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib

from dqn_cartpole.core import agents

GAMMA, N, ATOMS, V_MIN, V_MAX = 0.9, 3, 7, -6.0, 12.0
SUPPORT = np.linspace(V_MIN, V_MAX, ATOMS)
FIRST, MID, LAST = int(ts.StepType.FIRST), int(ts.StepType.MID), int(ts.StepType.LAST)
TIME_STEP_SPEC = ts.time_step_spec(tensor_spec.TensorSpec([2], tf.float32, "observation"))
ACTION_SPEC = tensor_spec.BoundedTensorSpec((), tf.int64, 0, 1, "action")
# (step type, reward, discount) per step: an episode that terminates (discount 0 into its LAST step), one that is
# truncated (discount 1 into it), then a running one whose rewards are large.
STREAM = [(FIRST, 1.0, 1.0), (MID, 2.0, 0.0), (LAST, 0.0, 1.0),
          (FIRST, 3.0, 1.0), (MID, 4.0, 1.0), (LAST, 0.0, 1.0),
          (FIRST, 20.0, 1.0), (MID, 30.0, 1.0), (MID, 1.5, 1.0), (MID, 0.5, 1.0), (MID, 0.25, 1.0)]
STARTS = list(range(len(STREAM) - N))


def observation(sid: int) -> list[float]:
    return [0.3 * sid - 1.0, 0.5 - 0.2 * sid]


def windows() -> trajectory_lib.Trajectory:
    """Every window of N + 1 steps of STREAM, as a sampler returns them: [starts, N + 1, ...]."""
    types = np.array([s[0] for s in STREAM], np.int32)
    pick = lambda values: np.stack([values[s:s + N + 1] for s in STARTS])  # noqa: E731
    return trajectory_lib.Trajectory(
        step_type=tf.constant(pick(types)), observation=tf.constant(pick(np.array(
            [observation(i) for i in range(len(STREAM))], np.float32))),
        action=tf.constant(pick(np.arange(len(STREAM)) % 2).astype(np.int64)), policy_info=(),
        next_step_type=tf.constant(pick(np.append(types[1:], MID).astype(np.int32))),
        reward=tf.constant(pick(np.array([s[1] for s in STREAM], np.float32))),
        discount=tf.constant(pick(np.array([s[2] for s in STREAM], np.float32))))


def n_step_by_hand(start: int) -> tuple[float, int, float]:
    """(G, bootstrap step, D) of the window at `start`: the return stops at the first LAST step."""
    ret, product, k = 0.0, 1.0, 0
    while k < N:
        _, reward, discount = STREAM[start + k]
        ret += GAMMA ** k * product * reward
        product *= discount
        k += 1
        if STREAM[start + k][0] == LAST:
            break
    return ret, start + k, GAMMA ** k * product


def project_by_hand(values: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """Each atom's probability split between the support's two neighbours of its clipped value."""
    projected = np.zeros(ATOMS)
    delta = SUPPORT[1] - SUPPORT[0]
    for value, p in zip(np.clip(values, V_MIN, V_MAX), probabilities):
        b = (value - V_MIN) / delta
        low, high = int(np.floor(b)), int(np.ceil(b))
        if low == high:
            projected[low] += p
        else:
            projected[low] += p * (high - b)
            projected[high] += p * (b - low)
    return projected


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def make_agent():
    tf.random.set_seed(3)
    network = categorical_q_network.CategoricalQNetwork(TIME_STEP_SPEC.observation, ACTION_SPEC, num_atoms=ATOMS,
                                                        fc_layer_params=(8,))
    agent = agents.C51Agent(TIME_STEP_SPEC, ACTION_SPEC, categorical_q_network=network,
                            optimizer=tf.keras.optimizers.legacy.SGD(0.0), min_q_value=V_MIN, max_q_value=V_MAX,
                            n_step_update=N, gamma=GAMMA, target_update_period=1000)
    agent.initialize()  # the target network starts as a copy of the online one
    return agent, network


def logits_of(network, observations: np.ndarray) -> np.ndarray:
    return network(np.asarray(observations, np.float32))[0].numpy()  # [B, actions, atoms]


def test_the_c51_target_is_the_projected_n_step_return_of_the_target_networks_greedy_distribution():
    agent, network = make_agent()
    frozen = network.copy()
    frozen.create_variables(TIME_STEP_SPEC.observation)
    for variable, value in zip(frozen.variables, network.variables):
        variable.assign(value)  # the target network's weights, kept
    rng = np.random.default_rng(0)
    for variable in network.trainable_variables:  # new online weights: the online and the target network differ
        variable.assign(variable + rng.normal(scale=0.7, size=variable.shape).astype(np.float32))

    hand = {s: n_step_by_hand(s) for s in STARTS if STREAM[s][0] != LAST}
    assert hand[0] == pytest.approx((1.0 + GAMMA * 2.0, 2, 0.0))  # terminated inside the window: no bootstrap
    assert hand[3] == pytest.approx((3.0 + GAMMA * 4.0, 5, GAMMA ** 2))  # truncated: bootstraps at the LAST step
    boot = np.array([observation(hand[s][1]) if s in hand else [0.0, 0.0] for s in STARTS], np.float32)
    target_probabilities = softmax(logits_of(frozen, boot))  # [B, actions, atoms]
    online_probabilities = softmax(logits_of(network, boot))
    expected = np.zeros((len(STARTS), ATOMS))
    for i, start in enumerate(STARTS):
        if start in hand:
            ret, _, discount = hand[start]
            greedy = np.argmax(target_probabilities[i] @ SUPPORT)  # greedy under the target network's expected Q
            expected[i] = project_by_hand(ret + discount * SUPPORT, target_probabilities[i, greedy])
    # The data tells the online network's next distribution from the target network's.
    online_next = online_probabilities[np.arange(len(STARTS)), np.argmax(online_probabilities @ SUPPORT, axis=1)]
    target_next = target_probabilities[np.arange(len(STARTS)), np.argmax(target_probabilities @ SUPPORT, axis=1)]
    assert not np.allclose(online_next, target_next, atol=1e-2)

    valid, target = agent.target_distribution(windows())
    np.testing.assert_array_equal(valid.numpy().astype(bool), [s in hand for s in STARTS])
    np.testing.assert_allclose(target.numpy()[valid.numpy() > 0], expected[[s in hand for s in STARTS]], atol=1e-5)

    # The loss: the cross-entropy of the online distribution of the taken action, masked, averaged over the batch.
    taken = logits_of(network, np.array([observation(s) for s in STARTS]))[np.arange(len(STARTS)),
                                                                           np.array(STARTS) % 2]
    log_p = taken - taken.max(axis=1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    hand_loss = np.mean(np.where(valid.numpy() > 0, -(expected * log_p).sum(axis=1), 0.0))
    assert float(agent.train_loss(windows()).loss) == pytest.approx(hand_loss, rel=1e-5)


def test_double_q_bootstraps_the_target_networks_distribution_at_the_online_networks_action():
    import contextlib

    from dqn_cartpole.config import load_config
    from dqn_cartpole.distributed import parts

    config = load_config(None, ["agent.kind=c51", "agent.double_q=true"])
    with contextlib.ExitStack() as stack:
        _, _, agent = parts.agent_with_envs(config, 1, 0, stack)
        library = agent.tf_agent
        target_net = library._target_q_network  # pylint: disable=protected-access
        rng = np.random.default_rng(0)
        target_net.set_weights([w + rng.normal(scale=0.5, size=w.shape).astype(w.dtype)
                                for w in target_net.get_weights()])  # the two networks now disagree
        states = tf.constant(rng.normal(size=(64, 4)).astype(np.float32))
        step = ts.transition(states, reward=tf.zeros([64]), discount=tf.ones([64]))
        online_q, _ = agent.q_values(states)
        target_logits, _ = target_net(states)
        support = library._support.numpy()  # pylint: disable=protected-access
        target_p = tf.nn.softmax(target_logits).numpy()
        online_action = online_q.numpy().argmax(axis=1)
        assert (online_action != (target_p @ support).argmax(axis=1)).any()  # else the test could not tell
        expected = target_p[np.arange(64), online_action]
        np.testing.assert_allclose(library._next_q_distribution(step).numpy(), expected, rtol=1e-5)
