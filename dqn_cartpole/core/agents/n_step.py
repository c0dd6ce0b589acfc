"""The episode-aware n-step window rule, which every agent's loss applies to its sampled windows.

A sampled item is a window of `n_step + 1` consecutive steps of one env's stream (`window_length`).
TF-Agents builds an n-step target by multiplying the discounts along the window: that ends the
return at a termination (discount 0), but not at a time-limit truncation (a LAST step with
discount 1), nor at the resume seam (a LAST step a resumed run writes at each env's last
observation, `replay.base.Replay.write_seam`): the window then runs on into the next episode.
One rule instead, for every agent and every replay backend:

* a window's return stops at its first LAST step; rewards after it count as zero;
* it bootstraps from that LAST step's observation with gamma^k times the product of the
  discounts up to it (0 after a termination, so no bootstrap there);
* a window that starts at a LAST step is masked (`valid_mask`), as DqnAgent already does.

An agent's loss calls `n_step_transition` on its [B, n + 1] batch and computes its own target from
the (first step, action) -> (bootstrap step) transition it returns: a TD target for DQN, the
projected distribution for C51.
"""

from __future__ import annotations

import tensorflow as tf
from tf_agents.trajectories import policy_step, time_step as ts, trajectory as trajectory_lib


def window_length(n_step: int) -> int:
    """Steps per sampled window: a transition is 2 steps, an n-step update needs n + 1."""
    return n_step + 1


def n_step_transition(trajectory: trajectory_lib.Trajectory, gamma: float) -> trajectory_lib.Transition:
    """A [B, n + 1] window of steps -> the n-step Transition whose return stops at the first LAST step.

    With k the position of the first LAST step in 1..n (n if there is none), the transition is
    (step 0, action 0) -> (step k) with
        next_time_step.reward   = sum_{i<k} gamma^i * d_0 * ... * d_{i-1} * r_i
        next_time_step.discount = gamma^(k-1) * d_0 * ... * d_{k-1}
    (the loss multiplies the discount by gamma once more, as in TF-Agents' `to_n_step_transition`),
    so the bootstrap's whole discount is gamma^k * d_0 * ... * d_{k-1}.
    """
    steps = trajectory.step_type.shape[1]
    if steps is None or steps < 2:
        raise ValueError(f"an n-step window needs a static time dimension of at least 2 steps, got {steps}")
    n = int(steps) - 1
    rewards, discounts = trajectory.reward[:, :n], trajectory.discount[:, :n]
    # alive[:, i]: no LAST step at positions 1..i, so reward i still belongs to the window's episode.
    ended = tf.cast(tf.equal(trajectory.step_type[:, 1:n], ts.StepType.LAST), rewards.dtype)
    alive = tf.concat([tf.ones_like(rewards[:, :1]), tf.math.cumprod(1.0 - ended, axis=1)], axis=1)
    powers = tf.constant([gamma ** i for i in range(n)], dtype=rewards.dtype)
    before = tf.math.cumprod(discounts, axis=1, exclusive=True)  # d_0 * ... * d_{i-1}
    reward = tf.reduce_sum(alive * powers * before * rewards, axis=1)
    k = tf.cast(tf.reduce_sum(alive, axis=1), tf.int32)  # 1..n
    through = tf.math.cumprod(discounts, axis=1)  # d_0 * ... * d_i
    discount = tf.gather(powers, k - 1) * tf.gather(through, k - 1, axis=1, batch_dims=1)
    first = tf.nest.map_structure(lambda t: t[:, 0], trajectory)
    final = tf.nest.map_structure(lambda t: tf.gather(t, k, axis=1, batch_dims=1), trajectory)
    time_steps = ts.TimeStep(first.step_type, reward=tf.fill(tf.shape(first.reward), float("nan")),
                             discount=tf.fill(tf.shape(first.discount), float("nan")),
                             observation=first.observation)
    next_time_steps = ts.TimeStep(final.step_type, reward=reward, discount=discount, observation=final.observation)
    actions = policy_step.PolicyStep(action=first.action, state=(), info=first.policy_info)
    return trajectory_lib.Transition(time_steps, actions, next_time_steps)


def valid_mask(time_steps: ts.TimeStep) -> tf.Tensor:
    """1.0 for a window that starts inside an episode, 0.0 for one that starts at a LAST step (no action was
    taken there: its loss term is masked)."""
    return tf.cast(~time_steps.is_last(), tf.float32)
