"""collection.driver: py, the tutorial's PyDriver loop, on every replay backend: in this process (the loop itself,
counted exactly), and, marked slow, the tutorial's config learning CartPole-v0 end to end."""

from __future__ import annotations

import contextlib
import csv
import os

import numpy as np
import pytest

from helpers import CONFIGS, run_cli


def rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("backend", ["tf_uniform", "py_uniform", "reverb"])
def test_py_driver_collects_one_step_per_iteration_writes_every_step_and_trains(backend):
    """The training session's own parts: the pipeline (PyDriver, compiled collect policy, the replay written the
    backend's cheapest way) and the py loop, run for two chunks of iterations."""
    import tensorflow as tf

    from dqn_cartpole.config import load_config
    from dqn_cartpole.training.loop import ChunkedLoop, make_train_step, python_iterations
    from dqn_cartpole.training.local import build_pipeline

    config = load_config(os.path.join(CONFIGS, "smoke.yaml"),
                         ["collection.driver=py", f"replay.backend={backend}", "agent.n_step=2"])
    with contextlib.ExitStack() as stack:
        pipeline = build_pipeline(config, stack, announce=lambda line: None)
        tf.function(pipeline.initial_driver.run, autograph=False)(pipeline.envs.tf_env.reset(), ())
        initial, held = pipeline.replay.inserts(), len(pipeline.replay.held_steps()[0])
        assert pipeline.env_step_count() == 64
        written = []  # every trajectory the driver hands its observers, boundaries included
        pipeline.collect_driver.driver.observers.append(written.append)
        sample = pipeline.replay.sampler(config.training.batch_size, pipeline.agent.window_length)
        train = make_train_step(pipeline.agent, sample, 1, config.training.jit_compile)
        loop = ChunkedLoop(python_iterations(train, pipeline.collect_driver), [100])
        time_step = pipeline.envs.collect.current_time_step()
        losses = []
        for first in (0, 100):
            chunk = loop.run(first, 200, time_step, ())
            time_step = chunk.time_step
            losses.extend(chunk.losses.tolist())
        collection = pipeline.collect_driver
        # One env step per iteration, counted into the run's metric once per chunk.
        assert pipeline.env_step_count() == 64 + 200 == 64 + collection.counter.steps
        assert pipeline.train_step_count() == 200 and len(losses) == 200 and len(set(losses)) > 1
        assert np.all(np.isfinite(losses))
        # Every step the driver wrote is in the replay, once (Reverb: as the window it starts; the writer holds
        # the running episode's newest n = 2 steps until their windows are whole).
        assert len(written) == 200 + sum(int(t.is_boundary()[0]) for t in written)
        held_now = len(pipeline.replay.held_steps()[0])
        assert pipeline.replay.inserts() - initial == len(written) + held - held_now


@pytest.mark.parametrize("backend", ["py_uniform", "reverb"])
def test_py_driver_trains_on_prioritized_replay(backend):
    """The py loop with prioritized replay's train step, which returns a vector per iteration (the loss, the batch's
    smallest importance weight, the mean and the largest priority written): the tutorial's loop with
    `replay.prioritized` (the notebook's comparison) used to fail on it."""
    import tensorflow as tf

    from dqn_cartpole.config import load_config
    from dqn_cartpole.training.local import build_pipeline
    from dqn_cartpole.training.loop import ChunkedLoop, python_iterations
    from dqn_cartpole.training.prioritized import make_prioritized_train_step

    config = load_config(os.path.join(CONFIGS, "smoke.yaml"),
                         ["collection.driver=py", f"replay.backend={backend}", "replay.prioritized=true"])
    with contextlib.ExitStack() as stack:
        pipeline = build_pipeline(config, stack, announce=lambda line: None)
        tf.function(pipeline.initial_driver.run, autograph=False)(pipeline.envs.tf_env.reset(), ())
        train = make_prioritized_train_step(pipeline.agent, pipeline.replay, config.replay,
                                            config.training.batch_size, 1, config.training.jit_compile)
        loop = ChunkedLoop(python_iterations(train, pipeline.collect_driver), [50])
        chunk = loop.run(0, 50, pipeline.envs.collect.current_time_step(), ())
        assert pipeline.train_step_count() == 50 and pipeline.env_step_count() == 64 + 50
    assert chunk.losses.shape == (50,) and np.all(np.isfinite(chunk.losses))
    weights, means, largest = chunk.extras.T
    assert np.all((weights > 0) & (weights <= 1)) and np.all((0 < means) & (means <= largest)), chunk.extras


@pytest.mark.slow
def test_tutorial_py_driver_reaches_195_on_cartpole_v0(tmp_path):
    # configs/tutorial.yaml runs the tutorial's own PyDriver loop on Reverb, on the tutorial's own budget (20,000
    # iterations). Reverb's sampling is not reproducible, so each run learns differently: most reach 200 by iteration
    # 3,000, but one in six measured here first did at 10,000 and a CI run's best over 10,000 was 181.3.
    run_dir = str(tmp_path / "run")
    result = run_cli("train", "--config", os.path.join(CONFIGS, "tutorial.yaml"), "--output-dir", run_dir,
                     "--quiet", "--set", "video.enabled=false",
                     # it stops at a confirmed solve (100 fresh episodes); one never confirmed runs the whole budget
                     "--set", "evaluation.stop_when_solved=true",
                     timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert max(float(r["average_return"]) for r in rows(os.path.join(run_dir, "eval_metrics.csv"))) >= 195
