"""CartPole stepped in TensorFlow ops: the compiled driver's env steps without a call back into Python.

`TFCartPole` is gymnasium's CartPole (v0 and v1: the same physics, time limits 200 and 500) as a TF-Agents
`TFEnvironment` whose state lives in TF variables, so a `DynamicStepDriver` in the compiled loop steps it
in the graph (~35 us) instead of through `TFPyEnvironment`'s `py_function` around gymnasium (~85 us, and
Python's interpreter running between the graph's ops). It is the same env, step for step, as the
`BatchedGymnasiumEnvironment` it is built over:

* the physics in float64, op for op in gymnasium's order, so states and observations are the same bits
  (tests/test_tf_cartpole.py steps both side by side);
* a new episode's start state comes from that gymnasium env's own random generator (`GymnasiumStarts`,
  one `numpy_function` call per episode, not per step), so the run's seed and a resumed run's re-seeding
  (`env.gym_env.reset(seed=...)`) give the episodes they give today;
* `vector_env.VectorSteps`' time steps: NEXT_STEP autoreset (the step after a LAST one ignores its action and
  comes back FIRST with reward 0), a pole that falls or a cart that leaves the track ends the episode with
  discount 0 (terminated), the time limit with discount 1 (truncated).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import tensorflow as tf
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv
from gymnasium.vector import SyncVectorEnv
from tf_agents.environments import tf_environment
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from dqn_cartpole.core.envs import BatchedGymnasiumEnvironment
from dqn_cartpole.core.vector_env import FIRST, LAST, MID
from dqn_cartpole.env_ids import registered_spec

CARTPOLE_IDS = ("CartPole-v0", "CartPole-v1")

# gymnasium's CartPoleEnv constants, computed as it computes them (1.1 and 0.05 are not exact in binary).
GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASSPOLE + MASSCART
POLEMASS_LENGTH = MASSPOLE * LENGTH
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


def is_plain_cartpole(env_id: str) -> bool:
    """Whether `env_id` is gymnasium's CartPole with its default physics and reward (what `TFCartPole` steps)."""
    if env_id not in CARTPOLE_IDS:
        return False
    spec = registered_spec(env_id)
    return not spec.kwargs.get("sutton_barto_reward", False) and spec.additional_wrappers == ()


class GymnasiumStarts:
    """Start states drawn from a gymnasium CartPole vector env's own random generators, as its resets draw them.

    A `SyncVectorEnv` resets copy i alone, from copy i's generator; gymnasium's `CartPoleVectorEnv` draws one
    uniform [4, k] block for the k copies that reset together. Either way the states are float64, as gymnasium
    keeps them.
    """

    def __init__(self, env: BatchedGymnasiumEnvironment):
        self.env = env
        vector = env.gym_env
        if isinstance(vector, SyncVectorEnv) and all(isinstance(e.unwrapped, CartPoleEnv) for e in vector.envs):
            self.vectorised = False
        elif isinstance(vector.unwrapped, CartPoleVectorEnv):
            self.vectorised = True
        else:
            raise ValueError(f"not a gymnasium CartPole vector env: {vector!r}")

    def reset_all(self) -> np.ndarray:
        """Resets every copy (seeding them the first time, as `VectorSteps.reset` does): states [copies, 4]."""
        self.env.steps.reset()
        return self.states()

    def reset_some(self, mask: np.ndarray) -> np.ndarray:
        """Resets the copies in `mask` (continuing their generators): states [copies, 4], those rows new. Before
        the first reset, resets them all (`reset_all`: a step before any reset starts every episode)."""
        if not self.env.steps.seeded:
            return self.reset_all()
        vector = self.env.gym_env
        if self.vectorised:
            env = vector.unwrapped
            env.state[:, mask] = env.np_random.uniform(low=env.low, high=env.high, size=(4, int(mask.sum())))
        else:
            for i in np.flatnonzero(mask):
                vector.envs[i].reset()
        return self.states()

    def states(self) -> np.ndarray:
        vector = self.env.gym_env
        if self.vectorised:
            return np.array(vector.unwrapped.state.T, dtype=np.float64)
        return np.stack([np.asarray(e.unwrapped.state, dtype=np.float64) for e in vector.envs])


def physics(state: tf.Tensor, action: tf.Tensor, constants: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """One Euler step of gymnasium's CartPole on float64 `state` [copies, 4]: (next state, terminated).

    Op for op in gymnasium's order. The constants come in as a tensor read from a variable, not as graph
    constants: Grappler rewrites a division by a constant into a multiplication by its reciprocal, which
    is not the same bits."""
    gravity, masspole, total_mass, length, polemass_length, force_mag, tau, four_thirds = tf.unstack(constants)
    x, x_dot, theta, theta_dot = tf.unstack(state, axis=1)
    force = tf.where(tf.equal(action, 1), force_mag, -force_mag)
    costheta, sintheta = tf.cos(theta), tf.sin(theta)
    temp = (force + polemass_length * tf.square(theta_dot) * sintheta) / total_mass
    thetaacc = (gravity * sintheta - costheta * temp) / (
        length * (four_thirds - masspole * tf.square(costheta) / total_mass))
    xacc = temp - polemass_length * thetaacc * costheta / total_mass
    x, x_dot = x + tau * x_dot, x_dot + tau * xacc
    theta, theta_dot = theta + tau * theta_dot, theta_dot + tau * thetaacc
    terminated = (x < -X_THRESHOLD) | (x > X_THRESHOLD) | (theta < -THETA_THRESHOLD) | (theta > THETA_THRESHOLD)
    return tf.stack([x, x_dot, theta, theta_dot], axis=1), terminated


class TFCartPole(tf_environment.TFEnvironment):
    """The copies of `env` (a CartPole `BatchedGymnasiumEnvironment`), stepped in the graph; see the module
    docstring. `env` keeps its specs, its seed and its random generators; this env never steps it."""

    def __init__(self, env: BatchedGymnasiumEnvironment, max_episode_steps: int):
        time_step_spec = tensor_spec.from_spec(env.time_step_spec())
        super().__init__(time_step_spec, tensor_spec.from_spec(env.action_spec()), env.batch_size)
        self.pyenv = env  # the gymnasium env it mirrors (`TFPyEnvironment`'s name for it)
        self.starts = GymnasiumStarts(env)
        self.max_episode_steps = int(max_episode_steps)
        n = env.batch_size
        self._constants = tf.Variable([GRAVITY, MASSPOLE, TOTAL_MASS, LENGTH, POLEMASS_LENGTH, FORCE_MAG, TAU,
                                       4.0 / 3.0], dtype=tf.float64, trainable=False, name="cartpole_constants")
        self._state = tf.Variable(tf.zeros([n, 4], tf.float64), trainable=False, name="cartpole_state")
        self._elapsed = tf.Variable(tf.zeros([n], tf.int32), trainable=False, name="cartpole_elapsed")
        # Copies that ended on the last step; NEXT_STEP autoreset: the next step starts their new episode. Before
        # the first reset, every copy: a first step starts every episode (as TFPyEnvironment's does).
        self._resetting = tf.Variable(tf.ones([n], tf.bool), trainable=False, name="cartpole_resetting")
        self._time_step = tf.nest.map_structure(
            lambda spec: tf.Variable(tf.zeros([n, *spec.shape], spec.dtype), trainable=False), time_step_spec)

    def _current_time_step(self) -> ts.TimeStep:
        return tf.nest.map_structure(lambda v: v.read_value(), self._time_step)

    def _starts(self, mask: Optional[tf.Tensor]) -> tf.Tensor:
        """New start states [copies, 4] from the gymnasium env's generators (all copies, or those in `mask`)."""
        if mask is None:
            states = tf.numpy_function(self.starts.reset_all, [], tf.float64, stateful=True, name="cartpole_reset")
        else:
            states = tf.numpy_function(self.starts.reset_some, [mask], tf.float64, stateful=True,
                                       name="cartpole_autoreset")
        return tf.ensure_shape(states, [self.batch_size, 4])

    def _store(self, state: tf.Tensor, elapsed: tf.Tensor, resetting: tf.Tensor, time_step: ts.TimeStep) -> Any:
        assigns = [self._state.assign(state), self._elapsed.assign(elapsed), self._resetting.assign(resetting)]
        assigns += [v.assign(t) for v, t in zip(tf.nest.flatten(self._time_step), tf.nest.flatten(time_step))]
        with tf.control_dependencies(assigns):
            return tf.nest.map_structure(tf.identity, time_step)

    def _reset(self) -> ts.TimeStep:
        state = self._starts(None)
        n = self.batch_size
        time_step = ts.TimeStep(tf.fill([n], tf.constant(FIRST, tf.int32)), tf.zeros([n], tf.float32),
                                tf.ones([n], tf.float32), tf.cast(state, tf.float32))
        return self._store(state, tf.zeros([n], tf.int32), tf.zeros([n], tf.bool), time_step)

    def _step(self, action: tf.Tensor) -> ts.TimeStep:
        action = tf.reshape(tf.cast(action, tf.int64), [self.batch_size])
        resetting = self._resetting.read_value()
        stepped, terminated = physics(self._state.read_value(), action, self._constants.read_value())
        starts = tf.cond(tf.reduce_any(resetting), lambda: self._starts(resetting),
                         lambda: tf.zeros([self.batch_size, 4], tf.float64))
        state = tf.where(resetting[:, tf.newaxis], starts, stepped)
        elapsed = tf.where(resetting, 0, self._elapsed.read_value() + 1)
        terminated &= ~resetting
        last = (terminated | (elapsed >= self.max_episode_steps)) & ~resetting
        step_type = tf.where(resetting, FIRST, tf.where(last, LAST, MID))
        reward = tf.where(resetting, 0.0, 1.0)
        discount = tf.where(terminated, 0.0, 1.0)
        time_step = ts.TimeStep(step_type, reward, discount, tf.cast(state, tf.float32))
        return self._store(state, elapsed, last, time_step)


def max_episode_steps(env_id: str, configured: Optional[int]) -> int:
    """The time limit the gymnasium env applies: the configured one, else the registered one."""
    return int(configured if configured is not None else registered_spec(env_id).max_episode_steps)
