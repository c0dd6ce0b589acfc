"""n-step learning targets on every replay backend, against targets computed by hand.

Episodes with known, distinct rewards (one ends in a termination, one in a time-limit
truncation, one is still running) go through each backend's real writer (`Replay.add_batch`,
the driver's observer in training). Every stored window is then sampled with the backend's
real sampler and converted by the agent's own code; the result must equal the hand-computed
n-step transitions: the return stops at the episode's LAST step, the bootstrap is that step's
observation with gamma^k (times 0 after a termination), and every step of an episode, its last
n steps included, starts exactly one window.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.networks import sequential
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib

from dqn_cartpole.core import agents
from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.core import build
from dqn_cartpole.replay.base import Replay

BACKENDS = ("tf_uniform", "py_uniform", "reverb")
GAMMA = 0.9
FIRST, MID, LAST = int(ts.StepType.FIRST), int(ts.StepType.MID), int(ts.StepType.LAST)
TIME_STEP_SPEC = ts.time_step_spec(tensor_spec.TensorSpec([2], tf.float32, "observation"))
ACTION_SPEC = tensor_spec.BoundedTensorSpec((), tf.int64, 0, 1, "action")
# (transitions, how the episode ends): a termination (discount 0 into its LAST step), a
# truncation (discount 1), and a short one; the last episode is still running at the end.
EPISODES = ((6, "terminated"), (5, "truncated"), (1, "terminated"), (2, "truncated"))
RUNNING_STEPS = 6


class Step:
    """One stored step as the driver writes it: obs id, step types, reward, discount."""

    def __init__(self, sid: int, step_type: int, next_step_type: int, reward: float, discount: float):
        self.sid, self.step_type, self.next_step_type = sid, step_type, next_step_type
        self.reward, self.discount = reward, discount


def stream() -> list[Step]:
    """The stream of steps of EPISODES, then RUNNING_STEPS steps of an unfinished episode."""
    steps: list[Step] = []

    def add(step_type: int, next_step_type: int, reward: float, discount: float) -> None:
        steps.append(Step(len(steps), step_type, next_step_type, reward, discount))

    for length, end in EPISODES:
        for t in range(length):
            last_transition = t == length - 1
            add(FIRST if t == 0 else MID, LAST if last_transition else MID, 1.0 + len(steps) * 0.37,
                0.0 if last_transition and end == "terminated" else 1.0)
        add(LAST, FIRST, 0.0, 1.0)  # the boundary step: LAST -> FIRST, reward 0, discount 1
    for t in range(RUNNING_STEPS):
        add(FIRST if t == 0 else MID, MID, 1.0 + len(steps) * 0.37, 1.0)
    return steps


def observation(sid: int) -> list[float]:
    return [float(sid), float(sid) * 0.5 - 3.0]


def as_batch(step: Step) -> trajectory_lib.Trajectory:
    return trajectory_lib.Trajectory(
        step_type=np.array([step.step_type], np.int32), observation=np.array([observation(step.sid)], np.float32),
        action=np.array([step.sid % 2], np.int64), policy_info=(),
        next_step_type=np.array([step.next_step_type], np.int32), reward=np.array([step.reward], np.float32),
        discount=np.array([step.discount], np.float32))


def expected_transitions(steps: list[Step], n: int) -> dict[int, tuple]:
    """start id -> (n-step return, bootstrap id, bootstrap discount incl. gamma^k), by hand."""
    expected = {}
    for start in steps:
        if start.step_type == LAST:
            continue  # a window starting at a LAST step is masked
        ret, discount, k = 0.0, 1.0, 0
        while k < n:
            here = steps[start.sid + k] if start.sid + k < len(steps) else None
            if here is None:
                break
            ret += GAMMA ** k * discount * here.reward
            discount *= here.discount
            k += 1
            if steps[start.sid + k].step_type == LAST if start.sid + k < len(steps) else False:
                break
        if start.sid + k >= len(steps):
            continue  # the unfinished episode's newest steps start no window yet
        expected[start.sid] = (ret, start.sid + k, GAMMA ** k * discount)
    return expected


def make_agent(n: int, double: bool = False) -> tuple[agents.DqnAgent, sequential.Sequential]:
    tf.random.set_seed(n)
    q_net = sequential.Sequential([tf.keras.layers.Dense(8, activation="tanh"), tf.keras.layers.Dense(2)])
    agent_class = agents.DdqnAgent if double else agents.DqnAgent
    agent = agent_class(TIME_STEP_SPEC, ACTION_SPEC, q_network=q_net, optimizer=tf.keras.optimizers.legacy.SGD(0.0),
                        n_step_update=n, gamma=GAMMA, td_errors_loss_fn=tf.math.squared_difference)
    agent.initialize()  # the target network starts as a copy of q_net
    return agent, q_net


def sample_all_windows(replay: Replay, n: int, batches: int = 40) -> trajectory_lib.Trajectory:
    """Samples many batches with the backend's sampler; returns the distinct windows, by start id."""
    seen = {}
    for _ in range(batches):
        items, _ = replay.get_next(sample_batch_size=64, num_steps=n + 1)
        for i, start in enumerate(np.asarray(items.observation)[:, 0, 0].astype(int)):
            seen.setdefault(start, tf.nest.map_structure(lambda t, i=i: np.asarray(t)[i], items))
    windows = [seen[k] for k in sorted(seen)]
    return tf.nest.map_structure(lambda *leaves: tf.constant(np.stack(leaves)), *windows)


def feed(replay: Replay, steps: list[Step]) -> None:
    for step in steps:
        replay.add_batch(as_batch(step))


def transitions_of(agent, windows) -> dict[int, tuple]:
    """start id -> (return, bootstrap id, bootstrap discount incl. gamma), as the agent converts them."""
    _, _, next_steps = agent.n_step_transitions(windows)  # the loss's own converter
    starts = np.asarray(windows.observation)[:, 0, 0].astype(int)
    keep = np.asarray(windows.step_type)[:, 0] != LAST
    return {int(s): (float(r), int(o), float(GAMMA * d)) for s, r, o, d, k in zip(
        starts, next_steps.reward.numpy(), next_steps.observation.numpy()[:, 0], next_steps.discount.numpy(), keep)
        if k}


def assert_same(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected), "every step must start exactly one window"
    for start, (ret, boot, discount) in expected.items():
        assert got[start][1] == boot, f"window at {start}: bootstraps from {got[start][1]}, expected {boot}"
        assert got[start][0] == pytest.approx(ret, rel=1e-5), f"window at {start}: return"
        assert got[start][2] == pytest.approx(discount, abs=1e-6), f"window at {start}: bootstrap discount"


@pytest.fixture
def replays():
    """Builds replays as training does (through the builder); closes them and stops their servers."""
    with contextlib.ExitStack() as stack:
        yield lambda backend, n, data_spec: build.make_replay_buffer(ReplayConfig(backend=backend, capacity=1000),
                                                                      data_spec, 1, n, stack)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_agent_targets_match_hand_computed_n_step_targets(replays, backend, n):
    agent, q_net = make_agent(n, double=(n == 2))
    replay = replays(backend, n, agent.collect_data_spec)
    steps = stream()
    feed(replay, steps)
    windows = sample_all_windows(replay, n)
    expected = expected_transitions(steps, n)
    assert_same(transitions_of(agent, windows), expected)

    # The agent's own TD targets and loss, against r + gamma^k * d * Q_target(s_k, a*).
    mask, targets = agent.td_targets(windows)
    starts = np.asarray(windows.observation)[:, 0, 0].astype(int)
    boot_obs = np.array([observation(expected[s][1]) if s in expected else [0.0, 0.0] for s in starts], np.float32)
    q_boot = q_net(boot_obs)[0].numpy()  # online == target network right after initialize()
    hand = np.array([expected[s][0] + expected[s][2] * q_boot[i].max() if s in expected else 0.0
                     for i, s in enumerate(starts)])
    valid = np.array([s in expected for s in starts])
    np.testing.assert_array_equal(mask.numpy().astype(bool), valid)
    np.testing.assert_allclose(targets.numpy()[valid], hand[valid], rtol=1e-5)
    q_taken = np.take_along_axis(q_net(np.asarray(windows.observation)[:, 0])[0].numpy(),
                                 np.asarray(windows.action)[:, 0:1].astype(int), axis=1)[:, 0]
    hand_loss = np.mean(np.where(valid, (hand - q_taken) ** 2, 0.0))
    assert float(agent.train_loss(windows).loss) == pytest.approx(hand_loss, rel=1e-4)


def test_every_backend_yields_the_same_transitions(replays):
    n = 3
    agent, _ = make_agent(n)
    steps = stream()
    found = {}
    for backend in BACKENDS:
        replay = replays(backend, n, agent.collect_data_spec)
        feed(replay, steps)
        found[backend] = transitions_of(agent, sample_all_windows(replay, n))
    reference = found["tf_uniform"]
    for backend in BACKENDS[1:]:
        assert sorted(found[backend]) == sorted(reference), backend
        for start, values in reference.items():
            assert found[backend][start] == pytest.approx(values, rel=1e-6), (backend, start)
    # The last n steps of each finished episode start windows too (Reverb used to drop them).
    last_of_first_episode = EPISODES[0][0] - 1
    assert {last_of_first_episode - 2, last_of_first_episode - 1, last_of_first_episode} <= set(reference)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_seam_reads_as_a_truncation(replays, backend):
    """A resumed run starts a fresh episode: the stream before it ends with a LAST step at the last
    observation, so no window before the seam bootstraps from (or adds rewards of) the new episode."""
    n = 3
    agent, _ = make_agent(n)
    replay = replays(backend, n, agent.collect_data_spec)
    before = [Step(0, FIRST, MID, 1.0, 1.0), Step(1, MID, MID, 2.0, 1.0), Step(2, MID, MID, 3.0, 1.0),
              Step(3, MID, MID, 4.0, 1.0)]
    feed(replay, before)
    held = replay.held_steps()  # what a checkpoint keeps of the writers
    if backend == "reverb":  # a new process: its writers hold nothing until given `held`
        replay.writers.forget()
    replay.write_seam(np.array([observation(4)], np.float32), held)
    after = [Step(6, FIRST, MID, 50.0, 1.0), Step(7, MID, MID, 60.0, 1.0), Step(8, MID, MID, 70.0, 1.0),
             Step(9, MID, MID, 80.0, 1.0)]
    feed(replay, after)
    got = transitions_of(agent, sample_all_windows(replay, n))
    expected = {
        0: (1.0 + GAMMA * 2.0 + GAMMA ** 2 * 3.0, 3, GAMMA ** 3),
        1: (2.0 + GAMMA * 3.0 + GAMMA ** 2 * 4.0, 4, GAMMA ** 3),  # bootstraps from the seam's observation
        2: (3.0 + GAMMA * 4.0, 4, GAMMA ** 2),
        3: (4.0, 4, GAMMA),
        6: (50.0 + GAMMA * 60.0 + GAMMA ** 2 * 70.0, 9, GAMMA ** 3),
    }
    assert_same(got, expected)
