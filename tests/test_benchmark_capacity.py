"""The capacity benchmark's parts that must be right for its figures to mean anything, fast (no benchmark run):
its synthetic collectors write the windows a real collector would (a real learner-side buffer takes them, and
they hold the steps they were given, episode ends padded), and its bad input gets one line and exit status 2."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import CONFIGS, REPO, cli_env

sys.path.insert(0, os.path.join(REPO, "scripts"))


def test_the_capacity_benchmark_answers_bad_input_with_one_line_and_status_2():
    """As a user types it: through benchmark.py, one `error: ...` line and exit status 2 (no usage block)."""
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "benchmark.py"), "--capacity", "1,x"],
                            capture_output=True, text=True, timeout=60, env=cli_env())
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: --capacity 1,x: expected numbers of collectors like 1,2,4,8,16"], result.stderr


@pytest.mark.parametrize("args, needle", [
    (("--capacity", "0,2"), "--capacity 0,2: each number of collectors must be 1 to 64"),
    (("--capacity", "4,4"), "listed twice"),
    (("--capacity", "--seconds", "0"), "--seconds 0: expected"),
    (("--capacity", "--seconds", "nan"), "--seconds nan: expected"),
    (("--capacity", "2", "--modes", "learner,shared"), "--modes learner,shared"),
    (("--capacity", "--collectors-share", "all"), "--collectors-share all"),
    (("--capacity", "--iterations", "5"), "--iterations 5"),
    (("--capacity", "--warmup", "3"), "unrecognized arguments: --warmup 3"),
])
def test_the_capacity_benchmark_names_each_bad_argument(args, needle):
    import benchmark_capacity

    from dqn_cartpole.errors import UserError

    with pytest.raises(UserError) as raised:
        benchmark_capacity.parse_args(list(args))
    assert needle in str(raised.value) and "\n" not in str(raised.value)


def expected_windows(steps: list, padding: list, length: int) -> list:
    """Each step's window as the collectors' writers make it: the next `length` steps of its episode, then the
    boundary padding once a LAST step (index 0 of the fields: step_type) has passed."""
    windows = []
    for start in range(len(steps)):
        window, ended = [], False
        for k in range(length):
            window.append(padding if ended else steps[start + k])
            ended = ended or int(window[-1][0][0]) == 2  # StepType.LAST
        windows.append(window)
    return windows


def test_synthetic_collectors_write_windows_a_learner_side_buffer_takes():
    import benchmark_capacity
    import capacity_collectors as capacity
    import tensorflow as tf

    from dqn_cartpole.config import load_config
    from dqn_cartpole.core import build
    from dqn_cartpole.distributed import parts
    from dqn_cartpole.distributed.variables import WeightSync, make_variables_table
    from dqn_cartpole.replay.base import boundary_steps

    # The benchmark's own overrides, and a queue deep enough for every window (the benchmark's learner drains it).
    overrides = benchmark_capacity.phase_overrides(benchmark_capacity.PHASES[0])
    config = load_config(os.path.join(CONFIGS, "default.yaml"), [
        *overrides, "distributed.samples_per_insert_tolerance=64000", "training.initial_collect_steps=64"])
    with contextlib.ExitStack() as stack:
        _, _, agent = parts.agent_with_envs(config, 1, 0, stack)
        spec, length = agent.collect_data_spec, agent.window_length
        server = build.start_replay_server(config.replay, spec, length, stack,
                                           extra_tables=[make_variables_table(agent)],
                                           replay_tables=build.distributed_replay_tables(config, spec))
        agent.train_step_counter.assign(7)
        WeightSync(server.address, agent).push()
        steps = capacity.synthetic_steps(spec, 150, seed=3, lengths=(2, 40))
        assert len(steps) >= 150 and int(steps[0][0][0]) == 0 and int(steps[-1][0][0]) == 2  # FIRST ... LAST
        collector = capacity.SyntheticCollector(config, spec, server.address, steps)
        stack.callback(collector.close)
        collector.write(len(steps))  # whole episodes: every step starts a window, the last ones padded
        read = len(steps) // 8 * 8  # the learner reads whole batches of 8
        replay = build.make_learner_replay(config, spec, server.address, agent.train_step_counter, stack, 10_000)
        replay.read(read)
        assert replay.inserts() == read

        observation = np.zeros((1,) + tuple(spec.observation.shape), spec.observation.dtype.as_numpy_dtype)
        padding = [np.asarray(a) for a in tf.nest.flatten(boundary_steps(spec, observation))]
        expected = expected_windows(steps + [padding] * length, padding, length)[:read]
        for index, field in enumerate(tf.nest.flatten(replay.single_pass())):  # each field [items, length, ...]
            want = np.stack([[step[index][0] for step in window] for window in expected])
            np.testing.assert_array_equal(field, want.astype(field.dtype), err_msg=f"field {index}")
        _, tags = replay.get_next(sample_batch_size=16, num_steps=length)
        assert set(np.asarray(tags).tolist()) == {7.0}  # each window carries the train step it pulled

        agent.train_step_counter.assign(0)  # the first gradient step needs no window more than it holds
        batch = tf.nest.map_structure(tf.convert_to_tensor, replay.sampler(config.training.batch_size, length)())
        assert np.isfinite(agent.train(batch).loss.numpy())  # the agent trains on them

