"""The three replay backends behind one API: tutorial shapes, FIFO eviction, clear, smoke training.

The nested spec, batch size and max length are those of the TF-Agents replay buffer tutorial
(https://www.tensorflow.org/agents/tutorials/5_replay_buffers_tutorial). Every value written
is 100 * env + step, so each test can also check *which* steps came back, not only shapes.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import os

import numpy as np
import pytest
import tensorflow as tf


from helpers import C51_SETS, CONFIGS, check_c51_run

import dqn_cartpole as dq
from dqn_cartpole.config import ReplayConfig
from dqn_cartpole.errors import UserError
from dqn_cartpole.core import build
from dqn_cartpole.replay.base import Replay

BACKENDS = ("tf_uniform", "py_uniform", "reverb")
TUTORIAL_SPEC = (
    tf.TensorSpec([3], tf.float32, "action"),
    (tf.TensorSpec([5], tf.float32, "lidar"), tf.TensorSpec([3, 2], tf.float32, "camera")),
)
TUTORIAL_BATCH, TUTORIAL_MAX_LENGTH, TUTORIAL_ADDS = 32, 1000, 6


def shapes(nest) -> list[list[int]]:
    return [list(np.shape(leaf)) for leaf in tf.nest.flatten(nest)]


def values(nest) -> np.ndarray:
    """The encoded 100 * env + step of every item: the first number of its `action`."""
    return np.asarray(tf.nest.flatten(nest)[0])[..., 0]


def steps_of(num_envs: int, step: int):
    """One add_batch worth of the tutorial spec; every number is 100 * env + step."""
    encoded = 100.0 * np.arange(num_envs, dtype=np.float32) + step

    def leaf(spec: tf.TensorSpec) -> tf.Tensor:
        per_env = encoded.reshape([-1] + [1] * spec.shape.rank)
        return tf.constant(np.broadcast_to(per_env, [num_envs] + spec.shape.as_list()))

    return tf.nest.map_structure(leaf, TUTORIAL_SPEC)


def make(stack: contextlib.ExitStack, backend: str, num_envs: int, capacity: int, sequence_length: int = 2) -> Replay:
    """A replay as training builds it (through the builder); `stack` closes it and stops its server."""
    config = ReplayConfig(backend=backend, capacity=capacity)
    return build.make_replay_buffer(config, TUTORIAL_SPEC, num_envs, sequence_length, stack)


@pytest.fixture
def open_replays():
    """Builds replays and closes them all (and so stops their Reverb servers), even on failure."""
    with contextlib.ExitStack() as stack:
        yield functools.partial(make, stack)


# ---------------------------------------------------------------------------- 1. tutorial shapes


@pytest.mark.parametrize("backend", ["tf_uniform", "reverb"])
def test_tutorial_shapes(open_replays, backend):
    # The tutorial's buffer: 32 envs, max length 1000 per env, 6 add_batch calls. Reverb (a
    # table of sequence_length=2 windows, the tutorial's num_steps) stores each env's 6 steps
    # as 5 overlapping windows, so its full pass is 32 * 5 items of 2 steps, not [32, 6].
    replay = open_replays(backend, TUTORIAL_BATCH, capacity=TUTORIAL_BATCH * TUTORIAL_MAX_LENGTH)
    for step in range(TUTORIAL_ADDS):
        replay.add_batch(steps_of(TUTORIAL_BATCH, step))

    assert shapes(replay.get_next(sample_batch_size=10, num_steps=1)[0]) == [[10, 1, 3], [10, 1, 5], [10, 1, 3, 2]]
    items, _ = next(iter(replay.as_dataset(sample_batch_size=4, num_steps=2)))
    assert shapes(items) == [[4, 2, 3], [4, 2, 5], [4, 2, 3, 2]]
    steps = values(items)
    assert np.all(steps[:, 1] == steps[:, 0] + 1)  # two consecutive steps of one env

    everything = replay.single_pass()
    encoded = 100 * np.arange(TUTORIAL_BATCH)[:, None] + np.arange(TUTORIAL_ADDS)  # [env, step]
    if backend == "tf_uniform":
        assert shapes(everything) == [[32, 6, 3], [32, 6, 5], [32, 6, 3, 2]]
        np.testing.assert_array_equal(values(everything), encoded)
    else:
        assert shapes(everything) == [[160, 2, 3], [160, 2, 5], [160, 2, 3, 2]]
        windows = np.stack([encoded[:, :-1], encoded[:, 1:]], axis=-1).transpose(1, 0, 2).reshape(-1, 2)
        np.testing.assert_array_equal(values(everything), windows)  # oldest first: step by step, env by env
    assert replay.size() == (32 * 6 if backend == "tf_uniform" else 32 * 5)  # steps, or Reverb's items


def test_tutorial_shapes_py_uniform(open_replays):
    # PyUniformReplayBuffer stores a single stream (it only takes batches of 1), so the
    # tutorial's 32 envs become one: the same 6 adds give a full pass of [1, 6, ...].
    with pytest.raises(UserError, match="env.num_envs: 1"):
        open_replays("py_uniform", TUTORIAL_BATCH, capacity=TUTORIAL_MAX_LENGTH)
    replay = open_replays("py_uniform", 1, capacity=TUTORIAL_MAX_LENGTH)
    for step in range(TUTORIAL_ADDS):
        replay.add_batch(steps_of(1, step))

    assert shapes(replay.get_next(sample_batch_size=10, num_steps=1)[0]) == [[10, 1, 3], [10, 1, 5], [10, 1, 3, 2]]
    items, _ = next(iter(replay.as_dataset(sample_batch_size=4, num_steps=2)))
    assert shapes(items) == [[4, 2, 3], [4, 2, 5], [4, 2, 3, 2]]
    assert np.all(values(items)[:, 1] == values(items)[:, 0] + 1)
    everything = replay.single_pass()
    assert shapes(everything) == [[1, 6, 3], [1, 6, 5], [1, 6, 3, 2]]
    np.testing.assert_array_equal(values(everything), [np.arange(6)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_next_variants_match_the_replay_buffer_api(open_replays, backend):
    replay = open_replays(backend, 1, capacity=100)
    for step in range(5):
        replay.add_batch(steps_of(1, step))
    assert shapes(replay.get_next(sample_batch_size=7)[0]) == [[7, 3], [7, 5], [7, 3, 2]]  # single steps
    unstacked, _ = replay.get_next(sample_batch_size=7, num_steps=2, time_stacked=False)
    assert len(unstacked) == 2 and shapes(unstacked[1]) == [[7, 3], [7, 5], [7, 3, 2]]
    assert np.all(values(unstacked[1]) == values(unstacked[0]) + 1)


@pytest.mark.parametrize("backend", ["tf_uniform", "py_uniform"])
def test_direct_sampling_inside_a_compiled_graph(open_replays, backend):
    replay = open_replays(backend, 1, capacity=100)
    @tf.function(autograph=False)
    def add(items) -> None:
        replay.add_batch(items)  # as the driver's observer: a side effect inside a graph

    for step in range(5):
        add(steps_of(1, step))
    sample = tf.function(lambda: replay.get_next(8, 2)[0], autograph=False)
    steps = values(sample())
    assert steps.shape == (8, 2) and np.all(steps[:, 1] == steps[:, 0] + 1) and steps.max() <= 4


def test_a_seeded_py_uniform_run_in_the_compiled_loop_trains_the_same_twice(tmp_path):
    """py_uniform's write and its sample are two numpy ops in one compiled iteration: the sample must come after the
    step's write, or a seeded run's losses differ run to run (before the fix, the tutorial's settings reached a best
    of 191.2 in one run and 200 in another, and two of these runs parted within 300 iterations)."""
    settings = {"training.num_iterations": 300, "replay.backend": "py_uniform", "replay.sampling": "direct",
                "collection.driver": "compiled", "video.enabled": False, "output.tensorboard": False,
                "evaluation.eval_interval": 300, "evaluation.stop_when_solved": False,
                "training.log_interval": 100}
    rows = []
    for name in ("first", "second"):
        run = dq.train("tutorial", tmp_path / name, progress=False, overrides=settings)
        with open(os.path.join(run.path, "train_metrics.csv")) as handle:
            rows.append([{key: value for key, value in row.items() if key not in ("wall_s", "train_steps_per_s")}
                         for row in csv.DictReader(handle)])
    assert rows[0] == rows[1] and len(rows[0]) == 3


def test_a_buffer_sampled_in_program_order_writes_without_the_librarys_lock():
    """Direct sampling: `last_id` moves without a critical section (its execution cost a quarter of a collect
    step), and every add still counts, in a graph or eagerly; a dataset's readers keep the library's lock."""
    from tf_agents.replay_buffers import tf_uniform_replay_buffer
    from dqn_cartpole.replay.uniform import ProgramOrderUniformReplayBuffer, TFUniformReplay

    with contextlib.ExitStack() as stack:
        direct = build.make_replay_buffer(ReplayConfig(backend="tf_uniform", capacity=8, sampling="direct"),
                                          TUTORIAL_SPEC, 2, 2, stack)
        dataset = build.make_replay_buffer(ReplayConfig(backend="tf_uniform", capacity=8, sampling="dataset"),
                                           TUTORIAL_SPEC, 2, 2, stack)
    assert isinstance(direct, TFUniformReplay) and type(direct.buffer) is ProgramOrderUniformReplayBuffer
    assert type(dataset.buffer) is tf_uniform_replay_buffer.TFUniformReplayBuffer

    @tf.function(autograph=False)
    def add_then_sample(items):
        direct.add_batch(items)  # as the driver's observer, then the iteration's sample
        return direct.sampler(16, 2)()

    direct.add_batch(steps_of(2, 0))
    # The only window is (0, 1) once step 1 is in: the sample ran after the add (before it, there was none).
    np.testing.assert_array_equal(values(add_then_sample(steps_of(2, 1))) % 100, [[0, 1]] * 16)
    for step in range(2, 6):  # past the capacity of 4 per env: only the newest 4 steps are sampled
        sampled = values(add_then_sample(steps_of(2, step))) % 100
        assert sampled.max() <= step and sampled.min() >= max(0, step - 3)
    assert direct.inserts() == 12 and direct.size() == 8
    np.testing.assert_array_equal(values(direct.single_pass()) % 100, [[2, 3, 4, 5]] * 2)


# ---------------------------------------------------------------------------- 2. eviction


@pytest.mark.parametrize("backend", ["tf_uniform", "py_uniform"])
def test_filling_past_capacity_evicts_the_oldest_steps(open_replays, backend):
    num_envs = 2 if backend == "tf_uniform" else 1
    replay = open_replays(backend, num_envs, capacity=4 * num_envs)
    for step in range(7):
        replay.add_batch(steps_of(num_envs, step))
    assert replay.size() == 4 * num_envs and replay.inserts() == 7 * num_envs
    # Each env keeps its own newest 4 steps, in order. (tf-agents 0.19's
    # as_dataset(single_deterministic_pass=True) would give env 0 the steps 103..106 here.)
    expected = 100 * np.arange(num_envs)[:, None] + np.arange(3, 7)
    np.testing.assert_array_equal(values(replay.single_pass()), expected)
    sampled = values(replay.get_next(sample_batch_size=200, num_steps=2)[0]) % 100
    assert sampled.min() == 3 and sampled.max() == 6  # never an evicted step, nor a window across the wrap


def test_reverb_filling_past_capacity_evicts_the_oldest_items(open_replays):
    replay = open_replays("reverb", 1, capacity=4)
    for step in range(7):
        replay.add_batch(steps_of(1, step))
    assert replay.size() == 4 and replay.inserts() == 6  # 7 steps make 6 windows of 2
    np.testing.assert_array_equal(values(replay.single_pass()), [[2, 3], [3, 4], [4, 5], [5, 6]])
    np.testing.assert_array_equal(values(replay.single_pass()), [[2, 3], [3, 4], [4, 5], [5, 6]])  # repeatable
    replay.add_batch(steps_of(1, 7))
    np.testing.assert_array_equal(values(replay.single_pass()), [[3, 4], [4, 5], [5, 6], [6, 7]])


def cartpole_steps(num_envs: int, steps: int):
    """`steps` batches of MID Trajectory steps (CartPole's spec), observation[0] = step: the collectors' data."""
    from tf_agents.trajectories import trajectory as trajectory_lib

    for step in range(steps):
        yield trajectory_lib.mid(observation=np.full([num_envs, 4], step, np.float32),
                                 action=np.zeros([num_envs], np.int64), policy_info=(),
                                 reward=np.ones([num_envs], np.float32), discount=np.ones([num_envs], np.float32))


def cartpole_replay(stack: contextlib.ExitStack, capacity: int = 100) -> Replay:
    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import policy_step, time_step as ts, trajectory as trajectory_lib

    observation = ts.time_step_spec(tf.TensorSpec([4], tf.float32))
    action = policy_step.PolicyStep(action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1), state=(), info=())
    spec = trajectory_lib.from_transition(observation, action, observation)
    return build.make_replay_buffer(ReplayConfig(backend="reverb", capacity=capacity), spec, 1, 2, stack)


def test_reverb_items_carry_the_collecting_train_step_to_the_learners_sampler():
    """A collector tags its items (priority = train step of its weights, 0 included); the learner's sampler
    reads it back, and the insertion-order table keeps its own order."""
    with contextlib.ExitStack() as stack:
        replay = cartpole_replay(stack)
        steps = cartpole_steps(1, 21)
        replay.tag_items(0)
        for _ in range(11):  # 10 windows collected with the weights of train step 0
            replay.add_batch(next(steps))
        replay.tag_items(7)
        for batch in steps:  # 10 more with those of step 7
            replay.add_batch(batch)
        sample = replay.sampler(64, 2, with_tags=True)
        experience, priority = sample()
        first = np.asarray(experience.observation)[:, 0, 0]  # the window's first step
        priority = np.asarray(priority)  # [batch]: the item's priority
        np.testing.assert_array_equal(priority, np.where(first < 10, 0.0, 7.0))
        assert set(priority.tolist()) == {0.0, 7.0}
        np.testing.assert_array_equal(np.asarray(replay.single_pass().observation)[:, 0, 0], np.arange(20))


def test_reverb_samples_per_insert_come_from_the_servers_counters():
    """Sampled items as the server counts them (prefetched ones too), not train steps x batch."""
    with contextlib.ExitStack() as stack:
        replay = cartpole_replay(stack)
        for batch in cartpole_steps(1, 31):
            replay.add_batch(batch)
        sample = replay.sampler(8, 2)
        for _ in range(5):
            sample()
        before = replay.samples()  # the dataset's prefetch may still be sampling: the count only grows
        info = replay.client.server_info()["uniform_table"].rate_limiter_info
        assert replay.inserts() == info.insert_stats.completed == 30
        assert 5 * 8 <= before <= info.sample_stats.completed <= replay.samples()


# ---------------------------------------------------------------------------- 3. clear


@pytest.mark.parametrize("backend", BACKENDS)
def test_clear_leaves_the_buffer_empty(open_replays, backend):
    replay = open_replays(backend, 1, capacity=100)
    for step in range(5):
        replay.add_batch(steps_of(1, step))
    inserted = replay.inserts()
    replay.clear()
    assert replay.size() == 0
    assert all(leaf.size == 0 for leaf in tf.nest.flatten(replay.single_pass()))
    assert replay.inserts() == inserted  # the run's count of inserts goes on
    # Nothing from before the clear comes back, not even inside a window.
    for step in range(10, 13):
        replay.add_batch(steps_of(1, step))
    assert values(replay.single_pass()).min() == 10
    assert values(replay.get_next(sample_batch_size=50, num_steps=2)[0]).min() == 10


# ---------------------------------------------------------------------------- 4. smoke training


@pytest.mark.parametrize("backend", BACKENDS)
def test_smoke_training_completes(tmp_path, backend):
    """C51 on each backend (its windows, loss, evaluation, exports and diagnostics through the replay; DQN's
    runs on each backend: test_learning.py, test_py_driver.py, test_targets.py, the smoke run)."""
    # In this process, through the Python API (the command line's run in a process of its own is tested elsewhere).

    sampling = "dataset" if backend == "reverb" else "direct"  # Reverb is only read through tf.data
    run = dq.train(os.path.join(CONFIGS, "smoke.yaml"), tmp_path / "run", progress=False, overrides={
        "replay.backend": backend, "replay.sampling": sampling, "video.enabled": False,
        **dict(s.split("=") for s in C51_SETS)})
    run_dir = run.path
    assert run.summary["exit_status"] == 0
    with open(os.path.join(run_dir, "train_metrics.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    last = rows[-1]
    inserts, samples = int(last["replay_inserts"]), int(last["replay_samples"])
    # Inserts count boundary steps too (env_steps does not); Reverb's first window needs 2 steps.
    assert 0 < int(last["replay_size"]) <= inserts and inserts >= int(last["env_steps"]) - 1
    if backend == "reverb":  # the server's count: prefetched items too
        assert samples >= int(last["train_step"]) * 32
    else:
        assert samples == int(last["train_step"]) * 32
    assert last["policy_lag"] == "" and rows[0]["train_steps_per_s"] == ""  # one process: no lag; no rate yet
    assert float(last["train_steps_per_s"]) > 0
    assert float(last["samples_per_insert"]) == pytest.approx(samples / inserts, rel=1e-4)
    assert run.config.agent.kind == "c51"
    check_c51_run(run_dir)


# ---------------------------------------------------------------------------- the specs command


def test_specs_command_walks_through_the_data(capsys):
    # In this process (the command line's parsing and dispatch, without a second TensorFlow import).
    from dqn_cartpole.cli.main import main

    status = main(["specs", "--config", os.path.join(CONFIGS, "smoke.yaml"), "--set", "replay.backend=tf_uniform"])
    out, err = capsys.readouterr()
    assert status == 0, err[-3000:]
    for heading in ("time_step_spec", "action_spec", "collect_data_spec", "get_next(sample_batch_size=10, num_steps=1)",
                    "as_dataset(sample_batch_size=4, num_steps=2)", "single pass"):
        assert heading in out
    assert "observation" in out and "[10, 1, 4]" in out and "[4, 2, 4]" in out


def test_a_write_held_back_by_the_ratio_is_given_up_on_when_asked():
    """A collector must be able to leave while a samples-per-insert ratio holds its writes back (the learner
    has stopped sampling, reverb#144): the wait ends within a slice of the request, and the writer closes."""
    import threading
    import time

    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import policy_step, time_step as ts, trajectory as trajectory_lib

    from dqn_cartpole.replay.reverb_writers import WriterInterrupted
    from dqn_cartpole.replay.reverb_tables import SampleRatio

    observation = ts.time_step_spec(tf.TensorSpec([4], tf.float32))
    action = policy_step.PolicyStep(action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1), state=(), info=())
    spec = trajectory_lib.from_transition(observation, action, observation)
    config = ReplayConfig(backend="reverb", capacity=1000)
    with contextlib.ExitStack() as stack:
        server = build.start_replay_server(config, spec, 2, stack, ratio=SampleRatio(4.0, 2, 4.0))
        replay = build.make_replay_client(config, spec, 1, 2, f"localhost:{server.port}", stack)
        asked = threading.Event()
        replay.give_up_waiting_when(asked.is_set)
        threading.Timer(1.0, asked.set).start()
        started = time.monotonic()
        with pytest.raises(WriterInterrupted):
            # Far more windows than the ratio lets in without a sample: the writer waits once 32 are pending.
            for batch in cartpole_steps(1, 50):
                replay.add_batch(batch)
            replay.flush()
        assert 0.9 < time.monotonic() - started < 5
        assert replay.client.server_info()["uniform_table"].current_size < 49  # it was really held back
    # The ExitStack closed the writers and stopped the server without waiting on the held items.


def test_a_held_back_writer_never_lets_reverb_warn_of_pending_items():
    """Reverb's trajectory writer warns "The number of pending items is alarmingly high, did you forget to call
    Flush?" once about 50 items wait for the server's confirmation; the notebook's Reverb cells printed it on a busy
    machine, where the server confirmed slowly. A window is an item in each of the replay's two tables, so the writer
    bounds the items, not the windows, that wait: with both tables holding every insert back (a ratio nothing
    samples), it stops before Reverb would warn."""
    import tempfile
    import time

    import reverb

    from dqn_cartpole.replay.reverb_writers import WindowWriter, WriterInterrupted

    def held_back(name: str):
        return reverb.Table(name, reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                            reverb.rate_limiters.SampleToInsertRatio(1.0, 1, 2.0))

    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)  # Reverb's C++ log, written from its writer's own thread
        try:
            server = reverb.Server([held_back("uniform"), held_back("pass")], port=None)
            writer = WindowWriter(reverb.Client(f"localhost:{server.port}"), 2, ("uniform", "pass"), None)
            writer.give_up_when(lambda: True)  # the first wait on the server ends the writing
            with pytest.raises(WriterInterrupted):
                for step in range(100):
                    writer.append(np.array([step], np.float32), False, lambda: 0)
            time.sleep(1.0)  # the writer's worker has sent what it could, and logged
            writer.close()  # drops the items held back
            server.stop()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        log = captured.read().decode(errors="replace")
    assert "Started replay server" in log  # the capture works
    assert "alarmingly high" not in log, log[-2000:]


def test_packed_steps_come_back_exactly_whatever_their_dtypes():
    """Reverb stores each step as one row of bytes (replay.packing): every dtype and shape round-trips, in the graph
    and in numpy, for a batch of windows."""
    from dqn_cartpole.replay.packing import StepPacker

    spec = {"flag": tf.TensorSpec([], tf.bool), "pixels": tf.TensorSpec([2, 3], tf.uint8),
            "step": tf.TensorSpec([], tf.int64), "nested": (tf.TensorSpec([4], tf.float32),
                                                            tf.TensorSpec([1], tf.float64), tf.TensorSpec([], tf.int32))}
    rng = np.random.default_rng(0)

    def step(i: int) -> list:  # the fields in tf.nest.flatten order, as the writers hand them over
        return tf.nest.flatten({"flag": np.bool_(i % 2), "pixels": rng.integers(0, 256, (2, 3)).astype(np.uint8),
                                "step": np.int64(2**40 + i), "nested": (rng.normal(size=4).astype(np.float32),
                                                                        rng.normal(size=1), np.int32(-i))})

    packer = StepPacker(spec)
    steps = [step(i) for i in range(6)]
    rows = np.stack([packer.pack(s) for s in steps]).reshape(2, 3, packer.nbytes)  # 2 windows of 3 steps
    assert rows.dtype == np.uint8 and packer.nbytes == 1 + 6 + 8 + 16 + 8 + 4
    for unpacked in (packer.unpack(tf.constant(rows)), packer.unpack_numpy(rows)):
        flat = [np.asarray(leaf) for leaf in tf.nest.flatten(unpacked)]
        for field, leaf in enumerate(flat):
            expected = np.stack([s[field] for s in steps]).reshape((2, 3) + np.shape(steps[0][field]))
            assert leaf.dtype == expected.dtype
            np.testing.assert_array_equal(leaf, expected)
