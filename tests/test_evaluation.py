"""Greedy evaluation in one compiled loop: a solve check that can no longer pass stops early; videos get actions."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tf_agents.policies import fixed_policy
from tf_agents.specs import tensor_spec

from dqn_cartpole.core.envs import make_batched_env
from dqn_cartpole.core.evaluation import make_episode_runner


def run(policy_action: int, copies: int, **kwargs):
    env = make_batched_env("CartPole-v1", copies, seed=11, seed_per_copy=True)
    try:
        policy = fixed_policy.FixedPolicy(np.int64(policy_action), tensor_spec.from_spec(env.time_step_spec()),
                                          tensor_spec.from_spec(env.action_spec()))
        return make_episode_runner(policy, env, **kwargs)()
    finally:
        env.close()


def test_a_check_that_cannot_reach_its_target_stops_early_and_fails():
    full = run(0, 20)  # pushing left always: every episode fails within ~10 steps
    early = run(0, 20, give_up_below=400.0, max_return=500.0)
    # 20 episodes average >= 400 only if they lose < 2,000 of the 10,000 possible: 5 failed ones already do
    assert early.lengths.sum() < full.lengths.sum()
    assert (early.lengths <= full.lengths).all() and early.average_return < 400
    reachable = run(0, 20, give_up_below=5.0, max_return=500.0)  # a target it meets: nothing is cut
    np.testing.assert_array_equal(reachable.lengths, full.lengths)


def test_kept_actions_are_each_episodes_own():
    result = run(1, 3, keep_actions=True)
    assert result.actions.shape[0] == 3 and result.terminated.all()  # pushing right fails too
    for i in range(3):
        assert (result.actions[i, :result.lengths[i]] == 1).all()
