"""What the roles tell each other through the server: the newest evaluation, and when to stop.

Two one-item tables next to `variables`, read without removing (`max_times_sampled=0`):

* `evaluation`: the evaluator's newest result (train step, average return, the best so far, and
  whether a solve was confirmed). The learner reads it between chunks, so its progress line,
  checkpoints and summary know the returns without evaluating itself.
* `stop`: written once, by the learner when it stops for good (all its iterations trained, or the
  evaluator's solve confirmed). Collectors and the evaluator check it and exit cleanly (status 0).
  Only the learner writes it: a collector leaving while the learner still samples could hold the
  learner's samples back under a samples-per-insert ratio.

Both are cleared when a server starts: a restored table must not stop a resumed run at once.
Every call has a deadline (`replay.deadlines`: `TIMEOUT_S`, then ServerUnanswered), so no role freezes
on a server that went away; a learner's `StatusWatch` also says how long the server has not answered.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dqn_cartpole.replay import deadlines

EVALUATION_TABLE = "evaluation"
STOP_TABLE = "stop"
TIMEOUT_S = 10

EVALUATION_FIELDS = {"train_step": "int64", "env_steps": "int64", "average_return": "float64",
                     "best_return": "float64", "best_iteration": "int64", "solved": "int64",
                     "solved_return": "float64", "solved_episodes": "int64", "solved_train_step": "int64"}
STOP_FIELDS = {"train_step": "int64", "solved": "int64"}


@dataclass(frozen=True)
class Evaluation:
    """One published evaluation (`solved`: a solve check on fresh episodes confirmed `solved_return`)."""

    train_step: int
    env_steps: int
    average_return: float
    best_return: float
    best_iteration: int
    solved: bool = False
    solved_return: float = float("nan")
    solved_episodes: int = 0
    solved_train_step: int = -1  # the train step of the weights that passed the check (-1: none did)


@dataclass(frozen=True)
class Stop:
    """Why the run ends: the learner stopped at `train_step`, having trained all its iterations or on a solve."""

    train_step: int
    solved: bool


def one_item_table(name: str, signature: Any) -> Any:
    """One item, never removed by sampling (max_times_sampled=0: every role reads it), readable once written."""
    import reverb

    return reverb.Table(name, sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                        rate_limiter=reverb.rate_limiters.MinSize(1), max_size=1, max_times_sampled=0,
                        signature=signature)


def make_tables() -> list:
    """The `evaluation` and `stop` tables, for the replay server."""
    import tensorflow as tf

    return [one_item_table(name, {key: tf.TensorSpec((), tf.as_dtype(dtype)) for key, dtype in fields.items()})
            for name, fields in ((EVALUATION_TABLE, EVALUATION_FIELDS), (STOP_TABLE, STOP_FIELDS))]


def clear(client: Any) -> None:
    """Empties both tables (a server restored from a checkpoint starts with no stop and no result)."""
    for table in (EVALUATION_TABLE, STOP_TABLE):
        deadlines.within(TIMEOUT_S, lambda table=table: client.reset(table), f"reset {table}")


def _insert(client: Any, table: str, fields: dict, values: dict) -> None:
    import numpy as np

    item = {key: np.asarray(values[key], dtype=dtype) for key, dtype in fields.items()}
    deadlines.within(TIMEOUT_S, lambda: client.insert(item, priorities={table: 1.0}), f"insert into {table}")


def _read(client: Any, table: str, fields: dict, info: Optional[dict] = None) -> Optional[dict]:
    """The table's item as a dict of Python numbers, or None while it is empty (`info`: a fresh server_info)."""
    info = info if info is not None else deadlines.server_info(client, TIMEOUT_S)
    if int(info[table].current_size) == 0:
        return None
    # The item cannot go away between the two calls: it is only replaced (max_size 1, never sampled out).
    sample = deadlines.sample_one(client, table, f"sample {table}", TIMEOUT_S, num_samples=1, emit_timesteps=False,
                                  unpack_as_table_signature=True)
    return {key: sample.data[key].item() for key in fields}


def publish_evaluation(client: Any, evaluation: Evaluation) -> None:
    _insert(client, EVALUATION_TABLE, EVALUATION_FIELDS, {**evaluation.__dict__, "solved": int(evaluation.solved)})


def read_evaluation(client: Any, info: Optional[dict] = None) -> Optional[Evaluation]:
    values = _read(client, EVALUATION_TABLE, EVALUATION_FIELDS, info)
    return None if values is None else Evaluation(**{**values, "solved": bool(values["solved"])})


def publish_stop(client: Any, train_step: int, solved: bool) -> None:
    _insert(client, STOP_TABLE, STOP_FIELDS, {"train_step": train_step, "solved": int(solved)})


def read_stop(client: Any) -> Optional[Stop]:
    values = _read(client, STOP_TABLE, STOP_FIELDS)
    return None if values is None else Stop(values["train_step"], bool(values["solved"]))


log = logging.getLogger(__name__)


class StatusWatch:
    """What a learner learns from the server, read every `poll_s` by a background thread, so its chunk
    boundaries make no call: the evaluator's newest result and the tables' `server_info` (counts).

    When the server has not answered for `lost_after_s` (gone, or stuck), `lost` is set and `on_lost()` is called
    once, from the watch's thread: the learner then stops reading (its read would wait for ever) and checkpoints.
    """

    def __init__(self, client: Any, poll_s: float = 0.5, lost_after_s: Optional[float] = None,
                 on_lost: Callable[[], None] = lambda: None, on_info: Callable[[dict], None] = lambda info: None):
        self.client, self.poll_s, self.lost_after_s, self.on_lost = client, poll_s, lost_after_s, on_lost
        self.on_info = on_info  # each fresh server_info (a learner sees there a restarted server's empty tables)
        self.evaluation: Optional[Evaluation] = None
        self.server_info: Optional[dict] = None
        self.lost = False
        self.answered_at = time.monotonic()
        self._closed = threading.Event()
        self.poll()
        self._thread = threading.Thread(target=self._run, name="status-watch", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        """Reads both now (the caller's thread)."""
        info = deadlines.server_info(self.client, min(TIMEOUT_S, self.poll_s + 1))
        self.evaluation = read_evaluation(self.client, info) or self.evaluation
        self.server_info = info
        self.answered_at = time.monotonic()
        self.on_info(info)

    def unanswered_s(self) -> float:
        """Seconds since the server last answered."""
        return time.monotonic() - self.answered_at

    def _run(self) -> None:
        while not self._closed.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # pylint: disable=broad-except  # the server went away: the learner's reads fail too
                log.debug("status poll failed", exc_info=True)
                self._check_lost()

    def _check_lost(self) -> None:
        if self.lost or self.lost_after_s is None or self.unanswered_s() < self.lost_after_s:
            return
        self.lost = True
        self.on_lost()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=1.0)  # a poll stuck on a gone server is left behind (a daemon thread)
