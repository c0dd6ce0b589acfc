"""A run folder sent to MLflow with its own client (`MlflowClient`): a local file store under output.root
(`outputs/mlruns`, open it with `mlflow ui --backend-store-uri outputs/mlruns`) unless MLFLOW_TRACKING_URI names
another store or a server.

The resolved config are the run's parameters; the metrics are logged against the train step (`env_steps` is a
metric of its own at each step, so the UI can plot against it); the outcome is a set of metrics logged once at the
last train step; the provenance and what the user changed are tags; the files are artifacts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Iterable, Iterator
from urllib.parse import urlparse

from dqn_cartpole.tracking.ledger import local_store, read_ledger, sent_through, write_ledger
from dqn_cartpole.tracking.sent import Row, Sent, value_text

BACKEND = "mlflow"
STORE_DIR = "mlruns"
# A server that does not answer is given up on after about a minute, not MLflow's default of 7 retries of 120 s each.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
BATCH = 1000  # MLflow's log_batch takes up to 1000 metrics, 100 params and 100 tags at once
PARAMS_BATCH = 100
MAX_PARAM_CHARS = 6000


def tracking_uri(output_root: str) -> str:
    """MLFLOW_TRACKING_URI, else the local file store under `output_root`."""
    return os.environ.get("MLFLOW_TRACKING_URI") or "file://" + local_store(output_root, STORE_DIR)


def send(sent: Sent, output_root: str) -> str:
    """Sends `sent` to its MLflow run (continued when the folder was sent before); returns the run's id."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    uri = tracking_uri(output_root)
    client = MlflowClient(tracking_uri=uri)
    before = read_ledger(sent.run_dir, BACKEND, uri)
    run_id = before.run_id if before else start_run(client, sent, uri)
    now = int(time.time() * 1000)
    new_train = [row for row in sent.train_rows if row.train_step > (before.train_step if before else -1)]
    new_eval = [row for row in sent.eval_rows if row.train_step > (before.eval_step if before else -1)]
    metrics = [Metric(key, value, now, step) for key, value, step in metric_points(new_train + new_eval)]
    last_step = max([row.train_step for row in sent.train_rows + sent.eval_rows], default=0)
    metrics += [Metric(f"outcome/{key}", float(value), now, last_step) for key, value in sent.outcome.items()]
    for chunk in chunks(metrics, BATCH):
        client.log_batch(run_id, metrics=chunk)
    params, changed = new_params(client, run_id, sent.params)
    for chunk in chunks([Param(k, v) for k, v in params.items()], PARAMS_BATCH):
        client.log_batch(run_id, params=chunk)
    tags = {**sent.tags, **{f"provenance.{k}": str(v) for k, v in sent.provenance.items()}, **changed}
    for chunk in chunks([RunTag(k, v) for k, v in tags.items()], PARAMS_BATCH):
        client.log_batch(run_id, tags=chunk)
    log_files(client, run_id, sent.artifacts)
    client.set_terminated(run_id, status=sent.status)
    write_ledger(sent.run_dir, sent_through(BACKEND, uri, run_id, sent.train_rows, sent.eval_rows))
    return run_id


def start_run(client, sent: Sent, uri: str) -> str:
    """A new run in the project's experiment, made if missing. Runs of a sweep start at the same time: in a local
    file store the check and the making are held under one lock (MLflow's file store would make two experiments of one
    name); a server refuses a second one, and the run then joins the first."""
    with store_lock(uri):
        experiment = client.get_experiment_by_name(sent.project)
        if experiment is None:
            try:
                experiment_id = client.create_experiment(sent.project)
            except Exception:  # pylint: disable=broad-except  # another process made it first (a server refused it)
                found = client.get_experiment_by_name(sent.project)
                if found is None:
                    raise
                experiment_id = found.experiment_id
        else:
            experiment_id = experiment.experiment_id
        return client.create_run(experiment_id, run_name=sent.run_name, tags=sent.tags).info.run_id


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """An exclusive lock between the processes that write one local file store (`file://` or a plain path), held on
    the folder that holds the store (the store may not exist yet); nothing for a server."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        yield
        return
    parent = os.path.dirname(os.path.abspath(parsed.path if parsed.scheme else uri).rstrip("/"))
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
