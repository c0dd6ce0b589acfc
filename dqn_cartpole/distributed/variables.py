"""The learner's weights on the Reverb server: the `variables` table, a health check, push and pull.

A collector's epsilon-greedy policy reads epsilon from the agent's own train-step variable, so
pulling updates that variable too (a fresh train step, as in TF-Agents' SAC example, would
leave epsilon at its start value forever).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from dqn_cartpole.errors import UserError

VARIABLES_TABLE = "variables"


def weights(agent: Any) -> dict:
    """What a learner pushes and a collector pulls: the policy's variables and the train step."""
    from tf_agents.experimental.distributed import reverb_variable_container as rvc

    return {rvc.POLICY_KEY: agent.collect_policy.variables(), rvc.TRAIN_STEP_KEY: agent.train_step_counter}


def make_variables_table(agent: Any) -> Any:
    """One item, never removed by sampling (max_times_sampled=0: every collector reads it), readable once pushed."""
    import reverb
    import tensorflow as tf
    from tf_agents.specs import tensor_spec

    signature = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), weights(agent))
    return reverb.Table(VARIABLES_TABLE, sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                        rate_limiter=reverb.rate_limiters.MinSize(1), max_size=1, max_times_sampled=0,
                        signature=tensor_spec.from_spec(signature))


def check_server(address: str, timeout_s: float) -> Any:
    """A client of the server at `address`, once it answers; a one-line UserError if it does not within `timeout_s`."""
    import reverb

    client = reverb.Client(address)
    try:
        client.server_info(timeout=max(1, int(timeout_s)))
    except Exception as exc:  # pylint: disable=broad-except  # reverb raises a bare RuntimeError / DeadlineExceeded
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"--replay-address {address}: no Reverb server answered within {timeout_s:g} s ({first})"
                        ) from None
    return client


class WeightSync:
    """Pushes (learner) or pulls (collector) an agent's weights through the server's `variables` table."""

    def __init__(self, address: str, agent: Any):
        import reverb
        from tf_agents.experimental.distributed import reverb_variable_container as rvc

        # Only after check_server: the constructor waits forever for a server that is not up.
        self.container = rvc.ReverbVariableContainer(address, table_names=[VARIABLES_TABLE])
        self.agent = agent
        self.variables = weights(agent)
        self.client = reverb.Client(address)

    def push(self) -> None:
        self.container.push(self.variables)

    def available(self) -> bool:
        return int(self.client.server_info(timeout=5)[VARIABLES_TABLE].current_size) > 0

    def stopped(self) -> bool:
        """The run's `stop` table has its item: the learner finished or a solve was confirmed."""
        from dqn_cartpole.distributed import status

        return status.read_stop(self.client) is not None

    def pull(self) -> int:
        """Assigns the newest pushed weights (and train step) to the agent; returns that train step."""
        self.container.update(self.variables)
        return int(self.agent.train_step_counter.numpy())

    def wait_for_first(self, stopped: Callable[[], bool], poll_s: float = 0.2) -> bool:
        """Waits until a learner has pushed once (False if `stopped()` first), so `pull` cannot block."""
        while not self.available():
            if stopped():
                return False
            time.sleep(poll_s)
        return True
