"""`--track mlflow | wandb` (docs/tracking.md) with the real libraries, nothing sent over a network: a short tracked
run whose metrics are read from MLflow's store while it is held at an evaluation, then read back with MLflow's own
client once it ended; the same run folder written to W&B offline and read back from its offline run file; a resumed
run that continues its tracked run; a sweep of two seeds in one group (and runs that start at once in one new SQLite
store); a `--topology ray` run tracked from the same environment; a server that does not answer, a store that
fills up while the run goes and a store on a full disk (a warning line each, a normal run); a missing extra refused
before anything trains; and no import of either library without --track.

One tracked run (configs/smoke.yaml, 150 iterations, in a folder of its own) serves every read-back; the resume test
continues it last. Every store is under the test's own folder (W&B's cache and config folders too, not HOME)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from helpers import CONFIGS, REPO, cli_command, cli_env, free_port, processes_of, rows, run_cli, wait_for

import dqn_cartpole as dq
from dqn_cartpole.config import apply_override, load_config
from dqn_cartpole.experiments.tracking_group import group_overrides, trial_tags
from dqn_cartpole.tracking.send import send_run
from dqn_cartpole.tracking.sent import value_text

SMOKE = os.path.join(CONFIGS, "smoke.yaml")
ITERATIONS = 150  # train rows at 50, 100, 150; evaluations at 0, 100, 150


def tracking_env(root: str, **extra: str) -> dict:
    """A CLI's environment: no MLflow server named, W&B's own folders in `root`, nothing from HOME."""
    env = cli_env(WANDB_CACHE_DIR=os.path.join(root, "wandb-cache"), WANDB_CONFIG_DIR=os.path.join(root, "wandb-config"),
                  WANDB_DATA_DIR=os.path.join(root, "wandb-data"))
    for name in ("WANDB_MODE", "WANDB_API_KEY", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    env.update(extra)
    return env


def store_uri(root: str) -> str:
    """The default store of a run whose output.root is `root`/outputs."""
    return "sqlite:///" + os.path.join(root, "outputs", "mlflow.db")


def metric_steps(uri: str, key: str, run_dir: str) -> dict:
    """run id -> the steps of `key` in the store at `uri`, read by a fresh MlflowClient (as another process would),
    once the run's follower has made the store and opened the run (its ledger says so)."""
    from mlflow import MlflowClient

    if not os.path.exists(os.path.join(run_dir, "tracking.json")):
        return {}
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dqn_cartpole")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return {run.info.run_id: sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) for run in runs}


def held_at_an_evaluation(process: subprocess.Popen, run_dir: str, uri: str) -> dict:
    """Stops the training process (SIGSTOP) once eval_metrics.csv holds its first evaluation, then waits for that
    evaluation in the MLflow store (only the follower can send it now), and lets the run go on: what was seen."""
    evaluations = os.path.join(run_dir, "eval_metrics.csv")
    wait_for(lambda: process.poll() is not None or (os.path.exists(evaluations) and rows(evaluations)), 240,
             "the first evaluation in eval_metrics.csv")
    assert process.poll() is None, "the run ended before it could be held"
    os.kill(process.pid, signal.SIGSTOP)
    try:
        held_rows = rows(evaluations)
        wait_for(lambda: any(metric_steps(uri, "eval/average_return", run_dir).values()), 300,
                 "the held run's evaluation in MLflow's store", poll_s=1.0)
        from mlflow import MlflowClient

        (run_id, seen), = metric_steps(uri, "eval/average_return", run_dir).items()
        run = MlflowClient(tracking_uri=uri).get_run(run_id)
        return {"steps": seen, "csv_steps": [int(r["train_step"]) for r in held_rows], "status": run.info.status,
                "summary_then": os.path.exists(os.path.join(run_dir, "summary.json")), "run_id": run_id}
    finally:
        os.kill(process.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """`train --config smoke --track mlflow` in a fresh folder (output.root there), held at its first evaluation
    while its metrics are read from the store: (root, run folder, the finished process, what was seen held)."""
    root = str(tmp_path_factory.mktemp("tracking"))
    run_dir = os.path.join(root, "outputs", "run")
    process = subprocess.Popen(cli_command("train", "--config", SMOKE, "--track", "mlflow", "-n", str(ITERATIONS),
                                           "--output-dir", run_dir, "--quiet", "--set",
                                           "tracking.tags=[team=rl, nightly]"),
                               cwd=root, env=tracking_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        held = held_at_an_evaluation(process, run_dir, store_uri(root))
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    proc = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, run_dir, proc, held


def ledger(run_dir: str, backend: str) -> dict:
    with open(os.path.join(run_dir, "tracking.json"), encoding="utf-8") as handle:
        return json.load(handle)[backend]


def mlflow_run(run_dir: str):
    """(client, run) of the run folder's MLflow run, read with MLflow's own client."""
    from mlflow import MlflowClient

    entry = ledger(run_dir, "mlflow")
    client = MlflowClient(tracking_uri=entry["store"])
    return client, client.get_run(entry["run_id"])


def artifact_paths(client, run_id: str, path=None) -> set:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def steps(client, run_id: str, key: str) -> list:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_a_running_run_shows_its_metrics_in_mlflow_before_it_ends(tracked):
    """Held (SIGSTOP) after its first evaluation, the run's evaluation is read from the store by a fresh client:
    the follower sent it while the run was running, with no summary yet; the run id is the one the run named."""
    _, run_dir, proc, held = tracked
    assert held["steps"] == held["csv_steps"][:len(held["steps"])] and held["steps"][0] == 0, held
    assert held["status"] == "RUNNING" and not held["summary_then"]
    assert held["run_id"] == ledger(run_dir, "mlflow")["run_id"]
    assert not processes_of(run_dir), "the follower outlived its run"


def test_a_tracked_runs_first_lines_say_where_it_goes(tracked):
    root, run_dir, proc, _ = tracked
    uri = store_uri(root)
    lines = proc.stderr.splitlines()  # with the progress bar's other messages
    assert lines[0].startswith("Training CartPole-v1 with smoke.yaml")
    assert lines[1] == (f"Tracking to MLflow: experiment dqn_cartpole at {uri} (see it with: mlflow ui "
                        f"--backend-store-uri {uri})")
    assert f"  MLflow run {ledger(run_dir, 'mlflow')['run_id']}: metrics sent as the run goes" in lines


def test_a_tracked_run_reads_back_with_mlflows_client(tracked):
    root, run_dir, proc, _ = tracked
    client, run = mlflow_run(run_dir)
    assert "warning" not in proc.stderr and "INFO" not in proc.stderr
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert ledger(run_dir, "mlflow")["store"] == store_uri(root)
    assert client.get_experiment(run.info.experiment_id).name == "dqn_cartpole"
    # the resolved config, every key
    config = dq.load_config(os.path.join(run_dir, "config.yaml"))
    from dqn_cartpole.config import to_dict
    expected = {f"{s}.{k}": value_text(v) for s, keys in to_dict(config).items() for k, v in keys.items()}
    assert run.data.params == expected
    # tags: the seed, the user's own, what the user wrote, the provenance
    tags = run.data.tags
    assert tags["seed"] == "0" and tags["team"] == "rl" and tags["nightly"] == ""
    assert tags["changed.training.num_iterations"] == str(ITERATIONS) and tags["changed.tracking.backend"] == "mlflow"
    assert tags["provenance.tensorflow"] == "2.15.1" and tags["provenance.python"]
    # the metrics against the train step: the last train step is train_metrics.csv's, every value as written
    train, evaluations = rows(os.path.join(run_dir, "train_metrics.csv")), rows(os.path.join(run_dir,
                                                                                              "eval_metrics.csv"))
    loss = steps(client, run.info.run_id, "loss")
    assert [step for step, _ in loss] == [int(r["train_step"]) for r in train if r["loss"]]
    assert loss[-1][0] == int(train[-1]["train_step"]) == ITERATIONS
    assert [v for _, v in loss] == pytest.approx([float(r["loss"]) for r in train if r["loss"]])
    returns = steps(client, run.info.run_id, "eval/average_return")
    assert returns == [(int(r["train_step"]), pytest.approx(float(r["average_return"]))) for r in evaluations]
    env_steps = dict(steps(client, run.info.run_id, "env_steps"))
    assert all(env_steps[int(r["train_step"])] == float(r["env_steps"]) for r in train + evaluations)
    # the outcome, from summary.json
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert steps(client, run.info.run_id, "outcome/best_return") == [(ITERATIONS,
                                                                      pytest.approx(summary["best_return"]))]
    assert steps(client, run.info.run_id, "outcome/iterations") == [(ITERATIONS, ITERATIONS)]
    # the artifacts
    found = artifact_paths(client, run.info.run_id)
    assert {"report.html", "config.yaml", "summary.json", "plots/returns.png", "plots/loss.png",
            "videos/trained-agent.mp4", "videos/random-agent.mp4", "policy/final/saved_model.pb"} <= found
    with open(client.download_artifacts(run.info.run_id, "summary.json", os.path.join(root, "download")),
              encoding="utf-8") as handle:
        assert json.load(handle)["iterations"] == ITERATIONS


def read_offline_run(run_file: str) -> dict:
    """A W&B offline run file (run-ID.wandb) read with W&B's own record reader: its run record, config, history
    rows, summary and artifact records."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    store = datastore.DataStore()
    store.open_for_scan(run_file)
    found = {"run": None, "config": {}, "history": [], "summary": {}, "artifacts": []}

    def items(updates) -> dict:
        return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in updates}

    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found["run"] = record.run
            found["config"].update(items(record.run.config.update))
        elif kind == "config":
            found["config"].update(items(record.config.update))
        elif kind == "history":
            found["history"].append(items(record.history.item))
        elif kind == "summary":
            found["summary"].update(items(record.summary.update))
        elif kind == "artifact":
            found["artifacts"].append(record.artifact)
    return found


def test_the_same_run_folder_in_wandb_offline_reads_back(tracked, tmp_path, monkeypatch):
    """W&B in offline mode: the run file under output.root/wandb/, read back record by record."""
    root, run_dir, _, _ = tracked
    for name, value in tracking_env(str(tmp_path)).items():
        if name.startswith("WANDB_"):
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.chdir(root)  # output.root (outputs) is the tracked run's
    config = apply_override(load_config(os.path.join(run_dir, "config.yaml")), "tracking.backend=wandb")
    warnings = []
    run_id = send_run(config, run_dir, warnings.append)
    assert warnings == [] and run_id == ledger(run_dir, "wandb")["run_id"]
    (run_file,) = glob.glob(os.path.join(root, "outputs", "wandb", f"offline-run-*-{run_id}", f"run-{run_id}.wandb"))
    offline = read_offline_run(run_file)
    assert offline["run"].project == "dqn_cartpole" and offline["run"].display_name == "run"
    assert {"seed=0", "team=rl", "nightly"} <= set(offline["run"].tags)
    assert offline["config"]["training"]["num_iterations"] == ITERATIONS
    assert offline["config"]["provenance"]["tensorflow"] == "2.15.1"
    train = rows(os.path.join(run_dir, "train_metrics.csv"))
    history = offline["history"]
    assert [h["_step"] for h in history] == [0, 50, 100, ITERATIONS]
    assert history[-1]["train_step"] == int(train[-1]["train_step"])
    assert history[-1]["loss"] == pytest.approx(float(train[-1]["loss"]))
    assert history[-1]["env_steps"] == int(train[-1]["env_steps"]) and "eval/average_return" in history[0]
    assert offline["summary"]["outcome/iterations"] == ITERATIONS
    (artifact,) = offline["artifacts"]
    names = {entry.path for entry in artifact.manifest.contents}
    assert {"report.html", "videos/trained-agent.mp4", "plots/returns.png", "policy/final/saved_model.pb"} <= names


def test_a_missing_extra_is_one_warning(tracked, monkeypatch):
    """As when the extra is not installed (the import fails): one warning, nothing sent, nothing raised."""
    _, run_dir, _, _ = tracked
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    config = apply_override(load_config(os.path.join(run_dir, "config.yaml")), "tracking.backend=wandb")
    warnings = []
    assert send_run(config, run_dir, warnings.append) is None
    assert len(warnings) == 1 and "it is the wandb extra" in warnings[0]


def test_a_full_disk_in_the_store_is_one_warning(tracked, tmp_path):
    """The MLflow store's artifacts (mlartifacts, beside its database) on a 256 KB tmpfs (a private mount namespace):
    the videos do not fit."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare")
    _, run_dir, _, _ = tracked
    copy = str(tmp_path / "run")
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("tracking.json"))
    mount = tmp_path / "store" / "mlartifacts"
    mount.mkdir(parents=True)
    code = ("from dqn_cartpole.config import apply_override, load_config; from dqn_cartpole.tracking.send import "
            f"send_run; config = load_config({copy + '/config.yaml'!r}); "
            f"print(send_run(apply_override(config, 'tracking.backend=mlflow'), {copy!r}))")
    env = tracking_env(str(tmp_path), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/store/mlflow.db")
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=256k tmpfs {mount} && exec "
                                                          f"{sys.executable} -c \"{code}\""],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if "mount" in proc.stderr and proc.returncode != 0 and "warning" not in proc.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    warnings = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr[-2000:]
    assert len(warnings) == 1 and warnings[0].startswith("warning: --track mlflow: the run was not sent"), warnings
    assert "No space left on device" in warnings[0]


def test_a_store_that_fails_while_the_run_goes_is_one_line_and_its_end_tries_again(tmp_path):
    """The store (SQLite on a 3 MB tmpfs, in a private mount namespace) fills up once the run is open: the run is
    held (SIGSTOP) at its first evaluation, the follower opens the MLflow run, the disk is filled, the run goes on.
    One line says the metrics stopped streaming, the run ends with exit status 0, and its end's send, tried again,
    fails in one more line."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare")
    store, run_dir = tmp_path / "store", tmp_path / "run"
    store.mkdir()
    command = " ".join(cli_command("train", "--config", SMOKE, "-n", "2000", "--track", "mlflow", "--quiet",
                                   "--output-dir", str(run_dir), "--set", "video.enabled=false"))
    script = f"""set -e
mount -t tmpfs -o size=3m tmpfs {store}
{command} &
pid=$!
n=0; while [ ! -f {run_dir}/eval_metrics.csv ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done
kill -STOP $pid
n=0; while [ ! -f {run_dir}/tracking.json ] && [ $n -lt 3000 ]; do sleep 0.1; n=$((n+1)); done
dd if=/dev/zero of={store}/filler bs=64k 2>/dev/null || true
kill -CONT $pid
wait $pid
"""
    env = tracking_env(str(tmp_path), MLFLOW_TRACKING_URI=f"sqlite:///{store}/mlflow.db")
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", script], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=600)
    if "mount" in proc.stderr and proc.returncode != 0 and "warning" not in proc.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ledger(str(run_dir), "mlflow")["run_id"]  # the run was open when the disk filled
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert warnings[0].startswith(f"warning: --track mlflow: could not stream the metrics at sqlite:///{store}/"
                                  f"mlflow.db (MlflowException: (sqlite3.OperationalError) database or disk is "
                                  f"full); the run goes on"), warnings
    assert warnings[1].startswith("warning: --track mlflow: the run was not sent (MlflowException: "
                                  "(sqlite3.OperationalError) database or disk is full)"), warnings
    with open(run_dir / "summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["exit_status"] == 0 and summary["iterations"] == 2000


def test_an_unreachable_server_is_a_warning_while_it_runs_one_at_its_end_and_a_normal_solved_run(tmp_path):
    """MLFLOW_TRACKING_URI names a closed local port: the run solves (a target its first evaluation reaches), ends
    with exit status 0 and its files, and says one warning line while it runs (nothing streamed) and one when its
    end's send, tried again, fails too."""
    port = free_port()  # nothing listens there
    run_dir = str(tmp_path / "run")
    proc = run_cli("train", "--config", SMOKE, "--track", "mlflow", "-n", "100", "--output-dir", run_dir, "--quiet",
                   "--set", "evaluation.stop_when_solved=true", "--set", "evaluation.solve_return=5",
                   "--set", "evaluation.solve_episodes=3", "--set", "video.enabled=false", cwd=str(tmp_path),
                   env=tracking_env(str(tmp_path), MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 2, proc.stderr
    assert warnings[0].startswith(f"warning: --track mlflow: could not open the run at http://127.0.0.1:{port} ("), \
        warnings
    assert warnings[0].endswith("); the run goes on, and is sent to MLflow once it ends")
    assert warnings[1].startswith("warning: --track mlflow: the run was not sent"), warnings
    assert f"127.0.0.1:{port}" in warnings[1] and "Traceback" not in proc.stderr
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["solved_at_iteration"] is not None and summary["exit_status"] == 0
    assert os.path.isdir(os.path.join(run_dir, "policy", "final")) and not os.path.exists(
        os.path.join(run_dir, "tracking.json"))


def test_a_sweep_of_two_seeds_shares_a_group(tmp_path):
    from mlflow import MlflowClient

    proc = run_cli("sweep", "--config", SMOKE, "--seeds", "0,1", "--track", "mlflow", "-n", "20", "--name", "pair",
                   "--jobs", "2", "--quiet", "--set", "video.enabled=false", cwd=str(tmp_path),
                   env=tracking_env(str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=store_uri(str(tmp_path)))
    experiment = client.get_experiment_by_name("dqn_cartpole")
    runs = client.search_runs([experiment.experiment_id], "tags.group = 'pair'")
    assert sorted(run.data.tags["seed"] for run in runs) == ["0", "1"]
    sweep = tmp_path / "outputs" / "sweeps" / "pair"
    assert sorted(run.info.run_name for run in runs) == sorted(
        name for name in os.listdir(sweep) if (sweep / name / "config.yaml").is_file())
    assert all(run.info.status == "FINISHED" for run in runs)


def start_one_run(uri: str, barrier, index: int) -> None:
    """A child's part of the next test: wait for the others, then open the store and start a run as a sweep's job
    does (the first one to open a new SQLite store creates its tables)."""
    from dqn_cartpole.tracking import mlflow_run

    barrier.wait(timeout=60)
    client = mlflow_run.connect(uri)
    look_up = client.get_experiment_by_name

    def slow_look_up(name):  # a loaded machine's pause between looking and making, made certain
        found = look_up(name)
        time.sleep(0.5)
        return found

    client.get_experiment_by_name = slow_look_up
    mlflow_run.start_run(client, "dqn_cartpole", f"run-{index}", {}, uri, mlflow_run.artifact_location(uri))


def test_runs_that_start_at_once_share_one_new_store_and_one_experiment(tmp_path):
    """Jobs of a sweep start their runs at the same moment in a SQLite store that does not exist yet: its tables are
    made once, and one experiment of the project's name holds all of them."""
    import multiprocessing

    from mlflow import MlflowClient

    context = multiprocessing.get_context("spawn")
    jobs = 3
    uri = store_uri(str(tmp_path))
    barrier = context.Barrier(jobs)
    children = [context.Process(target=start_one_run, args=(uri, barrier, index)) for index in range(jobs)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
        if child.exitcode is None:
            child.kill()
    assert [child.exitcode for child in children] == [0] * jobs
    client = MlflowClient(tracking_uri=uri)
    named = [e for e in client.search_experiments() if e.name == "dqn_cartpole"]
    assert len(named) == 1, f"{len(named)} experiments named dqn_cartpole"
    assert len(client.search_runs([named[0].experiment_id])) == jobs
    assert named[0].artifact_location == os.path.join(str(tmp_path), "outputs", "mlartifacts")


def without(tmp_path, module: str) -> dict:
    """A CLI's environment in which `module` is not installed, as far as Python can tell (a sitecustomize on the
    path marks it missing: `import` raises ImportError and `find_spec` finds nothing)."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    return tracking_env(str(tmp_path), PYTHONPATH=f"{shim}{os.pathsep}{REPO}")


def test_a_tracker_that_is_not_installed_is_refused_before_anything_trains(tmp_path):
    """train (one process and --topology local), sweep, tune and the Python API's track=: one line naming the
    extra, exit status 2, no folder made."""
    hint = "is not installed: it is the {0} extra, which make install puts in .venv with every other extra (docs/install.md)"
    run_dir = str(tmp_path / "outputs" / "run")
    for module, args, line in (
            ("mlflow", ("train", "--config", SMOKE, "--track", "mlflow", "--output-dir", run_dir),
             "error: --track mlflow: mlflow " + hint.format("mlflow")),
            ("wandb", ("train", "--config", SMOKE, "--set", "tracking.backend=wandb", "--topology", "local"),
             "error: --track wandb: wandb " + hint.format("wandb")),
            ("mlflow", ("sweep", "--config", SMOKE, "--seeds", "0,1", "--track", "mlflow", "--name", "pair"),
             "error: --track mlflow: mlflow " + hint.format("mlflow")),
            ("wandb", ("tune", "--config", SMOKE, "--space", os.path.join(CONFIGS, "tune", "default-space.yaml"),
                       "--trials", "2", "--track", "wandb"), "error: --track wandb: wandb " + hint.format("wandb"))):
        proc = run_cli(*args, cwd=str(tmp_path), env=without(tmp_path, module))
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), proc.stderr[-3000:]
        assert not os.path.exists(tmp_path / "outputs"), os.listdir(tmp_path / "outputs")
    code = ("import dqn_cartpole as dq\ntry:\n    dq.train('smoke', 'run', track='mlflow')\nexcept dq.UserError as exc:\n"
            "    print(exc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=without(tmp_path, "mlflow"),
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "track='mlflow': mlflow " + hint.format("mlflow"), proc.stderr[-3000:]
    assert not os.path.exists(tmp_path / "run")


def test_a_ray_run_is_tracked_to_mlflow_from_the_same_environment(tmp_path):
    """`train --topology ray --track mlflow` on a private Ray instance: Ray and MLflow in one environment, the run
    and its metrics in the store, nothing left running."""
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay short
    run_dir = str(tmp_path / "outputs" / "ray-run")
    try:
        proc = run_cli("train", "--topology", "ray", "--address", "local", "--collectors", "1", "--config", SMOKE,
                       "-n", "100", "--track", "mlflow", "--output-dir", run_dir, "--quiet",
                       "--set", "video.enabled=false", cwd=str(tmp_path),
                       env=tracking_env(str(tmp_path), RAY_TMPDIR=ray_tmp), timeout=600)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    uri = store_uri(str(tmp_path))
    assert f"Tracking to MLflow: experiment dqn_cartpole at {uri}" in proc.stdout and "warning" not in proc.stderr
    client, run = mlflow_run(run_dir)
    assert run.info.status == "FINISHED" and run.data.params["training.num_iterations"] == "100"
    train = rows(os.path.join(run_dir, "train_metrics.csv"))
    assert [step for step, _ in steps(client, run.info.run_id, "loss")] == [int(r["train_step"]) for r in train]
    assert "outcome/iterations" in run.data.metrics
    assert not processes_of(run_dir)


def test_a_sweep_and_a_study_group_only_tracked_runs():
    assert group_overrides({"backend": None}, "pair") == []
    assert group_overrides({"backend": "mlflow", "tags": []}, "pair") == ['tracking.group="pair"']
    assert group_overrides({"backend": "wandb", "group": "mine", "tags": ["a"]}, "study",
                           trial_tags(3, ["agent.learning_rate=0.001"])) == [
        'tracking.tags=["a", "trial=0003", "sampled.agent.learning_rate=0.001"]']


def test_nothing_is_imported_without_track(tmp_path):
    """A run without --track never imports MLflow or W&B (nor sends anything)."""
    code = ("import sys, dqn_cartpole as dq; dq.train('smoke', 'run', overrides={'training.num_iterations': 10, "
            "'video.enabled': False}, progress=False); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'wandb')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=tracking_env(str(tmp_path)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert not os.path.exists(tmp_path / "run" / "tracking.json") and not os.path.exists(tmp_path / "outputs")


def test_a_resumed_run_continues_its_tracked_run(tracked):
    """Last (it trains the shared run on): the same MLflow run, only the new rows added."""
    root, run_dir, _, _ = tracked
    first = ledger(run_dir, "mlflow")["run_id"]
    proc = run_cli("train", "--resume", run_dir, "-n", str(ITERATIONS + 100), "--quiet", cwd=root,
                   env=tracking_env(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning" not in proc.stderr
    client, run = mlflow_run(run_dir)
    assert run.info.run_id == first and run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    train = rows(os.path.join(run_dir, "train_metrics.csv"))
    loss_steps = [step for step, _ in steps(client, first, "loss")]
    assert loss_steps == [int(r["train_step"]) for r in train] and loss_steps[-1] == ITERATIONS + 100
    assert run.data.tags["resumed.training.num_iterations"] == str(ITERATIONS + 100)
    assert run.data.params["training.num_iterations"] == str(ITERATIONS)


def test_the_python_api_takes_track_as_the_cli_does():
    """`track=` as `--track`: on a config's name, on a loaded Config (checked), and refused with the CLI's line."""
    from dqn_cartpole.api.configs import as_config

    assert dq.load_config("smoke", track="wandb").tracking.backend == "wandb"
    assert as_config(dq.load_config("smoke"), track="mlflow").tracking.backend == "mlflow"
    assert as_config("smoke", {"tracking.project": "p"}, track="mlflow").tracking.project == "p"
    with pytest.raises(dq.UserError, match=r"track='mlfow': tracking.backend: must be one of mlflow, wandb"):
        as_config(dq.load_config("smoke"), track="mlfow")
    with pytest.raises(dq.UserError, match="tracking.project: is set, but the run is not tracked"):
        dq.load_config("smoke", {"tracking.project": "p"})
