"""Reverb calls with a deadline.

Reverb 0.14's client sets gRPC's `wait_for_ready` and retries UNAVAILABLE without end: a sample,
an insert, a weight pull or a checkpoint made while the server is gone (or was never there)
waits forever, and a signal handler cannot run while the calling thread is in C++. Only
`server_info(timeout=)` and a writer's `flush(timeout_ms=)` take a deadline of their own.

`within` gives every other call one: it runs the call on a worker thread (one per calling thread,
kept between calls: about 0.1 ms a call, a new thread each time cost 0.3 ms) and waits for it at most
`timeout_s` (the waiting thread stays responsive to signals), and at most AFTER_STOP_S once a role's
stop signal has come (`console.signals.stop_seen_at`), so a role's graceful stop is not spent
waiting on a server that is gone. A call that does not answer in time raises `ServerUnanswered`;
its worker is left behind, blocked in the client, and ends with the process (the next call gets a
new one). Reverb's own errors (a bare RuntimeError: "Socket closed", "Error when confirming...")
become `ServerFailed`; both are a `ServerProblem`.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from typing import Any, Callable, Optional, TypeVar

from dqn_cartpole.console import signals

T = TypeVar("T")

# A call to a live server answers in milliseconds; a table checkpoint of a full replay takes longer.
CALL_TIMEOUT_S = 10.0
CHECKPOINT_TIMEOUT_S = 60.0
AFTER_STOP_S = 2.0
SLICE_S = 0.1


class ServerProblem(Exception):
    """A call to the Reverb server failed or did not answer."""


class ServerUnanswered(ServerProblem):
    """A call to the Reverb server did not answer within its deadline (the server is gone, or stuck)."""


class ServerFailed(ServerProblem, RuntimeError):
    """Reverb's client gave up on a call with its own error (the connection to the server broke)."""


def within(timeout_s: float, call: Callable[[], T], what: str, after_stop_s: Optional[float] = AFTER_STOP_S) -> T:
    """`call()`'s result (or its exception) if it returns within `timeout_s` (and within `after_stop_s` of a
    role's stop signal; None: no such limit); ServerUnanswered otherwise."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # pylint: disable=broad-except  # handed to the caller
            outcome["error"] = exc
        finally:
            done.set()

    started = time.monotonic()
    _worker().jobs.put(run)
    while not done.wait(SLICE_S):
        waited = time.monotonic() - started
        if waited >= timeout_s or _stopped_for(after_stop_s, started):
            _workers.current = None  # stuck in the call: the next call gets a new worker
            raise ServerUnanswered(f"{what}: the replay server did not answer within {waited:.0f} s")
    error = outcome.get("error")
    if isinstance(error, RuntimeError) and not isinstance(error, ServerProblem):
        first = (str(error).strip().splitlines() or ["no message"])[0]
        raise ServerFailed(f"{what}: {first}") from error
    if error is not None:
        raise error
    return outcome["value"]


class _Worker:
    """A daemon thread that runs the calls one calling thread hands it, one at a time."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="reverb call", daemon=True).start()

    def _run(self) -> None:
        while True:
            self.jobs.get()()


_workers = threading.local()


def _worker() -> _Worker:
    """The calling thread's worker (made on its first call, or after its last one was left stuck)."""
    if getattr(_workers, "current", None) is None:
        _workers.current = _Worker()
    return _workers.current


def _stopped_for(after_stop_s: Optional[float], started: float) -> bool:
    """Whether a role's stop signal came, and this call has waited `after_stop_s` since (or since it started)."""
    seen = signals.stop_seen_at()
    return after_stop_s is not None and seen is not None and time.monotonic() - max(seen, started) >= after_stop_s


def sample_one(client: Any, table: str, what: str, timeout_s: Optional[float] = None, **options: Any) -> Any:
    """One item of `table` (`client.sample(table, **options)`'s first), within `timeout_s` (None: CALL_TIMEOUT_S
    as it is at the call): Reverb's sampler has no deadline of its own, and retries a server that is gone for ever."""
    return within(CALL_TIMEOUT_S if timeout_s is None else timeout_s, lambda: next(client.sample(table, **options)),
                  what)


def checkpoint(client: Any) -> str:
    """`client.checkpoint()` (the server's tables into its checkpoint folder; returns the path) within
    CHECKPOINT_TIMEOUT_S; a stop does not shorten it: the checkpoint on a stop gets its whole time."""
    return within(CHECKPOINT_TIMEOUT_S, client.checkpoint, "checkpoint the tables", after_stop_s=None)


def server_info(client: Any, timeout_s: float = CALL_TIMEOUT_S) -> dict:
    """`client.server_info()` with a deadline: Reverb's own (whole seconds, in C++, where no signal handler runs), and
    `within`'s, so a stop signal is not held up by it either; ServerUnanswered when either passes."""
    from reverb import errors

    def ask() -> dict:
        try:
            return client.server_info(timeout=max(1, math.ceil(timeout_s)))
        except errors.DeadlineExceededError:
            raise ServerUnanswered(f"server_info: the replay server did not answer within {timeout_s:g} s") from None

    return within(timeout_s + 1, ask, "server_info")
