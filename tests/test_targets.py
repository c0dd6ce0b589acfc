"""n-step learning targets on every replay backend and on the distributed path, against targets computed by hand.

Episodes with known, distinct rewards (one ends in a termination, one in a time-limit
truncation, one is still running) go through each backend's real writer (`Replay.add_batch`,
the driver's observer in training). The `learner` backend is the distributed path: a collector's
writers put the windows into a Reverb queue, the learner's replay reads them into its own buffer.
Every stored window is counted exactly (each collected step starts one window, no step starts
two), then sampled with the backend's real sampler and converted by the agent's own code; the
result must equal the hand-computed n-step transitions: the return stops at the episode's LAST
step, the bootstrap is that step's observation with gamma^k (times 0 after a termination).

The online and the target network differ (the online output layer changes after `initialize()`
copied it into the target network), so the bootstrap values tell DQN (max of the target network) from Double DQN
(the target network at the online network's argmax) and from a DQN that bootstraps from the
online network. Gradient clipping is checked to be global-norm, not per variable.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.networks import sequential
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib

from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.core import agents, build
from dqn_cartpole.replay import reverb_tables
from dqn_cartpole.core.agents import window_length
from dqn_cartpole.replay.base import Replay
from dqn_cartpole.replay.learner_side import LearnerRatio, LearnerSideReplay, QueueReader
from dqn_cartpole.replay.reverb_writers import StreamWriters

BACKENDS = ("tf_uniform", "py_uniform", "reverb", "learner")
GAMMA = 0.9
FIRST, MID, LAST = int(ts.StepType.FIRST), int(ts.StepType.MID), int(ts.StepType.LAST)
TIME_STEP_SPEC = ts.time_step_spec(tensor_spec.TensorSpec([2], tf.float32, "observation"))
ACTION_SPEC = tensor_spec.BoundedTensorSpec((), tf.int64, 0, 1, "action")
# (transitions, how the episode ends): a termination (discount 0 into its LAST step), a
# truncation (discount 1), and a short one; the last episode is still running at the end.
EPISODES = ((6, "terminated"), (5, "truncated"), (1, "terminated"), (2, "truncated"))
RUNNING_STEPS = 6
SAMPLED_BATCHES = 40  # of 64: every one of the ~40 windows is drawn (a window missing has odds below 1e-25)


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


def make_agent(n: int, double: bool = False, learning_rate: float = 0.0,
               gradient_clipping: float = None) -> tuple[agents.DqnAgent, sequential.Sequential]:
    tf.random.set_seed(n)
    q_net = sequential.Sequential([tf.keras.layers.Dense(8, activation="tanh"), tf.keras.layers.Dense(2)])
    agent_class = agents.DdqnAgent if double else agents.DqnAgent
    agent = agent_class(TIME_STEP_SPEC, ACTION_SPEC, q_network=q_net,
                        optimizer=tf.keras.optimizers.legacy.SGD(learning_rate), n_step_update=n, gamma=GAMMA,
                        td_errors_loss_fn=tf.math.squared_difference, target_update_period=1000,
                        gradient_clipping=gradient_clipping)
    agent.initialize()  # the target network starts as a copy of q_net
    return agent, q_net


def frozen_copy(q_net: sequential.Sequential) -> Callable[[np.ndarray], np.ndarray]:
    """Q-values of `q_net`'s current weights, kept: the target network right after `initialize()`."""
    weights = [w.numpy() for w in q_net.trainable_variables]
    clone = q_net.copy()
    clone.create_variables(TIME_STEP_SPEC.observation)
    for variable, value in zip(clone.trainable_variables, weights):
        variable.assign(value)
    return lambda obs: clone(np.asarray(obs, np.float32))[0].numpy()


# ---------------------------------------------------------------------------- the backends


class Fed:
    """A replay fed through its backend's real writer; `replay` is what the learner reads."""

    def __init__(self, replay: Replay, write: Callable[[Any], Any], settle: Callable[[], None] = lambda: None):
        self.replay, self.write, self.settle = replay, write, settle

    def feed(self, steps: list[Step]) -> None:
        for step in steps:
            self.write(as_batch(step))
        self.settle()


def distributed_path(n: int, data_spec: Any, stack: contextlib.ExitStack) -> Fed:
    """A collector's writers -> a Reverb queue (an embedded server) -> the learner-side replay's own buffer."""
    config = ReplayConfig(backend="reverb", capacity=1000)
    length = window_length(n)
    server = build.start_replay_server(config, data_spec, length, stack, replay_tables=[
        reverb_tables.make_queue_table(data_spec, length, max_size=1000)])
    import reverb

    writers = StreamWriters(reverb.Client(server.address), data_spec, 1, length,
                            (reverb_tables.QUEUE_TABLE_NAME,))
    stack.callback(writers.close)
    reader = QueueReader(server.address, data_spec, length, rate_limiter_timeout_ms=10_000)
    # A ratio that asks for no more items while sampling: the test reads the queue itself.
    replay = LearnerSideReplay(data_spec, config, length, reader, LearnerRatio(1e9, 0, 64),
                               tf.Variable(0, dtype=tf.int64))
    stack.callback(replay.close)
    client = reverb.Client(server.address)

    def settle() -> None:  # the learner reads everything the collector queued (some are in flight to it already)
        writers.flush()
        queued = client.server_info()[reverb_tables.QUEUE_TABLE_NAME].rate_limiter_info.insert_stats.completed
        replay.read(int(queued) - replay.inserts())

    return Fed(replay, writers.add_batch, settle)


@pytest.fixture
def replays():
    """Builds a backend as training does (through the builder); closes it and stops its server."""
    with contextlib.ExitStack() as stack:
        def make(backend: str, n: int, data_spec: Any) -> Fed:
            if backend == "learner":
                return distributed_path(n, data_spec, stack)
            replay = build.make_replay_buffer(ReplayConfig(backend=backend, capacity=1000), data_spec, 1, window_length(n), stack)
            return Fed(replay, replay.add_batch)

        yield make


# ---------------------------------------------------------------------------- reading the windows


def stored_windows(replay: Replay, n: int) -> trajectory_lib.Trajectory:
    """Every window the replay can serve, each once: the items of Reverb and the learner-side buffer; for the
    uniform buffers, which store steps, the window at every start but the newest n steps."""
    everything = replay.single_pass()
    if replay.backend in ("tf_uniform", "py_uniform"):
        steps = tf.nest.map_structure(lambda a: np.asarray(a)[0], everything)  # the one env's stream
        count = len(steps.step_type) - n
        return tf.nest.map_structure(lambda a: np.stack([a[i:i + n + 1] for i in range(count)]), steps)
    return everything


def window_batch(steps: list[Step], starts: list[int], n: int) -> trajectory_lib.Trajectory:
    """The windows of n + 1 steps at `starts`, as a batch [starts, n + 1, ...] (as a sampler returns them)."""
    def window(start: int) -> Any:
        return tf.nest.map_structure(lambda *leaves: np.concatenate(leaves), *[as_batch(steps[start + k])
                                                                             for k in range(n + 1)])

    return tf.nest.map_structure(lambda *leaves: tf.constant(np.stack(leaves)), *[window(s) for s in starts])


def start_ids(windows: trajectory_lib.Trajectory) -> list[int]:
    return np.asarray(windows.observation)[:, 0, 0].astype(int).tolist()


def sample_all_windows(replay: Replay, n: int) -> trajectory_lib.Trajectory:
    """Draws SAMPLED_BATCHES batches with the backend's real training sampler; the distinct windows, by start."""
    sample = replay.sampler(64, n + 1)
    seen = {}
    for _ in range(SAMPLED_BATCHES):
        items = sample()
        for i, start in enumerate(start_ids(items)):
            seen.setdefault(start, tf.nest.map_structure(lambda t, i=i: np.asarray(t)[i], items))
    return tf.nest.map_structure(lambda *leaves: tf.constant(np.stack(leaves)), *[seen[k] for k in sorted(seen)])


def transitions_of(agent, windows) -> dict[int, tuple]:
    """start id -> (return, bootstrap id, bootstrap discount incl. gamma), as the agent converts them."""
    _, _, next_steps = agent.n_step_transitions(windows)  # the loss's own converter
    keep = np.asarray(windows.step_type)[:, 0] != LAST
    return {s: (float(r), int(o), float(GAMMA * d)) for s, r, o, d, k in zip(
        start_ids(windows), next_steps.reward.numpy(), next_steps.observation.numpy()[:, 0],
        next_steps.discount.numpy(), keep) if k}


def assert_same(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected), "every step must start a window"
    for start, (ret, boot, discount) in expected.items():
        assert got[start][1] == boot, f"window at {start}: bootstraps from {got[start][1]}, expected {boot}"
        assert got[start][0] == pytest.approx(ret, rel=1e-5), f"window at {start}: return"
        assert got[start][2] == pytest.approx(discount, abs=1e-6), f"window at {start}: bootstrap discount"


def assert_one_window_per_step(replay: Replay, steps: list[Step], n: int) -> None:
    """Each stored step starts exactly one window (the newest n steps, whose windows are not complete, none)."""
    counts = collections.Counter(start_ids(stored_windows(replay, n)))
    assert sorted(counts) == list(range(len(steps) - n)), "every step but the newest n starts a window"
    twice = {start: count for start, count in counts.items() if count != 1}
    assert not twice, f"windows stored more than once (start id: count): {twice}"


# ---------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("double", [False, True], ids=["dqn", "double_dqn"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_agent_targets_match_hand_computed_n_step_targets(replays, backend, double, n):
    agent, q_net = make_agent(n, double=double)
    fed = replays(backend, n, agent.collect_data_spec)
    steps = stream()
    fed.feed(steps)
    assert_one_window_per_step(fed.replay, steps, n)
    windows = sample_all_windows(fed.replay, n)
    expected = expected_transitions(steps, n)
    assert_same(transitions_of(agent, windows), expected)

    # New online weights; the target network keeps the copy initialize() made. The online output layer is the
    # target's with its two actions swapped and 5 added, so argmax_online = argmin_target and max_online =
    # max_target + 5: DQN, Double DQN and a DQN bootstrapping from the online network all differ.
    q_target = frozen_copy(q_net)
    kernel, bias = q_net.layers[-1].kernel, q_net.layers[-1].bias
    kernel.assign(kernel[:, ::-1])
    bias.assign(bias[::-1] + 5.0)
    starts = start_ids(windows)
    boot_obs = np.array([observation(expected[s][1]) if s in expected else [0.0, 0.0] for s in starts], np.float32)
    q_online_boot, q_target_boot = q_net(boot_obs)[0].numpy(), q_target(boot_obs)
    valid = np.array([s in expected for s in starts])
    rewards = np.array([expected[s][0] if s in expected else 0.0 for s in starts])
    discounts = np.array([expected[s][2] if s in expected else 0.0 for s in starts])
    dqn = rewards + discounts * q_target_boot.max(axis=1)  # r + gamma^k d max_a Q_target(s_k, a)
    greedy = q_online_boot.argmax(axis=1)
    double_dqn = rewards + discounts * q_target_boot[np.arange(len(starts)), greedy]  # Q_target(s_k, argmax Q_online)
    hand = double_dqn if double else dqn
    # The data tells the three bootstraps apart, so the agent cannot pass with the wrong one.
    online_dqn = rewards + discounts * q_online_boot.max(axis=1)
    assert not np.allclose(dqn[valid], double_dqn[valid]) and not np.allclose(dqn[valid], online_dqn[valid])

    mask, targets = agent.td_targets(windows)
    np.testing.assert_array_equal(mask.numpy().astype(bool), valid)
    np.testing.assert_allclose(targets.numpy()[valid], hand[valid], rtol=1e-5, atol=1e-5)
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
        fed = replays(backend, n, agent.collect_data_spec)
        fed.feed(steps)
        found[backend] = transitions_of(agent, sample_all_windows(fed.replay, n))
    reference = found["tf_uniform"]
    for backend in BACKENDS[1:]:
        assert sorted(found[backend]) == sorted(reference), backend
        for start, values in reference.items():
            assert found[backend][start] == pytest.approx(values, rel=1e-6), (backend, start)
    # The last n steps of each finished episode start windows too (Reverb used to drop them).
    last_of_first_episode = EPISODES[0][0] - 1
    assert {last_of_first_episode - 2, last_of_first_episode - 1, last_of_first_episode} <= set(reference)


def test_gradient_clipping_clips_the_global_norm_of_all_gradients():
    """One SGD step of rate 1: each variable moves by -clip_by_global_norm(grads)[i], not by its own clipped norm."""
    n, clip = 3, 0.05
    agent, q_net = make_agent(n, learning_rate=1.0, gradient_clipping=clip)
    steps = stream()
    windows = window_batch(steps, sorted(expected_transitions(steps, n)), n)
    variables = q_net.trainable_variables
    with tf.GradientTape() as tape:
        loss = agent.train_loss(windows, training=True).loss
    grads = tape.gradient(loss, variables)
    global_clipped, norm = tf.clip_by_global_norm(grads, clip)
    per_variable = [tf.clip_by_norm(g, clip) for g in grads]
    assert float(norm) > 2 * clip  # the clip is active...
    assert any(not np.allclose(a, b) for a, b in zip(global_clipped, per_variable))  # ...and the two kinds differ
    before = [v.numpy() for v in variables]
    agent.train(windows)
    for variable, start, step in zip(variables, before, global_clipped):
        np.testing.assert_allclose(variable.numpy(), start - step.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS[:3])
def test_resume_seam_reads_as_a_truncation(replays, backend):
    """A resumed run starts a fresh episode: the stream before it ends with a LAST step at the last
    observation, so no window before the seam bootstraps from (or adds rewards of) the new episode."""
    n = 3
    agent, _ = make_agent(n)
    fed = replays(backend, n, agent.collect_data_spec)
    replay = fed.replay
    before = [Step(0, FIRST, MID, 1.0, 1.0), Step(1, MID, MID, 2.0, 1.0), Step(2, MID, MID, 3.0, 1.0),
              Step(3, MID, MID, 4.0, 1.0)]
    fed.feed(before)
    held = replay.held_steps()  # what a checkpoint keeps of the writers
    if backend == "reverb":  # a new process: its writers hold nothing until given `held`
        replay.writers.forget()
    replay.write_seam(np.array([observation(4)], np.float32), held)
    after = [Step(6, FIRST, MID, 50.0, 1.0), Step(7, MID, MID, 60.0, 1.0), Step(8, MID, MID, 70.0, 1.0),
             Step(9, MID, MID, 80.0, 1.0)]
    fed.feed(after)
    got = transitions_of(agent, sample_all_windows(replay, n))
    expected = {
        0: (1.0 + GAMMA * 2.0 + GAMMA ** 2 * 3.0, 3, GAMMA ** 3),
        1: (2.0 + GAMMA * 3.0 + GAMMA ** 2 * 4.0, 4, GAMMA ** 3),  # bootstraps from the seam's observation
        2: (3.0 + GAMMA * 4.0, 4, GAMMA ** 2),
        3: (4.0, 4, GAMMA),
        6: (50.0 + GAMMA * 60.0 + GAMMA ** 2 * 70.0, 9, GAMMA ** 3),
    }
    assert_same(got, expected)
