"""Where a Ray process runs, and how to keep an actor on one node: the one place for both.

`this_node()` names the node of the calling process (the driver, an actor or a task) with the same keys everywhere:
`node_id` (Ray's hex id), `node_ip` (the address Ray's raylet registered, which other nodes reach) and `host`.
`pinned_to(node_id)` is the `.options(...)` that keeps an actor on that node and nowhere else (the replay server, the
learner and the evaluator beside the run folder).
"""

from __future__ import annotations

import socket


def this_node() -> dict:
    """The node of the calling Ray process: {"node_id", "node_ip", "host"}."""
    import ray  # pylint: disable=import-outside-toplevel  # Ray is an extra

    node_id = ray.get_runtime_context().get_node_id()
    registered = next((node for node in ray.nodes() if node.get("NodeID") == node_id), {})
    return {"node_id": node_id, "node_ip": registered.get("NodeManagerAddress") or ray.util.get_node_ip_address(),
            "host": socket.gethostname()}


def pinned_to(node_id: str) -> dict:
    """Actor options that place it on `node_id` only (a hard affinity: it waits for that node rather than move)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # pylint: disable=import-outside-toplevel

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
