"""What a train row logs, against values worked out by hand: the loss over the interval, the collect returns."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from dqn_cartpole.core.episode_returns import EpisodeReturns
from dqn_cartpole.training.state import RunState


def test_the_train_row_loss_is_the_mean_and_max_over_its_interval():
    state = RunState()
    assert state.take_interval_loss() == (None, None)  # nothing trained yet
    state.add_losses(np.array([1.0, 3.0], np.float32))  # two compiled chunks within one log interval
    state.add_losses(np.array([2.0, 10.0, 5.0], np.float32))
    assert state.loss == 5.0  # the last iteration's, for the progress line
    assert state.take_interval_loss() == (pytest.approx(4.2), 10.0)  # mean of 1, 3, 2, 10, 5 and their max
    state.add_losses(np.array([0.5], np.float32))
    assert state.take_interval_loss() == (0.5, 0.5)  # the next interval starts afresh
    assert state.take_interval_loss() == (0.5, 0.5)  # no iteration in between: the last loss


def steps(step_types, next_step_types, rewards):
    """A [2]-env batch of transitions, as a driver hands its observers."""
    return trajectory.Trajectory(
        step_type=tf.constant(step_types, tf.int32), observation=tf.zeros([2, 1]), action=tf.zeros([2], tf.int64),
        policy_info=(), next_step_type=tf.constant(next_step_types, tf.int32),
        reward=tf.constant(rewards, tf.float32), discount=tf.ones([2]))


def test_collect_returns_are_the_mean_of_the_episodes_that_ended_in_the_interval():
    first, mid, last = ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST
    returns = EpisodeReturns(num_envs=2)
    # env 0: rewards 1, 1, 1 then its episode ends (return 3); env 1: 2, 2, ... still running
    returns(steps([first, first], [mid, mid], [1.0, 2.0]))
    returns(steps([mid, mid], [mid, mid], [1.0, 2.0]))
    returns(steps([mid, mid], [last, mid], [1.0, 2.0]))
    assert returns.take() == (3.0, 1)
    returns(steps([last, mid], [first, last], [0.0, 2.0]))  # env 0's boundary (reward 0); env 1 ends: 2 x 4 = 8
    returns(steps([first, last], [last, first], [5.0, 0.0]))  # env 0: a one-step episode of 5
    assert returns.take() == (6.5, 2)  # (8 + 5) / 2
    assert returns.take() == (None, 0)  # no episode ended since


def test_collect_returns_observe_inside_a_compiled_loop():
    returns = EpisodeReturns(num_envs=2)
    first, mid, last = ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST

    @tf.function(autograph=False)
    def drive():
        returns(steps([first, first], [mid, last], [1.0, 4.0]))
        returns(steps([mid, last], [last, first], [1.0, 0.0]))

    drive()
    assert returns.take() == (3.0, 2)  # (2 + 4) / 2
