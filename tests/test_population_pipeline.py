"""The population's pipeline: every seed's env steps once per iteration (the lockstep driver), each seed's counts
are its own, and the view agent holds the selected seed's weights."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from dqn_cartpole.config import load_config
from dqn_cartpole.core import ensemble
from dqn_cartpole.training.population_pipeline import SeedPipeline, build_population_pipeline

SMOKE = "dqn_cartpole/configs/smoke.yaml"


def test_each_seed_steps_once_per_iteration_and_counts_its_own_steps():
    config = load_config(SMOKE)
    with contextlib.ExitStack() as stack:
        pipeline = build_population_pipeline(config, [0, 1, 2], stack)
        tf.function(pipeline.initial_driver.run, autograph=False)(pipeline.tf_env.reset(), ())
        inserts = pipeline.replay.seed_inserts()
        for k in range(3):
            pipeline.returns.take_env(k)  # the random fill's episodes
        iterations = pipeline.make_iterations(config)
        policy_state = pipeline.agent.collect_policy.get_initial_state(3)
        _, _, losses = iterations(pipeline.tf_env.current_time_step(), policy_state, tf.constant(200))
        assert losses.shape == (200, 3)
        # One batched step per iteration (one more only when every seed crossed an episode's end at once). The
        # library's rule (steps counted over all copies) would step every seed again whenever any seed crossed one.
        assert 200 <= pipeline.replay.seed_inserts() - inserts <= 202
        # each seed's collect episodes, counted in its own env copy: its episodes' steps add up to at most its steps
        episodes = [pipeline.returns.take_env(k) for k in range(3)]
        assert all(count > 0 and 8 <= mean <= 500 for mean, count in episodes), episodes
        assert all(mean * count <= 202 + 500 for mean, count in episodes), episodes  # + one started in the fill
        assert pipeline.returns.take_env(0) == (None, 0)  # taken: the next interval starts empty
        steps = [pipeline.env_steps_of(k) for k in range(3)]
        assert sum(steps) == int(pipeline.env_steps.result().numpy())
        assert all(config.training.initial_collect_steps + 150 <= n <= config.training.initial_collect_steps + 202
                   for n in steps), steps


def test_select_gives_the_view_agent_one_seed_weights_and_step_count():
    config = load_config(SMOKE)
    with contextlib.ExitStack() as stack:
        pipeline = build_population_pipeline(config, [4, 5], stack)
        pipeline.agent.tf_agent.seed_train_steps.assign([7, 9])
        pipeline.select(1)
        for view, seed_weights in zip(pipeline.view.q_network.variables,
                                      ensemble.seed_values(pipeline.agent.online_variables(), 1)):
            np.testing.assert_array_equal(view.numpy(), seed_weights)
        assert int(pipeline.view.train_step_counter.numpy()) == 9


def test_counts_read_once_serve_every_seed_from_one_read_and_returns_are_taken_for_all():
    """Between two chunks a population's train rows read each count once for all seeds; the collect returns of every
    seed are taken at the first seed's row (the next rows start empty), each seed getting its own."""
    config = load_config(SMOKE)
    with contextlib.ExitStack() as stack:
        pipeline = build_population_pipeline(config, [0, 1, 2], stack)
        tf.function(pipeline.initial_driver.run, autograph=False)(pipeline.tf_env.reset(), ())
        run = pipeline.make_iterations(config)
        run(pipeline.tf_env.current_time_step(), pipeline.agent.collect_policy.get_initial_state(3), tf.constant(120))
        live = ([int(n) for n in pipeline.env_steps.steps.numpy()], pipeline.returns.total.numpy().copy(),
                pipeline.returns.count.numpy().copy())
        seeds = [SeedPipeline(pipeline, k, stack) for k in range(3)]
        with pipeline.counts_read_once():
            assert [seed.env_step_count() for seed in seeds] == live[0]
            pipeline.env_steps.steps.assign_add([5, 5, 5])  # (what a chunk would do: read once, not again)
            assert [seed.env_step_count() for seed in seeds] == live[0]
            taken = [seed.collect_returns.take() for seed in seeds]
        assert [count for _, count in taken] == [int(n) for n in live[2]]
        assert [mean for mean, _ in taken] == pytest.approx([t / n for t, n in zip(live[1], live[2])])
        assert [seed.env_step_count() for seed in seeds] == [n + 5 for n in live[0]]  # outside: live again
        assert [seed.collect_returns.take() for seed in seeds] == [(None, 0)] * 3


def test_put_back_gives_one_seed_a_copy_of_its_weights_and_leaves_the_others():
    """A run that trains on holds the weights that passed its solve check, a copy taken an evaluation lag earlier:
    `put_back` writes them into that seed's slices only."""
    config = load_config(SMOKE)
    with contextlib.ExitStack() as stack:
        pipeline = build_population_pipeline(config, [0, 1, 2], stack)
        tf.function(pipeline.initial_driver.run, autograph=False)(pipeline.tf_env.reset(), ())
        copy = [variable.numpy() for variable in pipeline.agent.online_variables()]
        run = pipeline.make_iterations(config)
        run(pipeline.tf_env.current_time_step(), pipeline.agent.collect_policy.get_initial_state(3), tf.constant(30))
        trained = [variable.numpy() for variable in pipeline.agent.online_variables()]
        version = pipeline.weights_version()
        pipeline.put_back(1, [values[1] for values in copy])
        assert pipeline.weights_version() != version
        for variable, before, after in zip(pipeline.agent.online_variables(), copy, trained):
            np.testing.assert_array_equal(variable.numpy()[1], before[1])
            np.testing.assert_array_equal(variable.numpy()[[0, 2]], after[[0, 2]])
        assert not np.array_equal(trained[0][1], copy[0][1])  # (it had trained away from the copy)
