"""A run folder sent to MLflow with its own client (`MlflowClient`): a local SQLite store under output.root
(`outputs/mlflow.db`, its artifacts in `outputs/mlartifacts`; open it with `mlflow ui --backend-store-uri
sqlite:///<abs path>/mlflow.db`) unless MLFLOW_TRACKING_URI names another store or a server.

The resolved config are the run's parameters; the metrics are logged against the train step (`env_steps` is a
metric of its own at each step, so the UI can plot against it), while the run goes (`stream`) and at its end; the
outcome is a set of metrics logged once at the last train step; the provenance and what the user changed are tags;
the files are artifacts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import time
from typing import Iterable, Iterator, Optional, Sequence
from urllib.parse import urlparse

from dqn_cartpole.tracking.ledger import Ledger, local_store, read_ledger, write_ledger
from dqn_cartpole.tracking.sent import Row, Sent, value_text

BACKEND = "mlflow"
STORE_FILE = "mlflow.db"  # MLflow 3 keeps its file store in maintenance mode: SQLite is its local store
ARTIFACTS_DIR = "mlartifacts"  # as `mlflow server`'s own default folder
SQLITE = "sqlite:///"
# A server that does not answer is given up on after about a minute, not MLflow's default of 7 retries of 120 s each.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
BATCH = 1000  # MLflow's log_batch takes up to 1000 metrics, 100 params and 100 tags at once
PARAMS_BATCH = 100
MAX_PARAM_CHARS = 6000


def tracking_uri(output_root: str) -> str:
    """MLFLOW_TRACKING_URI, else the local SQLite store under `output_root` (an absolute path: the store is the
    same whichever folder a sweep's job runs in)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or SQLITE + local_store(output_root, STORE_FILE)


def artifact_location(uri: str) -> Optional[str]:
    """Where a new experiment of a local SQLite store keeps its artifacts: `mlartifacts` beside the database (MLflow
    would use ./mlruns in whatever folder the run started in); None for a server or another store (their own)."""
    if not uri.startswith(SQLITE):
        return None
    return os.path.join(os.path.dirname(os.path.abspath(uri[len(SQLITE):])), ARTIFACTS_DIR)


def ui_command(uri: str) -> str:
    """The command that opens a local store in MLflow's UI (at http://127.0.0.1:5000)."""
    return f"mlflow ui --backend-store-uri {uri}"


def where_line(uri: str, project: str) -> str:
    """A tracked run's first line: the store and the experiment, and how to see them (no MLflow needed)."""
    see = f"see it with: {ui_command(uri)}" if local_path(uri) else f"see it at {uri}"
    return f"Tracking to MLflow: experiment {project} at {uri} ({see})"


def run_line(client, ledger: Ledger, continued: bool) -> str:
    """The line that names the run once it is open (on a server: its page)."""
    line = f"  MLflow run {ledger.run_id}{' (continued)' if continued else ''}: metrics sent as the run goes"
    if local_path(ledger.store):
        return line
    experiment_id = client.get_run(ledger.run_id).info.experiment_id
    return f"{line}, at {ledger.store.rstrip('/')}/#/experiments/{experiment_id}/runs/{ledger.run_id}"


def connect(uri: str):
    """An `MlflowClient` on `uri`. Its first use of a new SQLite store creates the tables (MLflow's migrations):
    held under the store's lock, so the runs of a sweep that start at once do not migrate one database twice."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from mlflow import MlflowClient

    with store_lock(uri):
        return MlflowClient(tracking_uri=uri)


def open_run(client, uri: str, run_dir: str, project: str, run_name: str, tags: dict,
             artifacts: Optional[str]) -> Ledger:
    """The ledger of the folder's MLflow run at `uri`: the one it was sent to before (running again), else a new
    one in `project` (written to tracking.json at once, so the end of the run sends to the same one)."""
    before = read_ledger(run_dir, BACKEND, uri)
    if before is not None:
        with store_lock(uri):
            client.update_run(before.run_id, status="RUNNING")
        return before
    ledger = Ledger(BACKEND, uri, start_run(client, project, run_name, tags, uri, artifacts))
    write_ledger(run_dir, ledger)
    return ledger


def log_rows(client, run_dir: str, ledger: Ledger, train_rows: Sequence[Row], eval_rows: Sequence[Row],
             extra: Sequence = ()) -> Ledger:
    """Logs the rows after the ledger's steps (and `extra` Metrics); returns the ledger that says so, written to
    the run folder's tracking.json once they are in the store."""
    from mlflow.entities import Metric

    new_train = [row for row in train_rows if row.train_step > ledger.train_step]
    new_eval = [row for row in eval_rows if row.train_step > ledger.eval_step]
    now = int(time.time() * 1000)
    metrics = [Metric(key, value, now, step) for key, value, step in metric_points(new_train + new_eval)]
    with store_lock(ledger.store):  # one writer at a time: SQLite's "database is locked" never reaches a run
        for chunk in chunks(metrics + list(extra), BATCH):
            client.log_batch(ledger.run_id, metrics=chunk)
    after = dataclasses.replace(ledger, train_step=max([ledger.train_step] + [row.train_step for row in new_train]),
                                eval_step=max([ledger.eval_step] + [row.train_step for row in new_eval]))
    if after != ledger:
        write_ledger(run_dir, after)
    return after


def send(sent: Sent, output_root: str) -> str:
    """Sends `sent` to its MLflow run (continued when the folder was sent or streamed before: only the rows not
    sent yet), then ends it; returns the run's id."""
    from mlflow.entities import Metric, Param, RunTag

    uri = tracking_uri(output_root)
    client = connect(uri)
    ledger = open_run(client, uri, sent.run_dir, sent.project, sent.run_name, sent.tags, artifact_location(uri))
    now = int(time.time() * 1000)
    last_step = max([row.train_step for row in sent.train_rows + sent.eval_rows], default=0)
    outcome = [Metric(f"outcome/{key}", float(value), now, last_step) for key, value in sent.outcome.items()]
    ledger = log_rows(client, sent.run_dir, ledger, sent.train_rows, sent.eval_rows, outcome)
    params, changed = new_params(client, ledger.run_id, sent.params)
    tags = {**sent.tags, **{f"provenance.{k}": str(v) for k, v in sent.provenance.items()}, **changed}
    with store_lock(uri):
        for chunk in chunks([Param(k, v) for k, v in params.items()], PARAMS_BATCH):
            client.log_batch(ledger.run_id, params=chunk)
        for chunk in chunks([RunTag(k, v) for k, v in tags.items()], PARAMS_BATCH):
            client.log_batch(ledger.run_id, tags=chunk)
    log_files(client, ledger.run_id, sent.artifacts)
    with store_lock(uri):
        client.set_terminated(ledger.run_id, status=sent.status)
    return ledger.run_id


def start_run(client, project: str, run_name: str, tags: dict, uri: str, artifacts: Optional[str]) -> str:
    """A new run in the project's experiment, made if missing. Runs of a sweep start at the same time: in a local
    store the check and the making are held under one lock (else two experiments of one name, or a refused
    second one); a server refuses a second one, and the run then joins the first."""
    with store_lock(uri):
        experiment = client.get_experiment_by_name(project)
        if experiment is None:
            try:
                experiment_id = client.create_experiment(project, artifact_location=artifacts)
            except Exception:  # pylint: disable=broad-except  # another process made it first (a server refused it)
                found = client.get_experiment_by_name(project)
                if found is None:
                    raise
                experiment_id = found.experiment_id
        else:
            experiment_id = experiment.experiment_id
        return client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id


def local_path(uri: str) -> Optional[str]:
    """The file or folder of a local store (`sqlite:///PATH`, `file://PATH` or a plain path); None for a server."""
    if uri.startswith(SQLITE):
        return uri[len(SQLITE):]
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return parsed.path if parsed.scheme else uri
    return None


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """An exclusive lock between the processes that write one local store (SQLite, or a `file://` store), held on
    the folder that holds the store (the store may not exist yet); nothing for a server."""
    path = local_path(uri)
    if path is None:
        yield
        return
    parent = os.path.dirname(os.path.abspath(path).rstrip("/"))
    os.makedirs(parent, exist_ok=True)
    descriptor = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def metric_points(rows: Iterable[Row]) -> Iterator[tuple]:
    """(key, value, train step) of every value of `rows`, and each row's env steps (`env_steps`)."""
    steps_logged = set()
    for row in sorted(rows, key=lambda row: row.train_step):  # train rows and evaluations, by step
        if row.train_step not in steps_logged:
            steps_logged.add(row.train_step)
            yield "env_steps", float(row.env_steps), row.train_step
        for key, value in row.values.items():
            yield key, value, row.train_step


def new_params(client, run_id: str, params: dict) -> tuple[dict, dict]:
    """The parameters the run has not logged yet, and a `resumed.KEY` tag for each one a resume changed (MLflow's
    parameters cannot change once logged)."""
    logged = client.get_run(run_id).data.params
    texts = {key: value_text(value)[:MAX_PARAM_CHARS] for key, value in params.items()}
    fresh = {key: text for key, text in texts.items() if key not in logged}
    changed = {f"resumed.{key}": text for key, text in texts.items() if key in logged and logged[key] != text}
    return fresh, changed


def log_files(client, run_id: str, artifacts: dict) -> None:
    """Each artifact under its folder (policy/final as a folder)."""
    for folder, paths in artifacts.items():
        for path in paths:
            if os.path.isdir(path):
                client.log_artifacts(run_id, path, os.path.join(folder, os.path.basename(path)))
            else:
                client.log_artifact(run_id, path, folder or None)


def chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
