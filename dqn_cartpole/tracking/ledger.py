"""tracking.json in a run folder: the tracked run it was sent to (backend, store, run id) and the last train step
of each metrics file already sent, so a resumed run continues the same tracked run and sends only its new rows."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Optional

from dqn_cartpole.run_folder.atomic import write_json_atomic
from dqn_cartpole.run_folder.layout import RunLayout


@dataclass(frozen=True)
class Ledger:
    """Where a run folder was sent, and how far."""

    backend: str
    store: str  # MLflow's tracking URI, W&B's project
    run_id: str
    train_step: int = -1  # the last train_metrics.csv row sent (-1: none)
    eval_step: int = -1  # the last eval_metrics.csv row sent


def sent_through(backend: str, store: str, run_id: str, train_rows: tuple, eval_rows: tuple) -> Ledger:
    """The ledger of a send of these metrics rows (`sent.Row`s): the last train step of each file."""
    return Ledger(backend, store, run_id, max([row.train_step for row in train_rows], default=-1),
                  max([row.train_step for row in eval_rows], default=-1))


def read_ledger(run_dir: str, backend: str, store: str) -> Optional[Ledger]:
    """The run's tracked run on `backend` at `store`, or None (never sent there, or the file is unreadable)."""
    try:
        with open(RunLayout(run_dir).tracking, encoding="utf-8") as handle:
            found = json.load(handle).get(backend)
        ledger = Ledger(**found)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return ledger if ledger.store == store else None


def write_ledger(run_dir: str, ledger: Ledger) -> None:
    """Records `ledger` beside the run's other backends' (a run may be sent to both)."""
    path = RunLayout(run_dir).tracking
    try:
        with open(path, encoding="utf-8") as handle:
            entries = json.load(handle)
    except (OSError, ValueError):
        entries = {}
    write_json_atomic(path, {**(entries if isinstance(entries, dict) else {}), ledger.backend: asdict(ledger)})


def local_store(output_root: str, name: str) -> str:
    """The absolute path of a local store under the config's output.root (`mlflow.db`, `wandb`)."""
    return os.path.abspath(os.path.join(output_root, name))
