"""Prioritized replay (`replay.prioritized`): sampling in proportion to p^alpha on both backends that keep priorities,
the importance weights and their place in the loss, the priorities the learner writes back after a train step, the
priority new items enter at, and what a checkpoint keeps of them. All in-process, on hand-made windows."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats
from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib

from helpers import SMOKE

from dqn_cartpole.config import ReplayConfig, load_config
from dqn_cartpole.core import build
from dqn_cartpole.distributed import parts
from dqn_cartpole.errors import ConfigError
from dqn_cartpole.replay import reverb_tables
from dqn_cartpole.replay.prioritized import beta_schedule, importance_weights
from dqn_cartpole.training.prioritized import prioritized_update

SPEC = (tf.TensorSpec([2], tf.float32, "value"),)  # each step's value names it
PRIORITIES = np.array([1.0, 2.0, 4.0, 8.0, 16.0])  # of the windows that start at steps 0..4
DRAWS = 4000


def replay_of(stack: contextlib.ExitStack, backend: str, alpha: float, capacity: int = 100, window: int = 2):
    config = ReplayConfig(backend=backend, capacity=capacity, prioritized=True, priority_exponent=alpha)
    return build.make_replay_buffer(config, SPEC, 1, window, stack)


def add_steps(replay, values) -> None:
    for value in values:
        replay.add_batch((np.full((1, 2), value, np.float32),))


def drawn_values(replay, batches: int, batch_size: int = 100) -> np.ndarray:
    """The first step's value of every window a fresh prioritized sampler draws (with its keys)."""
    sample = replay.prioritized_sampler(batch_size, 2)
    values, keys = [], []
    for _ in range(batches):
        batch = sample()
        values.append(np.asarray(batch.items[0])[:, 0, 0])
        keys.append(np.asarray(batch.keys))
    return np.concatenate(values), np.concatenate(keys)


def set_known_priorities(replay) -> None:
    """Priorities PRIORITIES[v] for the window that starts at step v, written through `update_priorities`."""
    values, keys = drawn_values(replay, 2)  # all five windows, at equal priorities so far
    key_of = {int(v): k for v, k in zip(values, keys)}
    assert sorted(key_of) == list(range(len(PRIORITIES)))
    keys = np.array([key_of[v] for v in range(len(PRIORITIES))])
    replay.update_priorities(tf.constant(keys), tf.constant(PRIORITIES))


@pytest.mark.parametrize("backend", ["py_uniform", "reverb"])
@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_windows_are_drawn_in_proportion_to_priority_to_the_alpha(backend, alpha):
    np.random.seed(0)
    with contextlib.ExitStack() as stack:
        replay = replay_of(stack, backend, alpha)
        add_steps(replay, range(len(PRIORITIES) + 1))  # 6 steps: 5 whole windows of 2
        set_known_priorities(replay)
        values, _ = drawn_values(replay, DRAWS // 100)
    counts = np.bincount(values.astype(int), minlength=len(PRIORITIES))
    expected = PRIORITIES ** alpha / np.sum(PRIORITIES ** alpha) * len(values)
    assert stats.chisquare(counts, expected).pvalue > 1e-3, (counts, expected)


def test_importance_weights_of_a_hand_made_table():
    # N = 4 items drawn with P = .1, .2, .3, .4 at beta 0.5: (N P)^-beta = .4^-.5, .8^-.5, 1.2^-.5, 1.6^-.5,
    # divided by the largest, .4^-.5 = 1.5811.
    weights = importance_weights(tf.constant([0.1, 0.2, 0.3, 0.4], tf.float64), tf.constant(4, tf.int64), 0.5)
    np.testing.assert_allclose(weights.numpy(), [1.0, 0.70710678, 0.57735027, 0.5], rtol=1e-6)
    config = ReplayConfig(importance_exponent=0.4, importance_anneal_steps=100)
    assert [float(beta_schedule(config, tf.constant(s))) for s in (0, 50, 100, 500)] == pytest.approx(
        [0.4, 0.7, 1.0, 1.0])


# ---------------------------------------------------------------------------- one train step, by hand


def agent_and_replay(stack: contextlib.ExitStack, kind: str, backend: str = "py_uniform", remote_of: list = None):
    """An agent on CartPole (n_step 1) and a prioritized replay (alpha 1) holding six hand-made steps (py_uniform: at
    unequal priorities). With `remote_of` (reverb), the replay is a learner's client (`remote`) of a server appended
    to that list."""
    config_path, kind_sets = (SMOKE, [f"agent.kind={kind}"]) if kind != "c51" else (None, ["agent.kind=c51",
                                                                                            "agent.n_step=1"])
    config = load_config(config_path, kind_sets + [f"replay.backend={backend}", "replay.prioritized=true",
                                                   "replay.priority_exponent=1.0", "replay.priority_epsilon=0.01",
                                                   "replay.importance_exponent=0.5"])
    _, _, agent = parts.agent_with_envs(config, 1, 0, stack)
    if remote_of is None:
        replay = build.make_replay(config, agent, stack)
    else:
        remote_of.append(build.start_replay_server(config.replay, agent.collect_data_spec, 2, stack))
        replay = build.make_replay_client(config.replay, agent.collect_data_spec, 1, 2, remote_of[-1].address, stack,
                                          remote=True)
    rng = np.random.default_rng(0)
    spec = agent.collect_data_spec
    for step in range(6):  # rewards of +-5: TD errors of both signs, well above the initial largest priority, 1
        replay.add_batch(trajectory_lib.Trajectory(
            step_type=np.array([ts.StepType.MID], np.int32), observation=rng.normal(size=(1, 4)).astype(np.float32),
            action=rng.integers(0, 2, size=(1,)).astype(spec.action.dtype.as_numpy_dtype), policy_info=(),
            next_step_type=np.array([ts.StepType.MID], np.int32), reward=np.array([5.0 * (-1) ** step], np.float32),
            discount=np.array([1.0], np.float32)))
    if backend == "py_uniform":  # unequal priorities (all under the TD errors to come): the weights differ
        replay.update_priorities(np.arange(5), np.array([0.5, 1.0, 1.5, 2.0, 3.0]))
    return config, agent, replay


def hand_computed_priorities(agent, kind: str, items) -> np.ndarray:
    """|r + gamma Q'(s', a') - Q(s, a)| (DQN) or the cross-entropy of Q(s, a)'s atoms against the projected target
    (C51), from the agent's weights before the step."""
    observations = items.observation[:, 0]
    actions = tf.cast(items.action[:, 0], tf.int32)
    if kind == "c51":
        _, target = agent.tf_agent.target_distribution(items)
        logits, _ = agent.q_network(observations)
        chosen = tf.gather(logits, actions, axis=1, batch_dims=1)
        return tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=chosen).numpy()
    _, targets = agent.tf_agent.td_targets(items)
    q, _ = agent.q_values(observations)
    delta = targets.numpy() - tf.gather(q, actions, axis=1, batch_dims=1).numpy()
    return np.abs(delta)


@pytest.mark.parametrize("kind", ["dqn", "c51"])
def test_one_train_step_writes_each_items_new_priority_and_new_items_enter_at_the_largest(kind):
    np.random.seed(1)
    with contextlib.ExitStack() as stack:
        config, agent, replay = agent_and_replay(stack, kind)
        batch = replay.prioritized_sampler(8, agent.window_length)()
        expected = hand_computed_priorities(agent, kind, batch.items) + 0.01
        weights = importance_weights(batch.probabilities, batch.table_size, 0.5).numpy()
        per_item_before = expected - 0.01
        loss = prioritized_update(agent, replay, config.replay)(batch)[0]

        buffer = replay.buffer
        slots = np.asarray(batch.keys) % buffer._capacity  # nothing evicted: ids are slots
        np.testing.assert_allclose(buffer.tree.get(slots), expected, rtol=1e-4)  # alpha 1: the leaves are p
        # The loss is the importance-weighted mean of the items' losses (DQN: squared TD errors).
        per_item = per_item_before ** 2 if kind == "dqn" else per_item_before
        np.testing.assert_allclose(float(loss), np.mean(weights * per_item), rtol=1e-4)
        assert not np.allclose(weights, 1.0)  # the weights matter in this batch

        largest = float(expected.max())
        assert largest > 3.0  # the largest seen comes from this step (and is not 1)
        add_steps_like(replay, agent)
        newest_start = (buffer._np_state.item_count - 2) % buffer._capacity
        assert buffer.tree.get([newest_start])[0] == pytest.approx(largest)


def add_steps_like(replay, agent) -> None:
    spec = agent.collect_data_spec
    replay.add_batch(trajectory_lib.Trajectory(
        step_type=np.array([ts.StepType.MID], np.int32), observation=np.zeros((1, 4), np.float32),
        action=np.zeros((1,), spec.action.dtype.as_numpy_dtype), policy_info=(),
        next_step_type=np.array([ts.StepType.MID], np.int32), reward=np.array([5.0], np.float32),
        discount=np.array([1.0], np.float32)))


def test_dqn_priorities_are_absolute_td_errors():
    """The batch of the step above holds TD errors of both signs, so a signed priority could not pass."""
    np.random.seed(1)
    with contextlib.ExitStack() as stack:
        config, agent, replay = agent_and_replay(stack, "dqn")
        batch = replay.prioritized_sampler(8, agent.window_length)()
        _, targets = agent.tf_agent.td_targets(batch.items)
        q, _ = agent.q_values(batch.items.observation[:, 0])
        delta = targets.numpy() - tf.gather(q, tf.cast(batch.items.action[:, 0], tf.int32), axis=1, batch_dims=1)
        assert (np.asarray(delta) < 0).any() and (np.asarray(delta) > 0).any()
        prioritized_update(agent, replay, config.replay)(batch)
        leaves = replay.buffer.tree.get(np.asarray(batch.keys) % replay.buffer._capacity)
        np.testing.assert_allclose(leaves, np.abs(delta) + 0.01, rtol=1e-4)


def test_reverb_priorities_are_written_back_inside_the_compiled_call():
    """As the compiled loop runs it: sample, step and write-back in one graph (the client op made in that graph)."""
    with contextlib.ExitStack() as stack:
        config, agent, replay = agent_and_replay(stack, "dqn", backend="reverb")
        sample, update = replay.prioritized_sampler(4, 2), prioritized_update(agent, replay, config.replay)

        @tf.function(autograph=False)
        def step():
            batch = sample()
            return update(batch), batch.keys

        _, keys = step()
        written = {}
        for item in replay.client.sample(reverb_tables.TABLE_NAME, num_samples=300, emit_timesteps=False):
            written[int(item.info.key)] = float(item.info.priority)
        assert len(written) == 5  # every window seen
        assert all(written[int(k)] > 3.0 for k in keys.numpy())  # |TD error| ~ 5 + epsilon, where 1 was
        assert sorted(written.values())[0] == 1.0  # the windows not sampled keep theirs
        assert float(replay.max_priority.numpy()) == max(written.values())


def test_a_learner_writes_priorities_to_another_processs_server_from_a_thread_and_never_waits_on_a_gone_one(
        monkeypatch):
    """A learner's client of a standalone server (`remote`) hands each batch's priorities to a thread of their own:
    they reach the table, and with the server gone the compiled step still returns at once (Reverb's in-graph write
    would wait for ever, and no cancellation reaches it); the thread drops the writes it cannot make."""
    import time

    from dqn_cartpole.replay import deadlines

    with contextlib.ExitStack() as stack:
        servers = []
        config, agent, replay = agent_and_replay(stack, "dqn", backend="reverb", remote_of=servers)
        sample, update = replay.prioritized_sampler(4, 2), prioritized_update(agent, replay, config.replay)
        batch = sample()
        @tf.function(autograph=False)
        def write(keys, priorities):
            replay.update_priorities(keys, priorities)

        write(batch.keys, tf.constant([5.0, 6.0, 7.0, 8.0], tf.float64))
        deadline = time.monotonic() + 10
        while replay.background.written < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        written = {}
        for item in replay.client.sample(reverb_tables.TABLE_NAME, num_samples=300, emit_timesteps=False):
            written[int(item.info.key)] = float(item.info.priority)
        expected = dict(zip(np.asarray(batch.keys).tolist(), [5.0, 6.0, 7.0, 8.0]))  # a key drawn twice: its last
        assert {key: written[key] for key in expected} == expected and sorted(written.values())[0] == 1.0
        update(sample())  # the update of the compiled step goes the same way
        deadline = time.monotonic() + 10
        while replay.background.written < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert replay.background.written == 2 and replay.background.dropped == 0

        monkeypatch.setattr(deadlines, "CALL_TIMEOUT_S", 0.5)
        servers[0].stop()
        started = time.monotonic()
        write(batch.keys, tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64))
        assert time.monotonic() - started < 0.5  # handed over, not written
        while replay.background.dropped < 1 and time.monotonic() - started < 10:
            time.sleep(0.05)
        assert replay.background.dropped == 1


# ---------------------------------------------------------------------------- what a checkpoint keeps


def test_reverb_new_items_enter_at_the_largest_priority_and_the_table_keeps_it(tmp_path):
    with contextlib.ExitStack() as stack:
        replay = replay_of(stack, "reverb", 1.0)
        add_steps(replay, range(len(PRIORITIES) + 1))
        set_known_priorities(replay)
        add_steps(replay, [5.0])  # completes the window that starts at step 5
        replay.flush()
        priorities = {}
        for sample in replay.client.sample(reverb_tables.TABLE_NAME, num_samples=400, emit_timesteps=False):
            (value,) = replay.packer.unpack_numpy(sample.data[0])
            priorities[int(value[0, 0])] = float(sample.info.priority)
        assert float(replay.max_priority.numpy()) == 16.0
        assert max(priorities.values()) == 16.0 and len(priorities) == 6
        assert sorted(priorities.values()) == [1.0, 2.0, 4.0, 8.0, 16.0, 16.0]


def test_py_priorities_and_the_largest_survive_a_checkpoint(tmp_path):
    with contextlib.ExitStack() as stack:
        replay = replay_of(stack, "py_uniform", 1.0)
        add_steps(replay, range(len(PRIORITIES) + 1))
        set_known_priorities(replay)
        checkpoint = tf.train.Checkpoint(replay=replay.buffer, **replay.priority_trackables())
        path = checkpoint.write(str(tmp_path / "ckpt"))
        leaves = replay.buffer.tree.get(np.arange(5)).copy()
        fresh = replay_of(stack, "py_uniform", 1.0)
        tf.train.Checkpoint(replay=fresh.buffer, **fresh.priority_trackables()).read(path).assert_consumed()
        np.testing.assert_array_equal(fresh.buffer.tree.get(np.arange(5)), leaves)
        assert sorted(leaves) == sorted(PRIORITIES) and fresh.buffer.max_priority == 16.0
        add_steps(fresh, [6.0])
        assert fresh.buffer.tree.get([5])[0] == 16.0


# ---------------------------------------------------------------------------- bad input


def test_tf_uniform_refuses_prioritized_replay_in_one_line():
    with pytest.raises(ConfigError, match=r"replay.prioritized: tf_uniform samples uniformly and keeps no "
                                          r"priorities; use replay.backend: reverb or py_uniform"):
        load_config(None, ["replay.prioritized=true"])


def test_reverb_priorities_and_the_largest_survive_a_checkpoint_and_a_servers_restart(tmp_path):
    """The table checkpoint keeps the priorities. A learner checkpoint moves the table out of the server's folder
    (into ckpt-N/reverb/): a server that starts again within the run gets the newest checkpoint's table back there
    (`restage_newest_table`) instead of starting empty."""
    import os
    import shutil

    from helpers import write_checkpoint

    from dqn_cartpole.run_folder import checkpointing

    config = ReplayConfig(backend="reverb", capacity=100, prioritized=True, priority_exponent=1.0)
    root = str(tmp_path / "checkpoints")
    server_dir = checkpointing.reverb_server_dir(root)
    with contextlib.ExitStack() as stack:
        server = build.start_replay_server(config, SPEC, 2, stack, server_dir)
        replay = build.make_replay_client(config, SPEC, 1, 2, server.address, stack)
        add_steps(replay, range(len(PRIORITIES) + 1))
        set_known_priorities(replay)
        replay.checkpoint()
        saved = tf.train.Checkpoint(**replay.priority_trackables()).write(str(tmp_path / "ckpt"))
    (table,) = os.listdir(server_dir)
    checkpoint = write_checkpoint(root, 100)  # as the learner's checkpoint takes the table
    os.makedirs(os.path.join(checkpoint, checkpointing.REVERB_DIR))
    shutil.move(os.path.join(server_dir, table), os.path.join(checkpoint, checkpointing.REVERB_DIR, table))
    assert checkpointing.restage_newest_table(root) == "ckpt-0000000100"
    assert os.listdir(server_dir) == [table] and checkpointing.restage_newest_table(root) is None  # once
    with contextlib.ExitStack() as stack:  # a new server loads the table checkpoint, a new client the largest
        server = build.start_replay_server(config, SPEC, 2, stack, server_dir)
        replay = build.make_replay_client(config, SPEC, 1, 2, server.address, stack)
        tf.train.Checkpoint(**replay.priority_trackables()).read(saved).assert_consumed()
        assert float(replay.max_priority.numpy()) == 16.0
        values, _ = drawn_values(replay, DRAWS // 100)
    counts = np.bincount(values.astype(int), minlength=len(PRIORITIES))
    assert stats.chisquare(counts, PRIORITIES / PRIORITIES.sum() * len(values)).pvalue > 1e-3, counts


def test_the_train_row_summarises_the_intervals_weights_and_priorities():
    from dqn_cartpole.training.prioritized import IntervalPriorities

    interval = IntervalPriorities(log_interval=4)
    assert interval.row(0, np.array([[0.5, 2.0, 3.0], [0.25, 4.0, 9.0]])) == {
        "importance_weight_min": 0.25, "priority_mean": 3.0, "priority_max": 9.0}
    assert interval.row(2, np.array([[0.75, 6.0, 7.0]]))["priority_mean"] == pytest.approx(4.0)  # same interval
    assert interval.row(4, np.array([[0.9, 1.0, 2.0]])) == {  # a new one
        "importance_weight_min": 0.9, "priority_mean": 1.0, "priority_max": 2.0}


def test_the_topologies_and_the_roles_refuse_prioritized_replay_on_the_learners_own_buffer_in_one_line(tmp_path,
                                                                                                       capsys):
    """`--topology local/ray`, and each role started by hand (a learner used to wait for data, then crash), before
    anything is made: the learner's own buffer (distributed.replay: learner) samples uniformly. The server's shared
    table (`server`) prioritizes."""
    from dqn_cartpole.cli.main import main
    from dqn_cartpole.distributed import launcher
    from dqn_cartpole.errors import UserError

    config = load_config(None, ["replay.backend=reverb", "replay.prioritized=true"])
    for topology in ("local", "ray"):
        with pytest.raises(UserError, match=rf"^replay.prioritized: --topology {topology} keeps the replay in the "
                                            r"learner's own buffer \(distributed.replay: learner\), which samples "
                                            r"uniformly; set distributed.replay: server"):
            launcher.local_config(config, str(tmp_path), None, topology)
        server = load_config(None, ["replay.backend=reverb", "replay.prioritized=true", "distributed.replay=server"])
        assert launcher.local_config(server, str(tmp_path), None, topology) is server
    run_dir = tmp_path / "run"
    for role in ("replay-server", "collect", "evaluate-live", "learn"):
        capsys.readouterr()
        assert main([role, "--config", SMOKE, "--set", "replay.backend=reverb", "--set", "replay.prioritized=true",
                     "--replay-address", "localhost:1", "--run-dir", str(run_dir)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines == [f"error: replay.prioritized: the {role} role keeps the replay in the learner's own buffer "
                         f"(distributed.replay: learner), which samples uniformly; set distributed.replay: server (a "
                         f"prioritized table on the replay server, as Ape-X), or replay.prioritized: false"], lines
        assert not run_dir.exists()


def by_hand_actor_priorities(weights: list, windows, gamma: float, epsilon: float) -> np.ndarray:
    """|r + gamma d max_a Q(s', a) - Q(s, a)| + epsilon of 2-step windows, in NumPy from the online weights alone (a
    Dense ReLU layer, then the Q-values): the network is its own target; 0 + epsilon for a window that starts at a
    LAST step."""
    def q(observations):
        hidden = np.maximum(observations @ weights[0] + weights[1], 0.0)
        return hidden @ weights[2] + weights[3]

    first, second = windows.observation[:, 0].astype(np.float64), windows.observation[:, 1].astype(np.float64)
    actions = windows.action[:, 0].astype(np.int64)
    target = windows.reward[:, 0] + gamma * windows.discount[:, 0] * q(second).max(axis=1)
    delta = target - q(first)[np.arange(len(actions)), actions]
    return np.where(windows.step_type[:, 0] == ts.StepType.LAST, 0.0, np.abs(delta)) + epsilon


def test_a_collector_writes_each_window_at_its_own_priority_from_the_weights_it_pulled():
    """Ape-X: the compiled collector's windows enter the server's prioritized table at |TD error| + epsilon computed
    from the weights it pulled (the learner's, not its own initial ones: its target network is a copy of them), not
    at 1 or at the largest seen."""
    import threading
    import time

    import reverb

    from dqn_cartpole.console import signals
    from dqn_cartpole.distributed import collector, status
    from dqn_cartpole.distributed.variables import WeightPusher, WeightSync, make_variables_table
    from dqn_cartpole.replay.packing import StepPacker

    config = load_config(SMOKE, ["replay.backend=reverb", "replay.prioritized=true", "distributed.replay=server",
                                 "distributed.weight_refresh_steps=20", "replay.priority_epsilon=0.01"])
    with contextlib.ExitStack() as stack:
        _, _, learner = parts.agent_with_envs(config, 1, 0, stack)
        env, tf_env, agent = parts.agent_with_envs(config, 1, 1, stack)
        spec = agent.collect_data_spec
        server = build.start_replay_server(config.replay, spec, agent.window_length, stack,
                                           extra_tables=[make_variables_table(learner), *status.make_tables()],
                                           replay_tables=build.distributed_replay_tables(config, spec))
        client = reverb.Client(server.address)
        for variable in learner.q_network.variables:  # weights far from the collector's own initial ones
            variable.assign(variable * 3.0 + 0.1)
        pusher = WeightPusher(WeightSync(server.address, learner), every_steps=1000)
        stack.callback(pusher.close)
        pusher.push_now()
        replay = build.make_stream_writers(config, spec, server.address, stack,
                                           collector.actor_priorities(agent, config))
        driver = collector.CompiledCollectorDriver(env, tf_env, agent.collect_policy, replay.add_batch, 20)
        stop = signals.StopRequest()
        thread = threading.Thread(target=collector.run_driver, args=(driver, WeightSync(server.address, agent),
                                                                     lambda row: None, stop, replay), daemon=True)
        thread.start()
        table = lambda: client.server_info()[reverb_tables.TABLE_NAME]  # noqa: E731
        deadline = time.monotonic() + 60
        while table().current_size < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        status.publish_stop(client, 0, solved=False)
        thread.join(30)
        assert not thread.is_alive(), "the collector did not leave on the run's stop"
        assert table().current_size >= 100
        sampled = {}
        for item in client.sample(reverb_tables.TABLE_NAME, num_samples=400, emit_timesteps=False):
            sampled[int(np.squeeze(item.info.key))] = (float(np.squeeze(item.info.priority)), item.data[0])
        priorities = np.array([priority for priority, _ in sampled.values()])
        windows = StepPacker(spec).unpack_numpy(np.stack([window for _, window in sampled.values()]))
        expected = by_hand_actor_priorities([v.numpy() for v in learner.q_network.variables], windows,
                                            config.agent.gamma, 0.01)
        np.testing.assert_allclose(priorities, expected, rtol=1e-4, atol=1e-5)
        assert len(sampled) > 20 and np.ptp(priorities) > 0.1 and (priorities != 1.0).all()
