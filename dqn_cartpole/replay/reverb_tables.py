"""Reverb's server side: the tables a DQN replay needs, and a server's life (port, checkpoints, stop).

The same tables serve an embedded server (started in the training process) and a standalone
one; clients (`replay.reverb_client`) only need its address. A replay that lives on the
learner (`replay.learner_side`) needs only a queue table on the server, which carries the
collectors' windows to it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Optional

from dqn_cartpole.errors import UserError

TABLE_NAME = "uniform_table"
# A second view of the same items (no copy of the data), ordered by insertion, for single_pass.
PASS_TABLE_NAME = "insertion_order"
# A queue of windows on their way to a learner that keeps its replay itself.
QUEUE_TABLE_NAME = "queue"


@dataclass(frozen=True)
class SampleRatio:
    """Reverb's SampleToInsertRatio: sampled / inserted items held near `samples_per_insert`,
    within `tolerance` sampled items, once the table holds `min_size` items."""

    samples_per_insert: float
    min_size: int
    tolerance: float


def make_replay_tables(data_spec: Any, capacity: int, sequence_length: int,
                       ratio: Optional[SampleRatio] = None, priority_exponent: Optional[float] = None) -> list:
    """The uniform table training samples, and an insertion-order view of the same items.

    Both hold the same items (their data is shared, not copied) and evict the same oldest one.
    Training samples the uniform table; `single_pass` walks the min-heap one, whose priorities
    are insertion indices. With `ratio` the uniform table's samples and inserts wait on each other.
    With `priority_exponent` (alpha, prioritized replay) the training table samples each item with
    probability priority^alpha / sum priority^alpha instead of uniformly (a `Prioritized` selector).
    """
    import reverb  # only this backend pays for importing Reverb

    from dqn_cartpole.replay.packing import StepPacker  # not at the top: check_port_free runs before TensorFlow

    signature = StepPacker(data_spec).window_spec(sequence_length)  # a window of packed steps (see replay.packing)

    def table(name: str, sampler: Any, rate_limiter: Any) -> Any:
        return reverb.Table(name, max_size=capacity, sampler=sampler, remover=reverb.selectors.Fifo(),
                            rate_limiter=rate_limiter, signature=signature)

    limiter = reverb.rate_limiters.MinSize(1) if ratio is None else \
        reverb.rate_limiters.SampleToInsertRatio(ratio.samples_per_insert, ratio.min_size, ratio.tolerance)
    sampler = reverb.selectors.Uniform() if priority_exponent is None else \
        reverb.selectors.Prioritized(priority_exponent)
    return [table(TABLE_NAME, sampler, limiter),
            table(PASS_TABLE_NAME, reverb.selectors.MinHeap(), reverb.rate_limiters.MinSize(1))]


def make_queue_table(data_spec: Any, sequence_length: int, max_size: int) -> Any:
    """A FIFO queue of (sequence_length)-step windows: each item is read once, by one learner.

    Reverb's `Queue` rate limiter makes writers wait while it holds `max_size` items (the learner
    has fallen behind) and readers wait while it is empty (the collectors have).
    """
    import reverb

    from dqn_cartpole.replay.packing import StepPacker

    signature = StepPacker(data_spec).window_spec(sequence_length)
    return reverb.Table.queue(QUEUE_TABLE_NAME, max_size=max_size, signature=signature)


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (or [v6]:PORT) -> (host, port); one-line UserError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--replay-address {text!r}: expected HOST:PORT, e.g. localhost:8000")
    return host.strip("[]"), int(port)


def check_port_free(port: int) -> None:
    """Refuses a port something already listens on, with one line.

    gRPC sets SO_REUSEPORT, so a second Reverb server on a used port would start without error
    and split the clients between the two; a plain bind sees the conflict.
    """
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        # As gRPC binds: the connections of a server killed on this port, left in TIME_WAIT, do not count (a
        # server restarted on its port would wait a minute for them); a socket that listens there still does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("::", port))
        except OSError as exc:
            raise UserError(f"replay.reverb_port: port {port} is already in use ({exc.strerror}); choose "
                            f"another port, or null for a free one") from None


class ReplayServer:
    """A Reverb server with the DQN tables: started at construction, stopped by `stop()` (idempotent)."""

    def __init__(self, tables: list, port: Optional[int] = None, checkpoint_dir: Optional[str] = None):
        import reverb

        if port:
            check_port_free(port)
        checkpointer = reverb.checkpointers.DefaultCheckpointer(checkpoint_dir) if checkpoint_dir else None
        try:
            self.server = reverb.Server(tables, port=port, checkpointer=checkpointer)
        except Exception as exc:  # pylint: disable=broad-except  # reverb raises bare RuntimeError/ValueError
            raise UserError(reverb_start_problem(exc, port, checkpoint_dir)) from None
        self.port = self.server.port

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            # A stopped server keeps ~35 threads until the object is freed: drop the reference.
            self.server = None


def exposure_line(port: int) -> str:
    """The one line every Reverb server prints: the port, and that it is open to the network."""
    return (f"Reverb replay server on port {port}, listening on ALL network interfaces (*:{port}) with no "
            f"authentication; set replay.backend: tf_uniform to open no port.")


def reverb_start_problem(exc: Exception, port: Optional[int], checkpoint_dir: Optional[str]) -> str:
    """One line saying why the Reverb server did not start: its port, or the table checkpoint it loads."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if "BuildAndStart" in first or "address" in first.lower():
        where = f"port {port}" if port else "a free port"
        return f"replay.reverb_port: cannot start the Reverb server on {where}: {first}"
    if checkpoint_dir and os.path.isdir(checkpoint_dir) and os.listdir(checkpoint_dir):
        return f"cannot start the Reverb server from the table checkpoint in {checkpoint_dir}: {first}"
    return f"cannot start the Reverb server: {first}"
