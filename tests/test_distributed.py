"""The roles as real processes over loopback: the one-line errors (wrong address, port in use); train --topology
local end to end is tests/test_chaos.py's run, which also checks what every local run's files hold (the learner-side
replay read at the run's ratio, policy lag, the collectors' rows, events and plot), and kills each role. (A stop
signal's path: the launcher's in tests/test_processes.py and tests/test_topology_policy.py, the learner's, which
checkpoints, in tests/test_ray_topology.py's Ctrl-C and tests/test_bounded_waits.py.) Every test is bounded in time and checks that no
child process and no port is left behind. Then, in this process, the learner's parts: its replay read from a
queue at the run's ratio, in its checkpoint, and its background weight pushes and evaluator watch; and a
collector's loop (both drivers) and the live evaluator against an embedded server.
(tests/test_netns.py runs the shared replay on the server, across network namespaces.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from helpers import SMOKE, cartpole_agent, free_port, rows, run_cli, wait_for

LOCAL = ("--topology", "local", "--collectors", "2", "--config", SMOKE, "--set", "replay.backend=reverb",
         "--set", "video.enabled=false", "--quiet")


def test_wrong_replay_address_is_one_line_within_seconds(tmp_path, capsys):
    """In this process (TensorFlow is imported already): the role builds its agent, then asks the server."""
    from dqn_cartpole.cli.main import main

    started = time.monotonic()
    status = main(["collect", "--config", SMOKE, "--set", "replay.backend=reverb", "--set",
                   "distributed.connect_timeout_s=2", "--replay-address", f"localhost:{free_port()}",
                   "--run-dir", str(tmp_path / "run")])
    assert status == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --replay-address localhost:"), lines
    assert "no Reverb server answered within 2 s" in lines[0]
    assert time.monotonic() - started < 30  # the agent's build, then 2 s


def test_a_role_sees_a_server_that_starts_after_it_asked_at_once():
    """check_server waits for the port before it opens its gRPC channel: a channel opened earlier would retry on
    gRPC's reconnect backoff and see the server up to a second or more late."""
    import threading

    import reverb

    from dqn_cartpole.distributed.variables import check_server

    port, started = free_port(), {}

    def serve() -> None:
        time.sleep(2.0)
        started["server"] = reverb.Server([reverb.Table.queue("q", 10)], port=port)
        started["at"] = time.monotonic()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        check_server(f"localhost:{port}", 30)
        late_s = time.monotonic() - started["at"]
    finally:
        thread.join()
        if "server" in started:  # a failed start must not hide check_server's own error
            started["server"].stop()
    assert late_s < 0.5, late_s  # 0.8-0.9 s with the channel opened first


def test_a_port_in_use_is_one_line(tmp_path):
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as holder:
        holder.bind(("::", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = run_cli("replay-server", "--config", SMOKE, "--set", "replay.backend=reverb",
                         "--replay-address", f"localhost:{port}", "--run-dir", str(tmp_path / "run"), timeout=60)
        local = run_cli("train", *LOCAL, "--output-dir", str(tmp_path / "local"),
                        "--set", f"replay.reverb_port={port}", timeout=60)
    for result in (server, local):
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"port {port} is already in use" in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "local")  # bad input leaves no run folder


# ---------------------------------------------------------------------------- in-process: the learner's parts


def mid_steps(count: int, first: int = 0):
    """`count` MID Trajectory steps of CartPole's spec (one env), observation[0] = the step's number."""
    import numpy as np
    from tf_agents.trajectories import trajectory as trajectory_lib

    for i in range(first, first + count):
        yield trajectory_lib.mid(observation=np.full([1, 4], i, np.float32), action=np.zeros([1], np.int64),
                                 policy_info=(), reward=np.ones([1], np.float32), discount=np.ones([1], np.float32))


def queue_and_writers(stack, max_size: int) -> tuple:
    """An embedded server with a queue of `max_size` 2-step windows, and a collector's writers into it:
    (agent, data spec, replay config, server, writers)."""
    import reverb

    from dqn_cartpole.config import ReplayConfig
    from dqn_cartpole.core import build
    from dqn_cartpole.replay import reverb_tables
    from dqn_cartpole.replay.reverb_writers import StreamWriters

    _, agent = cartpole_agent(stack)
    spec, config = agent.collect_data_spec, ReplayConfig(backend="reverb", capacity=100)
    server = build.start_replay_server(config, spec, 2, stack, replay_tables=[
        reverb_tables.make_queue_table(spec, 2, max_size=max_size)])
    writers = StreamWriters(reverb.Client(server.address), spec, 1, 2, (reverb_tables.QUEUE_TABLE_NAME,))
    stack.callback(writers.close)
    return agent, spec, config, server, writers


def test_the_learner_side_replay_reads_what_the_ratio_asks_with_the_tags_and_the_collector_waits_when_full():
    import contextlib
    import threading

    import numpy as np
    import reverb
    import tensorflow as tf

    from dqn_cartpole.replay import reverb_tables
    from dqn_cartpole.replay.learner_side import LearnerRatio, LearnerSideReplay, QueueReader
    from dqn_cartpole.replay.reverb_writers import WriterInterrupted

    with contextlib.ExitStack() as stack:
        _, spec, config, server, writers = queue_and_writers(stack, max_size=8)
        # The collector: items of the weights of train step 7, then of step 9, until the queue is full.
        asked = threading.Event()
        writers.give_up_waiting_when(asked.is_set)
        writers.tag_items(7)
        for batch in mid_steps(6):  # 5 windows of 2 steps
            writers.add_batch(batch)
        writers.tag_items(9)
        for batch in mid_steps(20, first=6):  # 20 more: the queue takes 3, then the writer waits
            writers.add_batch(batch)
        threading.Timer(1.0, asked.set).start()
        with pytest.raises(WriterInterrupted):
            writers.flush()
        queued = reverb.Client(server.address).server_info()[reverb_tables.QUEUE_TABLE_NAME].current_size
        assert queued == 8

        # The learner: 4 items first, then one per 32 sampled items (a batch of 64 asks for 2 more).
        train_step = tf.Variable(0, dtype=tf.int64)
        reader = QueueReader(server.address, spec, 2, rate_limiter_timeout_ms=5_000)
        replay = LearnerSideReplay(spec, config, 2, reader, LearnerRatio(32.0, 4, 64), train_step)
        stack.callback(replay.close)
        assert replay.fill(lambda: False) and replay.inserts() == 4
        sample = replay.sampler(64, 2, with_tags=True)
        windows, tags = sample()
        assert replay.inserts() == 6 == replay.size()  # due(1) = 4 + 64 / 32
        first = np.asarray(windows.observation)[:, 0, 0]
        # every item can be drawn (64 uniform draws miss one of 6 once in about 19,000 runs), as whole windows
        assert set(first.tolist()) == set(range(6)) and np.all(np.asarray(windows.observation)[:, 1, 0] == first + 1)
        np.testing.assert_array_equal(np.asarray(tags), np.where(first < 5, 7.0, 9.0))  # the tags came along
        train_step.assign(1)
        sample()
        assert replay.inserts() == 8  # due(2) = 4 + 128 / 32: the FIFO order kept
        np.testing.assert_array_equal(np.asarray(replay.single_pass().observation)[:, 0, 0], np.arange(8))


def test_the_learner_side_replay_reads_the_queue_in_whole_batches_in_order_and_never_below_the_ratio():
    import contextlib

    import numpy as np
    import tensorflow as tf

    from dqn_cartpole.replay.learner_side import LearnerRatio, LearnerSideReplay, QueueReader

    with contextlib.ExitStack() as stack:
        _, spec, config, server, writers = queue_and_writers(stack, max_size=100)
        writers.tag_items(3)
        for batch in mid_steps(41):  # 40 windows of 2 steps
            writers.add_batch(batch)
        writers.flush()
        train_step = tf.Variable(0, dtype=tf.int64)
        reader = QueueReader(server.address, spec, 2, rate_limiter_timeout_ms=5_000, read_batch=4)
        replay = LearnerSideReplay(spec, config, 2, reader, LearnerRatio(64.0, 5, 64), train_step)
        stack.callback(replay.close)
        assert replay.fill(lambda: False) and replay.inserts() == 8  # 5 due: two whole reads of 4
        sample = replay.sampler(64, 2, with_tags=True)
        held = []
        for step in range(8):  # due(step + 1) = 5 + step + 1
            train_step.assign(step)
            _, tags = sample()
            held.append(replay.inserts())
            np.testing.assert_array_equal(np.asarray(tags), 3.0)
        assert held == [8, 8, 8, 12, 12, 12, 12, 16], held  # >= due (6, 7, ..., 13), in reads of 4, none skipped
        np.testing.assert_array_equal(np.asarray(replay.single_pass().observation)[:, 0, 0], np.arange(16))


def test_the_learner_side_replay_is_in_the_learners_checkpoint(tmp_path):
    import contextlib

    import numpy as np
    from tf_agents.metrics import tf_metrics

    from dqn_cartpole.replay.learner_side import READ_AHEAD, LearnerRatio, LearnerSideReplay, QueueReader
    from dqn_cartpole.run_folder import checkpointing

    with contextlib.ExitStack() as stack:
        agent, spec, config, server, writers = queue_and_writers(stack, max_size=100)
        for batch in mid_steps(31):
            writers.add_batch(batch)
        writers.flush()

        def learner_replay() -> LearnerSideReplay:
            reader = QueueReader(server.address, spec, 2, rate_limiter_timeout_ms=5_000)
            replay = LearnerSideReplay(spec, config, 2, reader, LearnerRatio(64.0, 12, 64), agent.train_step_counter)
            stack.callback(replay.close)
            return replay

        replay = learner_replay()
        assert replay.fill(lambda: False) and replay.inserts() == 12
        root = str(tmp_path / "checkpoints")
        os.makedirs(root)
        writer = checkpointing.CheckpointWriter(root, agent, tf_metrics.EnvironmentSteps(), replay, keep=2)
        saved = writer.save(12, {"replay_size": replay.size()}, {})
        restored = learner_replay()  # a new learner: an empty buffer until the checkpoint is read
        assert restored.size() == 0
        checkpointing.CheckpointWriter(root, agent, tf_metrics.EnvironmentSteps(), restored, keep=2).restore(
            checkpointing.Found(saved.path, 12, {}))
        assert restored.size() == 12 and restored.inserts() == 12
        np.testing.assert_array_equal(np.asarray(restored.single_pass().observation)[:, 0, 0], np.arange(12))
        # It reads on from the queue, in order, after the items the first learner's reader had in flight (lost
        # with it: READ_AHEAD requested, and as many more that Reverb's worker may hold; seen: 8 and 12).
        restored.read(3)
        read_on = np.asarray(restored.single_pass().observation)[-3:, 0, 0]
        assert 12 <= read_on[0] <= 12 + 2 * READ_AHEAD and np.all(np.diff(read_on) == 1), read_on


def test_the_learner_pushes_its_weights_in_the_background_and_watches_the_evaluator():
    import contextlib
    import time

    import numpy as np
    import reverb

    from dqn_cartpole.distributed import status
    from dqn_cartpole.distributed.variables import WeightPusher, WeightSync, make_variables_table

    with contextlib.ExitStack() as stack:
        config, learner = cartpole_agent(stack)
        _, collector = cartpole_agent(stack)
        server = reverb.Server([make_variables_table(learner), *status.make_tables()])
        stack.callback(server.stop)
        address = f"localhost:{server.port}"
        pusher = WeightPusher(WeightSync(address, learner), every_steps=5, poll_s=0.005)
        stack.callback(pusher.close)
        assert pusher.push_now() == 0
        pull = WeightSync(address, collector)
        variable = learner.collect_policy.variables()[0]
        variable.assign(variable + 1.0)
        learner.train_step_counter.assign(3)  # fewer than 5 steps since the last push: nothing goes out
        time.sleep(0.3)
        assert pusher.pushes == 1 and pull.pull() == 0
        learner.train_step_counter.assign(5)
        wait_for(lambda: pusher.pushes == 2, 10, "the background push")
        assert pull.pull() == 5
        np.testing.assert_array_equal(collector.collect_policy.variables()[0].numpy(), variable.numpy())
        learner.train_step_counter.assign(6)
        pusher.request()  # an evaluation is due: pushed at once, whatever the interval
        wait_for(lambda: pusher.pushes == 3, 10, "the requested push")

        watch = status.StatusWatch(reverb.Client(address), poll_s=0.05)
        stack.callback(watch.close)
        assert watch.evaluation is None
        status.publish_evaluation(reverb.Client(address), status.Evaluation(500, 600, 123.0, 130.0, 400))
        wait_for(lambda: watch.evaluation is not None, 10, "the watch to read the evaluation")
        assert watch.evaluation.average_return == 123.0 and watch.evaluation.train_step == 500
        assert watch.server_info["variables"].current_size == 1


def test_a_pusher_that_keeps_its_pushes_pushes_what_it_keeps_and_drops_the_oldest_past_its_budget():
    """A learner that holds its solved weights (agent.solved_learning_rate) goes back to the push the evaluator's
    solve check passed: the pusher keeps its newest pushes, exactly as it pushed them (also when the learner trains
    between its read and its push), within `keep_bytes`."""
    import contextlib

    import numpy as np
    import reverb

    from dqn_cartpole.distributed.variables import WeightPusher, WeightSync, make_variables_table

    with contextlib.ExitStack() as stack:
        config, learner = cartpole_agent(stack)
        _, collector = cartpole_agent(stack)
        server = reverb.Server([make_variables_table(learner)])
        stack.callback(server.stop)
        address = f"localhost:{server.port}"
        size = sum(variable.numpy().nbytes for variable in learner.collect_policy.variables())
        pusher = WeightPusher(WeightSync(address, learner), every_steps=1000, poll_s=60.0, keep_bytes=2 * size)
        stack.callback(pusher.close)
        variable = learner.collect_policy.variables()[0]
        for step in (1, 2, 3):
            variable.assign(np.full(variable.shape, float(step), dtype=np.float32))
            learner.train_step_counter.assign(step)
            assert pusher.push_now() == step
        assert list(pusher.kept) == [2, 3] and pusher.pushed(1) is None
        assert len(pusher.pushed(2)) == len(learner.collect_policy.variables())
        np.testing.assert_array_equal(pusher.pushed(2)[0], 2.0)
        assert WeightSync(address, collector).pull() == 3
        np.testing.assert_array_equal(collector.collect_policy.variables()[0].numpy(), pusher.pushed(3)[0])
        plain = WeightPusher(WeightSync(address, learner), every_steps=1000, poll_s=60.0)
        stack.callback(plain.close)
        plain.push_now()
        assert not plain.kept  # none kept by default

        class TrainsWhilePushing(WeightSync):
            """The learner's train step moves the weights right after the pusher's thread read them."""

            def copy(self):
                values = super().copy()
                variable.assign(np.full(variable.shape, 9.0, dtype=np.float32))
                return values

        racing = WeightPusher(TrainsWhilePushing(address, learner), every_steps=1000, poll_s=60.0,
                              keep_bytes=2 * size)
        stack.callback(racing.close)
        variable.assign(np.full(variable.shape, 4.0, dtype=np.float32))
        learner.train_step_counter.assign(4)
        assert racing.push_now() == 4 and WeightSync(address, collector).pull() == 4
        np.testing.assert_array_equal(racing.pushed(4)[0], 4.0)  # what it kept is what it pushed, not the live 9s
        np.testing.assert_array_equal(collector.collect_policy.variables()[0].numpy(), 4.0)


@pytest.mark.parametrize("kept", [True, False])
def test_a_learner_that_trains_on_holds_the_weights_the_evaluators_check_passed_as_it_pushed_them(kept):
    """The evaluator's check passed the weights of train step 1,200 and says so in a later result (train step
    1,500): the learner marks its solve there, takes those weights from its pusher, puts them back and holds them
    (agent.solved_learning_rate 0). When its pusher no longer kept them, it holds its live weights, and says so:
    in its message and in what policy/final records (`held_weights: live`, held since the iteration it began)."""
    import contextlib
    import dataclasses
    from types import SimpleNamespace

    import numpy as np

    from dqn_cartpole.distributed import status
    from dqn_cartpole.distributed.following import FollowEvaluator
    from dqn_cartpole.training.final_policy import AfterSolve, held_since
    from dqn_cartpole.training.state import RunState

    with contextlib.ExitStack() as stack:
        config, agent = cartpole_agent(stack)
        config = dataclasses.replace(config, evaluation=dataclasses.replace(config.evaluation, stop_when_solved=False))
        solved = tuple(np.full(variable.shape, 0.5, dtype=np.float32) for variable in agent.policy.variables())
        live = tuple(variable.numpy() for variable in agent.policy.variables())
        evaluation = status.Evaluation(1500, 1600, 500.0, 500.0, 1500, solved=True, solved_return=500.0,
                                       solved_episodes=100, solved_train_step=1200)
        link = SimpleNamespace(watch=SimpleNamespace(evaluation=evaluation),
                               pusher=SimpleNamespace(pushed={1200: solved}.get if kept else {}.get))
        messages = []
        follower = FollowEvaluator(link)
        session = SimpleNamespace(config=config, state=RunState(iteration=1520),
                                  clock=SimpleNamespace(wall=lambda: 12.0),
                                  progress=SimpleNamespace(message=messages.append),
                                  pipeline=SimpleNamespace(agent=agent), evaluation=follower)
        follower.after_chunk(session, None)
        assert session.state.solved_at_iteration == 1200 and not session.state.stop
        AfterSolve(config, solved_already=False)(session)
        for variable, value in zip(agent.policy.variables(), solved if kept else live):
            np.testing.assert_array_equal(variable.numpy(), value)
        assert float(agent.tf_agent._optimizer.learning_rate.numpy()) == 0.0  # pylint: disable=protected-access
        assert "held to the last step" in messages[-1]
        if kept:
            assert "passed the solve check (iteration 1200)" in messages[-1]
            assert held_since(config, session.state) == {"held_since": 1200}
        else:
            assert any("no longer kept" in m for m in messages) and "the live weights are held" in messages[-1]
            assert held_since(config, session.state) == {"held_since": 1520, "held_weights": "live"}
            assert session.state.resumed_fields()["unchecked_since"] == 1520  # a resumed run still says so


def test_a_pusher_outlives_a_failed_push_and_pushes_again_what_a_restarted_server_lost(monkeypatch):
    """A server restarted on its port holds no weights (collectors wait for them): `repush` pushes even the weights
    of the last push; and a push that fails (the server gone) does not end the pusher: it is tried again."""
    import contextlib

    import reverb

    from dqn_cartpole.distributed import variables
    from dqn_cartpole.distributed.variables import VARIABLES_TABLE, WeightPusher, WeightSync, make_variables_table

    with contextlib.ExitStack() as stack:
        _, learner = cartpole_agent(stack)
        server = reverb.Server([make_variables_table(learner)])
        stack.callback(server.stop)
        sync = WeightSync(f"localhost:{server.port}", learner)
        pusher = WeightPusher(sync, every_steps=1000, poll_s=0.005)
        stack.callback(pusher.close)
        assert pusher.push_now() == 0 and pusher.pushes == 1
        sync.client.reset(VARIABLES_TABLE)  # what the server's restart leaves
        pusher.repush()
        wait_for(lambda: pusher.pushes == 2 and sync.available(), 10, "the weights pushed again")
        real_push, failures = sync.push, []

        def fails_twice() -> None:
            if len(failures) < 2:
                failures.append(1)
                raise variables.deadlines.ServerUnanswered("push the weights: the server is gone")
            real_push()

        monkeypatch.setattr(sync, "push", fails_twice)
        monkeypatch.setattr(variables, "RETRY_S", 0.01)
        sync.client.reset(VARIABLES_TABLE)
        pusher.repush()
        wait_for(lambda: pusher.pushes == 3, 10, "the push after two failed ones")
        assert len(failures) == 2 and pusher.error is None and sync.available()


def test_a_push_requested_just_as_the_pushers_wait_times_out_is_not_lost():
    """The pusher's wait timed out and, before it looked, an evaluation asked for a push (CI saw this once: the
    request was cleared with the timeout and never pushed)."""
    import threading
    import types

    from dqn_cartpole.distributed.variables import WeightPusher

    class Counter:
        def __init__(self, step):
            self.step = step

        def numpy(self):
            return self.step

    pushed, wait_returned = [], threading.Event()
    sync = types.SimpleNamespace(agent=types.SimpleNamespace(train_step_counter=Counter(0)),
                                 push=lambda: pushed.append(sync.agent.train_step_counter.step))
    pusher = WeightPusher(sync, every_steps=1000, poll_s=60.0)
    try:
        assert pusher.push_now() == 0 and pushed == [0]
        real_wait = pusher._wake.wait

        def wait_that_times_out_as_a_request_arrives(timeout):
            if wait_returned.is_set():
                return real_wait(timeout)
            wait_returned.set()
            sync.agent.train_step_counter.step = 6
            pusher.request()
            return False

        pusher._wake.wait = wait_that_times_out_as_a_request_arrives
        pusher._wake.set()  # wakes the thread from its first, real wait
        wait_for(lambda: pushed == [0, 6], 5, "the requested push", poll_s=0.01)
    finally:
        pusher.close()


def test_the_learners_policy_lag_is_its_train_rows_extra_columns_over_each_log_interval():
    import numpy as np

    from dqn_cartpole.distributed.policy_lag import IntervalLag

    lag = IntervalLag(log_interval=4)
    assert lag.row(0, np.array([[1.0, 2.0], [3.0, 5.0]])) == {"policy_lag": 2.0, "policy_lag_max": 5.0}
    assert lag.row(2, np.array([[5.0, 6.0], [7.0, 9.0]])) == {"policy_lag": 4.0, "policy_lag_max": 9.0}
    assert lag.row(4, np.array([[10.0, 10.0]])) == {"policy_lag": 10.0, "policy_lag_max": 10.0}  # a new interval
    assert IntervalLag(4).row(0, None) == {"policy_lag": None, "policy_lag_max": None}


# ---------------------------------------------------------------------------- in-process: a collector, an evaluator


def serving_roles(stack, config, agent, queue_size: int = 100_000) -> str:
    """An embedded server as the replay-server role starts it for `config` (the queue to the learner, `variables`,
    `evaluation`, `stop`), with room for `queue_size` windows; returns its address."""
    from dqn_cartpole.core import build
    from dqn_cartpole.distributed import status
    from dqn_cartpole.distributed.variables import make_variables_table
    from dqn_cartpole.replay import reverb_tables

    spec = agent.collect_data_spec
    server = build.start_replay_server(config.replay, spec, agent.window_length, stack,
                                       extra_tables=[make_variables_table(agent), *status.make_tables()],
                                       replay_tables=[reverb_tables.make_queue_table(
                                           spec, agent.window_length, queue_size)])
    return server.address


def in_thread(stack, target, stop):
    """Runs `target` in a daemon thread; on cleanup, asks it to stop (`stop`, a StopRequest never entered: its
    signal handlers belong to the main thread) and waits for it."""
    import threading

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    stack.callback(thread.join, 30)
    stack.callback(setattr, stop, "signum", signal.SIGTERM)
    return thread


@pytest.mark.parametrize("driver", ["compiled", "py"])
def test_a_collector_writes_one_window_per_env_step_tagged_with_its_weights_and_leaves_on_the_stop(driver):
    import contextlib

    import numpy as np
    import reverb

    from dqn_cartpole.config import load_config
    from dqn_cartpole.console import signals
    from dqn_cartpole.core import build
    from dqn_cartpole.distributed import collector, parts, status
    from dqn_cartpole.distributed.variables import WeightPusher, WeightSync
    from dqn_cartpole.replay import reverb_tables

    config = load_config(SMOKE, ["replay.backend=reverb", f"collection.driver={driver}",
                                 "distributed.weight_refresh_steps=20"])
    with contextlib.ExitStack() as stack:
        _, _, learner = parts.agent_with_envs(config, 1, 0, stack)
        env, tf_env, agent = parts.agent_with_envs(config, 1, 1, stack)
        address = serving_roles(stack, config, learner)
        client = reverb.Client(address)
        learner.train_step_counter.assign(40)
        variable = learner.collect_policy.variables()[0]
        variable.assign(variable + 1.0)
        pusher = WeightPusher(WeightSync(address, learner), every_steps=1000)
        stack.callback(pusher.close)
        assert pusher.push_now() == 40
        replay = build.make_stream_writers(config, agent.collect_data_spec, address, stack)
        sync = WeightSync(address, agent)
        driver_class = {"compiled": collector.CompiledCollectorDriver, "py": collector.PyCollectorDriver}[driver]
        collecting = driver_class(env, tf_env, agent.collect_policy, replay.add_batch, 20)
        logged, stop = [], signals.StopRequest()
        thread = in_thread(stack, lambda: collector.run_driver(collecting, sync, logged.append, stop, replay,
                                                               log_every_s=0.2), stop)

        def queued() -> int:
            return int(client.server_info()[reverb_tables.QUEUE_TABLE_NAME].current_size)

        wait_for(lambda: queued() >= 200, 60, "the collector's first windows")
        assert thread.is_alive()  # it collects on until the run's stop
        status.publish_stop(client, 40, solved=False)
        thread.join(15)
        assert not thread.is_alive(), "the collector did not leave on the run's stop"
        steps, episodes = collecting.counts()
        # Each weight pull runs 20 env steps, then flushes the writers.
        # One window per step the env took (each episode's boundary step too), none twice: all of them but the
        # newest step (held for the next window) and, if the episode just ended, its boundary still to come.
        held = sum(len(steps_held) for steps_held in replay.held_steps())
        pending = int(np.all(env.current_time_step().is_last()))
        assert steps > 0 and steps % 20 == 0 and queued() == steps + episodes - pending - held, (
            steps, episodes, pending, held, queued())
        assert len(logged) >= 2 and logged[-1]["env_steps"] == steps and logged[-1]["episodes"] == episodes
        assert [row["env_steps"] for row in logged] == sorted(row["env_steps"] for row in logged)
        assert all(row["weights_train_step"] == 40 for row in logged) and logged[-1]["env_steps_per_s"] > 0
        assert int(agent.train_step_counter.numpy()) == 40  # the pulled train step (it sets epsilon)
        np.testing.assert_array_equal(agent.collect_policy.variables()[0].numpy(), variable.numpy())
        every = client.sample(reverb_tables.QUEUE_TABLE_NAME, num_samples=queued(), emit_timesteps=False)
        np.testing.assert_array_equal([float(np.squeeze(item.info.priority)) for item in every], 40.0)  # their tag


def test_the_live_evaluator_evaluates_once_per_interval_passed_at_the_weights_train_step_and_publishes_it(tmp_path):
    import contextlib

    import numpy as np
    import reverb

    from dqn_cartpole.config import load_config
    from dqn_cartpole.console import signals
    from dqn_cartpole.distributed import evaluator, parts, status
    from dqn_cartpole.distributed.variables import WeightSync
    from dqn_cartpole.run_folder.layout import RunLayout

    assert evaluator.next_due(0, 100) == 100 and evaluator.next_due(250, 100) == 300
    config = load_config(SMOKE, ["replay.backend=reverb", "output.tensorboard=false"])  # eval_interval: 100
    layout = RunLayout(str(tmp_path / "run"))
    os.makedirs(layout.root)
    with contextlib.ExitStack() as stack:
        _, _, learner = parts.agent_with_envs(config, 1, 0, stack)
        address = serving_roles(stack, config, learner)
        client = reverb.Client(address)

        def push(train_step: int) -> None:
            # A new container each time: the evaluator's seeding (tf.random.set_seed) clears TensorFlow's eager
            # caches, and with them the Reverb client resource an earlier container made in this process.
            learner.train_step_counter.assign(train_step)
            WeightSync(address, learner).push()

        def evaluated() -> list[int]:
            return [int(r["train_step"]) for r in rows(layout.eval_metrics)] if os.path.exists(layout.eval_metrics) else []

        def published() -> int:
            evaluation = status.read_evaluation(client)
            return -1 if evaluation is None else evaluation.train_step

        push(0)
        live = evaluator.LiveEvaluator(config, layout, address, signals.StopRequest())
        exit_statuses = []
        thread = in_thread(stack, lambda: exit_statuses.append(live.run()), live.stop)
        wait_for(lambda: published() == 0, 60, "the evaluation of train step 0")
        push(60)  # before the next multiple of 100: nothing is due
        time.sleep(4 * evaluator.POLL_S)
        variable = learner.collect_policy.variables()[0]
        variable.assign(variable + 1.0)
        push(250)  # two intervals passed: one evaluation, of the newest weights
        wait_for(lambda: published() == 250, 30, "the evaluation of train step 250")
        np.testing.assert_array_equal(live.pipeline.agent.collect_policy.variables()[0].numpy(), variable.numpy())
        push(280)  # the next is due at 300
        time.sleep(4 * evaluator.POLL_S)
        assert evaluated() == [0, 250] and published() == 250
        status.publish_stop(client, 280, solved=False)  # the learner's last step: its weights are evaluated too
        thread.join(30)
        assert not thread.is_alive() and exit_statuses == [0]
        assert evaluated() == [0, 250, 280]
        result = status.read_evaluation(client)
        assert result.train_step == 280 and not result.solved
        assert result.average_return == pytest.approx(float(rows(layout.eval_metrics)[-1]["average_return"]), rel=1e-5)
        assert os.path.exists(os.path.join(layout.best_policy, "saved_model.pb"))
        assert not os.path.exists(layout.final_policy)  # no solve: the smoke config does not stop when solved


def test_the_live_evaluator_confirms_a_solve_exports_the_final_policy_and_leaves_without_a_stop(tmp_path):
    import contextlib
    import json

    import reverb

    from dqn_cartpole.config import load_config
    from dqn_cartpole.console import signals
    from dqn_cartpole.distributed import evaluator, parts, status
    from dqn_cartpole.distributed.variables import WeightSync
    from dqn_cartpole.run_folder.layout import RunLayout

    # A threshold the untrained policy reaches: its first evaluation passes, then the check on 4 fresh episodes.
    config = load_config(SMOKE, ["replay.backend=reverb", "output.tensorboard=false", "evaluation.solve_return=5",
                                 "evaluation.stop_when_solved=true", "evaluation.solve_episodes=4",
                                 "evaluation.solve_margin=0"])
    layout = RunLayout(str(tmp_path / "run"))
    os.makedirs(layout.root)
    with contextlib.ExitStack() as stack:
        _, _, learner = parts.agent_with_envs(config, 1, 0, stack)
        address = serving_roles(stack, config, learner)
        learner.train_step_counter.assign(300)
        WeightSync(address, learner).push()
        live = evaluator.LiveEvaluator(config, layout, address, signals.StopRequest())
        exit_statuses = []
        thread = in_thread(stack, lambda: exit_statuses.append(live.run()), live.stop)
        thread.join(30)  # no stop is written: the evaluator leaves on its own solve
        assert not thread.is_alive() and exit_statuses == [0]
        assert status.read_stop(reverb.Client(address)) is None
        result = status.read_evaluation(reverb.Client(address))
        assert result.solved and result.train_step == 300 and result.solved_episodes == 4 and result.solved_return >= 5
        assert [int(r["train_step"]) for r in rows(layout.eval_metrics)] == [300]
        final = json.load(open(os.path.join(layout.final_policy, "policy_info.json")))
        assert final["train_step"] == 300 and final["episodes"] == 4
