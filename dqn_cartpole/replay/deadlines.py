"""Reverb calls with a deadline.

Reverb 0.14's client sets gRPC's `wait_for_ready` and retries UNAVAILABLE without end: a sample,
an insert, a weight pull or a checkpoint made while the server is gone (or was never there)
waits forever, and a signal handler cannot run while the calling thread is in C++. Only
`server_info(timeout=)` and a writer's `flush(timeout_ms=)` take a deadline of their own.

`within` gives every other call one: it runs the call on a daemon thread and waits for it at most
`timeout_s` (the waiting thread stays responsive to signals). A call that does not answer in time
raises `ServerUnanswered`; its thread is left behind, blocked in the client, and ends with the
process. Starting a thread costs about 0.1 ms: cheap next to any call to a server.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")

# A call to a live server answers in milliseconds; a table checkpoint of a full replay takes longer.
CALL_TIMEOUT_S = 10.0
CHECKPOINT_TIMEOUT_S = 60.0


class ServerUnanswered(TimeoutError):
    """A call to the Reverb server did not answer within its deadline (the server is gone, or stuck)."""


def within(timeout_s: float, call: Callable[[], T], what: str) -> T:
    """`call()`'s result (or its exception) if it returns within `timeout_s`; ServerUnanswered otherwise."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # pylint: disable=broad-except  # handed to the caller
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"reverb {what}", daemon=True).start()
    if not done.wait(timeout_s):
        raise ServerUnanswered(f"{what}: the replay server did not answer within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def server_info(client: Any, timeout_s: float = CALL_TIMEOUT_S) -> dict:
    """`client.server_info()` with a deadline (Reverb's own, in whole seconds); ServerUnanswered when it passes."""
    from reverb import errors

    try:
        return client.server_info(timeout=max(1, int(round(timeout_s))))
    except errors.DeadlineExceededError:
        raise ServerUnanswered(f"server_info: the replay server did not answer within {timeout_s:g} s") from None
