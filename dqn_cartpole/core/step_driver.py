"""`DynamicStepDriver` with its first steps written out: the same steps, without a loop in the loop.

In the compiled loop the driver's `tf.while_loop` is a loop nested in the loop over iterations, and entering
a nested loop's frame on every iteration costs TensorFlow's executor more than the steps inside it: measured
at ~145 us per iteration for one env step, where the step itself (policy, env, observers) costs ~100 us.
`UnrolledStepDriver` takes the steps the library's loop always takes (num_steps / batch_size, rounded up:
no step can count more than the batch) as straight-line ops, then runs the library's loop for what is left
(a step from a LAST time step starts a new episode and does not count) only when something is left, behind
a `tf.cond`. The steps taken, their order, the observers' calls and the result are the library's.
"""

from __future__ import annotations

import math
import tensorflow as tf
from tf_agents.drivers import dynamic_step_driver
from tf_agents.utils import nest_utils

# Steps written out at most: a long run (the random fill's 1,000 steps) keeps the library's loop alone.
MAX_UNROLLED_STEPS = 4


class UnrolledStepDriver(dynamic_step_driver.DynamicStepDriver):
    """See the module docstring; built as `DynamicStepDriver` is, and run the same way."""

    def unrolled_steps(self) -> int:
        """The steps every `run` takes for sure (0: the library's loop alone)."""
        steps = math.ceil(self._num_steps / max(1, int(self.env.batch_size or 1)))
        return steps if steps <= MAX_UNROLLED_STEPS else 0

    def _run(self, time_step=None, policy_state=None, maximum_iterations=None):
        unrolled = self.unrolled_steps()
        if unrolled == 0 or maximum_iterations is not None:
            return super()._run(time_step, policy_state, maximum_iterations)
        if time_step is None:
            time_step = self.env.current_time_step()
        if policy_state is None:
            policy_state = self.policy.get_initial_state(self.env.batch_size)
        counter = tf.zeros(nest_utils.get_outer_shape(time_step, self.env.time_step_spec()), tf.int32)
        body, more = self._loop_body_fn(), self._loop_condition_fn()
        state = [counter, time_step, policy_state]
        for _ in range(unrolled):
            state = body(*state)
        # A step from LAST (a boundary) does not count, and the step after it cannot be one: every env counts at
        # least every other step, so `unrolled` more steps, each taken only while the count is short, are enough.
        for _ in range(unrolled):
            state = self.step_if(more(*state), body, state)
        _, time_step, policy_state = state
        return tf.nest.map_structure(tf.stop_gradient, (time_step, policy_state))

    @staticmethod
    def step_if(condition: tf.Tensor, body, state: list) -> list:
        """`body(*state)` if `condition`, else `state` (a `tf.cond`: the step's ops run only when taken)."""
        flat = tf.cond(condition, lambda: tuple(tf.nest.flatten(body(*state))),
                       lambda: tuple(tf.nest.flatten(state)))
        return tf.nest.pack_sequence_as(state, list(flat))
