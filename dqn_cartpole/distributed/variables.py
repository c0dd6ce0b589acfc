"""The learner's weights on the Reverb server: the `variables` table, a health check, push and pull.

A collector's epsilon-greedy policy reads epsilon from the agent's own train-step variable, so
pulling updates that variable too (a fresh train step, as in TF-Agents' SAC example, would
leave epsilon at its start value forever). A learner pushes from a background thread
(`WeightPusher`), so its compiled chunks never wait on the server.

Every call to the server has a deadline (`replay.deadlines`, CALL_TIMEOUT_S): past it, ServerUnanswered.
"""

from __future__ import annotations

import collections
import logging
import math
import socket
import threading
import time
from typing import Any, Callable, Optional

from dqn_cartpole.distributed import status
from dqn_cartpole.errors import UserError
from dqn_cartpole.replay import deadlines
from dqn_cartpole.replay.reverb_tables import parse_address

VARIABLES_TABLE = "variables"


def weights(agent: Any) -> dict:
    """What a learner pushes and a collector pulls: the policy's variables and the train step."""
    from tf_agents.experimental.distributed import reverb_variable_container as rvc

    return {rvc.POLICY_KEY: agent.collect_policy.variables(), rvc.TRAIN_STEP_KEY: agent.train_step_counter}


def make_variables_table(agent: Any) -> Any:
    """The weights' one item (`status.one_item_table`: every collector reads it), readable once pushed."""
    import tensorflow as tf
    from tf_agents.specs import tensor_spec

    signature = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), weights(agent))
    return status.one_item_table(VARIABLES_TABLE, tensor_spec.from_spec(signature))


def check_server(address: str, timeout_s: float) -> Any:
    """A client of the server at `address`, once it answers; a one-line UserError if it does not within `timeout_s`.

    It first waits for the port to accept a plain TCP connection, and only then opens the gRPC channel: a
    channel opened before the server listens retries on gRPC's reconnect backoff (1 s, then 1.6x more each
    time), so a role that starts beside its server (`train --topology local`) saw it up to 1.6 s late.
    """
    import reverb

    deadline = time.monotonic() + timeout_s
    refused = wait_for_port(address, deadline)
    if refused is not None:
        raise UserError(f"--replay-address {address}: no Reverb server answered within {timeout_s:g} s ({refused})")
    client = reverb.Client(address)
    try:
        client.server_info(timeout=max(1, math.ceil(deadline - time.monotonic())))
    except Exception as exc:  # pylint: disable=broad-except  # reverb raises a bare RuntimeError / DeadlineExceeded
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"--replay-address {address}: no Reverb server answered within {timeout_s:g} s ({first})"
                        ) from None
    return client


def wait_for_port(address: str, deadline: float, poll_s: float = 0.05) -> Optional[str]:
    """Waits until HOST:PORT accepts a TCP connection; None then, or the last error once `deadline` (monotonic)
    has passed."""
    host, port = parse_address(address)
    while True:
        try:
            with socket.create_connection((host, port),
                                          timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                return None
        except OSError as exc:
            if time.monotonic() >= deadline:
                return exc.strerror or str(exc) or type(exc).__name__
            time.sleep(poll_s)


class WeightSync:
    """Pushes (learner) or pulls (collector) an agent's weights through the server's `variables` table."""

    def __init__(self, address: str, agent: Any):
        import reverb
        import tensorflow as tf
        from tf_agents.experimental.distributed import reverb_variable_container as rvc

        # The constructor asks server_info with no deadline: it would wait for ever for a server that is gone.
        self.container = deadlines.within(
            deadlines.CALL_TIMEOUT_S, lambda: rvc.ReverbVariableContainer(address, table_names=[VARIABLES_TABLE]),
            "connect to the variables table")
        self.agent = agent
        self.variables = weights(agent)
        self.client = reverb.Client(address)
        flat = tf.nest.flatten(self.variables)

        def assign(*values: Any) -> None:
            for variable, value in zip(flat, values):
                variable.assign(value)

        # The container's update builds a TF sampler per call (about 3 ms); the Python client's sample and
        # one compiled assignment cost about a third of that.
        signature = [tf.TensorSpec(v.shape, v.dtype) for v in flat]
        self._assign = tf.function(assign, input_signature=signature, autograph=False).get_concrete_function()

    def push(self, values: Any = None) -> None:
        """Pushes the variables as they are now, or `values` (`copy()`'s)."""
        pushed = self.variables if values is None else values
        deadlines.within(deadlines.CALL_TIMEOUT_S, lambda: self.container.push(pushed), "push the weights")

    def copy(self) -> dict:
        """The variables' values now, as NumPy arrays in `weights`' structure."""
        import tensorflow as tf

        return tf.nest.map_structure(lambda variable: variable.numpy(), self.variables)

    def available(self) -> bool:
        return int(deadlines.server_info(self.client, 5)[VARIABLES_TABLE].current_size) > 0

    def stopped(self) -> bool:
        """The run's `stop` table has its item: the learner finished or a solve was confirmed."""
        return status.read_stop(self.client) is not None

    def pull(self) -> int:
        """Assigns the newest pushed weights (and train step) to the agent; returns that train step."""
        sample = deadlines.sample_one(self.client, VARIABLES_TABLE, "pull the weights", num_samples=1,
                                      emit_timesteps=False)
        self._assign(*[column[0] for column in sample.data])  # an inserted item is one step
        return int(self.agent.train_step_counter.numpy())

    def wait_for_first(self, stopped: Callable[[], bool], poll_s: float = 0.2) -> bool:
        """Waits until a learner has pushed once (False if `stopped()` first), so `pull` cannot block."""
        while not self.available():
            if stopped():
                return False
            time.sleep(poll_s)
        return True


log = logging.getLogger(__name__)
RETRY_S = 0.5  # between the tries of a push that failed


class WeightPusher:
    """Pushes a learner's weights from a background thread: whenever its train step has moved `every_steps`
    past the last push, soon after each `request()`, and again after `repush()` (a restarted server has an empty
    `variables` table). The thread reads the variables while the learner trains, as Acme's variable sources do; a
    push is one insert of about 1 ms. A push that fails (the server is gone) is tried again at the next wake-up:
    a server restarted on its port gets the weights as soon as it answers."""

    def __init__(self, sync: WeightSync, every_steps: int, poll_s: float = 0.01, keep_bytes: int = 0):
        self.sync, self.every_steps, self.poll_s = sync, every_steps, poll_s
        # train step -> the policy's values pushed at it, the newest up to `keep_bytes` (0: none; `pushed`)
        self.kept: collections.OrderedDict[int, tuple] = collections.OrderedDict()
        self.keep_bytes, self._kept_bytes = keep_bytes, 0
        self.pushed_step: Optional[int] = None
        self.pushes = 0
        self.error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._requested = False  # set by request(), taken by the thread under _request_lock
        self._again = False  # set by repush(): push even the weights of the last push
        self._request_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weight-pusher", daemon=True)
        self._thread.start()

    def request(self, again: bool = False) -> None:
        """Asks for a push of the current weights without waiting for it; `again` (`repush`): even if they were
        pushed already (the server lost them)."""
        with self._request_lock:
            self._requested, self._again = True, self._again or again
        self._wake.set()

    def repush(self) -> None:
        self.request(again=True)

    def push_now(self) -> int:
        """Pushes the current weights on the caller's thread (unless they were just pushed); returns their train
        step."""
        return self._push(force=True)

    def _push(self, force: bool, again: bool = False) -> int:
        with self._lock:
            step = int(self.sync.agent.train_step_counter.numpy())
            if again or step != self.pushed_step and (force or self.pushed_step is None
                                                      or step - self.pushed_step >= self.every_steps):
                if self.keep_bytes:
                    from tf_agents.experimental.distributed import reverb_variable_container as rvc

                    values = self.sync.copy()  # pushed as kept: the thread reads them while the learner trains
                    self.sync.push(values)
                    self._keep(int(values[rvc.TRAIN_STEP_KEY]), tuple(values[rvc.POLICY_KEY]))
                else:
                    self.sync.push()
                self.pushed_step, self.pushes = step, self.pushes + 1
            return step

    def _keep(self, step: int, values: tuple) -> None:
        self.kept[step] = values
        self._kept_bytes += sum(value.nbytes for value in values)
        while self._kept_bytes > self.keep_bytes and len(self.kept) > 1:
            _, dropped = self.kept.popitem(last=False)
            self._kept_bytes -= sum(value.nbytes for value in dropped)

    def pushed(self, step: int) -> Optional[tuple]:
        """The policy's values this pusher pushed at train step `step`, if they are still kept."""
        with self._lock:
            return self.kept.get(step)

    def _take_request(self) -> tuple[bool, bool]:
        """(requested, again) since the last call. Flags rather than the wake-up event, which a timed-out wait
        would clear even if a request had set it in the meantime."""
        with self._request_lock:
            taken, self._requested, self._again = (self._requested, self._again), False, False
            return taken

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.poll_s)
            if self._closed.is_set():
                return
            self._wake.clear()  # before the request is taken: one that comes later sets it again
            requested, again = self._take_request()
            try:
                self._push(force=requested, again=again)
                self.error = None
            except Exception as exc:  # pylint: disable=broad-except  # the server is gone: try again, later
                self.error = exc
                log.debug("weight push failed", exc_info=True)
                with self._request_lock:  # the failed push is still due
                    self._requested, self._again = self._requested or requested, self._again or again
                self._closed.wait(RETRY_S)

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout=1.0)  # a push stuck on a gone server is left behind (a daemon thread)
