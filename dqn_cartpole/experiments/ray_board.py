"""The driver's board on the cluster: a small Ray actor where running runs post news and read their orders.

A worker cannot be reached from the driver, but both reach an actor. Each run posts when it starts (on which
node) and, for a study, its new evaluations; every second it asks whether to stop, and with which signal: the
driver's Ctrl-C (SIGINT, as a local sweep forwards it) for every run, or SIGTERM for one the pruner stopped. The
driver drains the news in its loop. The actor takes no CPU and lives on the driver's node, so losing another
node never loses it.
"""

from __future__ import annotations

from typing import Optional


class Board:
    """News from the runs (`drain`), orders to them (`stop`, `stop_all`). Events: ("started", key, attempt, node)
    and ("evaluations", key, attempt, [(env_steps, average_return), ...])."""

    def __init__(self) -> None:
        self.events: list = []
        self.stops: dict = {}
        self.stop_everything: Optional[int] = None

    # -- the runs
    def started(self, key: str, attempt: int, node: dict) -> None:
        self.events.append(("started", key, attempt, node))

    def poll(self, key: str, attempt: int, evaluations: list) -> Optional[int]:
        """Posts the run's new evaluations; returns the signal it should stop with, or None."""
        if evaluations:
            self.events.append(("evaluations", key, attempt, evaluations))
        return self.stops.get(key) or self.stop_everything

    # -- the driver
    def drain(self) -> list:
        events, self.events = self.events, []
        return events

    def stop(self, key: str, signum: int) -> None:
        self.stops[key] = signum

    def forget(self, key: str) -> None:
        self.stops.pop(key, None)

    def stop_all(self, signum: int) -> None:
        self.stop_everything = signum


def start_board(ray):
    """The board actor, pinned to the driver's node, taking no CPU."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    actor = ray.remote(Board).options(num_cpus=0, max_concurrency=1,
                                      scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
    return actor.remote()
