"""`sweep --ray` and `tune --ray` end to end, as a user runs them, on a Ray cluster of four nodes on this machine: a
head that takes no runs and three worker nodes of one CPU each (`ray.cluster_utils.Cluster`, started once for the
module). A sweep's three runs land on the three nodes; one node is removed while its run trains, that run is trained
again on another node and the sweep completes; the folder holds every run as a local sweep would (`compare` reads
it, a local `sweep` of the same command finds it done). Then a 5-trial study on the two nodes left is stopped with
Ctrl-C while its runs train, and the same command completes it. Nothing of the cluster is left after the module:
its processes and its temporary folders go with it. (A local sweep stopped by Ctrl-C and continued with `--ray` on
a local Ray instance, its runs resumed on Ray's workers, is tests/test_sweep.py's.)
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import shutil
import signal
import tempfile

import psutil
import pytest

from helpers import SMOKE, cli_env, run_cli, start_cli, wait_for

from dqn_cartpole.run_folder import read_run

ray = pytest.importorskip("ray")

WORKER_NODES = 3
STORE_BYTES = 100 * 2**20
SPACE = "agent.learning_rate: {low: 5e-4, high: 5e-3, log: true}\ntraining.batch_size: {choices: [16, 32]}\n"


def ray_descendants() -> list:
    """This process's descendants that belong to Ray (the cluster's daemons and workers)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            words = " ".join(child.cmdline()) + " " + child.name()
            if child.status() != psutil.STATUS_ZOMBIE and ("ray" in words or "gcs_server" in words):
                found.append(child)
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray.cluster_utils import Cluster

    tmp_path_factory.getbasetemp()  # pytest's own temp root, made now under the real TMPDIR: not in `temp`, which
    # goes with the module (when this module ran first, every later test's tmp_path pointed into a removed folder)
    temp = tempfile.mkdtemp(prefix="dqnray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    saved = {name: os.environ.get(name) for name in ("RAY_TMPDIR", "TMPDIR")}
    # Ray's files (and the ray_current_cluster that a plain ray.init() elsewhere on this machine would join) and the
    # runs' temporary folders on the nodes, all in `temp`.
    os.environ.update(RAY_TMPDIR=temp, TMPDIR=temp)
    tempfile.tempdir = None
    before = {p.pid for p in ray_descendants()}
    # The head checks its nodes every second (Ray's default: 3 s), so a lost node is declared dead sooner.
    head = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE_BYTES,
                                                         "_system_config": {"health_check_period_ms": 1000}})
    try:
        for _ in range(WORKER_NODES):
            head.add_node(num_cpus=1, object_store_memory=STORE_BYTES)
        yield head, temp
    finally:
        head.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tempfile.tempdir = None
        wait_for(lambda: not [p for p in ray_descendants() if p.pid not in before], 60,
                 "the cluster's processes to exit")
        shutil.rmtree(temp, ignore_errors=True)


def training_runs(temp: str) -> dict:
    """Run folder name -> rows of train metrics, of the runs training on the nodes now (in their temp folders)."""
    found = {}
    for path in glob.glob(os.path.join(temp, "dqn_cartpole-ray", "*", "*", "train_metrics.csv")):
        with contextlib.suppress(OSError):
            found[os.path.basename(os.path.dirname(path))] = len(open(path).read().splitlines()) - 1
    return found


def node_of(head, text: str, member: str):
    """The worker node (a ray Node) on which the driver's output says `member` started."""
    match = re.search(rf"{re.escape(member)}: started on .*?node ([0-9a-f]{{8}})\)", text)
    assert match, text[-3000:]
    (node,) = [n for n in head.worker_nodes if n.node_id.startswith(match.group(1))]
    return node


def read(log_dir, name: str) -> str:
    return (log_dir / name).read_text()


def test_a_sweep_spreads_over_the_nodes_survives_a_lost_one_and_lands_in_one_folder(cluster, tmp_path):
    head, temp = cluster
    logs = tmp_path / "driver"
    logs.mkdir()
    args = ["sweep", "--config", SMOKE, "--seeds", "0-2", "--name", "r", "--set", f"output.root={tmp_path}",
            "--set", "training.num_iterations=2000"]
    driver = start_cli(*args, "--ray", "--address", head.address, log_dir=logs, env=cli_env())
    try:
        wait_for(lambda: read(logs, "stderr").count(": started on ") == 3 or driver.poll() is not None, 240,
                 "the three runs to start")
        victim = re.search(r"\] (base__s\d): started on ", read(logs, "stderr")).group(1)
        wait_for(lambda: training_runs(temp).get(victim, 0) > 0 or driver.poll() is not None, 240,
                 f"{victim} to train")
        assert driver.poll() is None, read(logs, "stderr")[-3000:]
        lost = node_of(head, read(logs, "stderr"), victim)
        head.remove_node(lost, allow_graceful=False)  # its run, mid-training, goes with it
        driver.wait(timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    out, err = read(logs, "stdout"), read(logs, "stderr")
    assert driver.returncode == 0, out[-2000:] + err[-3000:]
    assert "3 runs (0 already done, 3 finished now, 0 failed)" in out and "1 retried" in out
    assert re.search(rf"{victim}: lost with .*node {lost.node_id[:8]}\) \(.*\); running it again on another node",
                     err), err
    assert "\r" not in err  # not a terminal: plain lines
    assert not re.search(r"node [0-9a-f]{8}\): [2-9]", err), err  # one run per CPU: never two on a node
    assert "Raylet is terminated" not in out and "[state-dump]" not in out + err  # Ray's account, in one line

    folder = tmp_path / "sweeps" / "r"
    landed_on = {}
    for seed in range(3):
        name = f"base__s{seed}"
        log = (folder / "logs" / f"{name}.log").read_text()
        attempts = re.findall(r"^# attempt (\d) on .*node ([0-9a-f]{8})\)$", log, re.M)
        assert attempts and attempts[-1][1] != lost.node_id[:8], log
        landed_on[name] = attempts[-1][1]
        run = read_run(str(folder / name))
        assert run.get("exit_status") == 0 and run.get("iterations") == 2000 and run.eval_rows
        assert run.config["training"]["seed"] == seed and run.get("run_dir") == str(folder / name)
        artifacts = run.get("artifacts")
        assert all(str(path).startswith(str(folder / name)) and os.path.exists(path) for path in artifacts.values())
        for part in ("videos/trained-agent.mp4", "videos/random-agent.mp4", "policy/best/saved_model.pb",
                     "policy/final/saved_model.pb", "plots/returns.png", "report.html", "train_metrics.csv"):
            assert (folder / name / part).is_file(), part
    assert re.search(r"^# lost with .*node ([0-9a-f]{8})\)", (folder / "logs" / f"{victim}.log").read_text(), re.M)
    assert len(set(landed_on.values())) == 2, landed_on  # the two nodes left both sent runs back

    from dqn_cartpole.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()) as table:
        assert main(["compare", str(folder), "--output", str(tmp_path / "cmp")]) == 0
    assert re.search(r"^ +all runs\nruns +3$", table.getvalue(), re.M), table.getvalue()
    again = run_cli(*args, "--quiet", timeout=120)  # the same sweep, locally: Ray's folder is a local sweep's
    assert again.returncode == 0 and "3 already done, 0 finished now" in again.stdout, again.stderr[-2000:]


def test_a_study_on_ray_keeps_its_journal_here_and_continues_after_ctrl_c(cluster, tmp_path):
    import optuna
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState

    head, temp = cluster
    (tmp_path / "space.yaml").write_text(SPACE)
    logs = tmp_path / "driver"
    logs.mkdir()
    args = ["tune", "--config", SMOKE, "--space", str(tmp_path / "space.yaml"), "--trials", "5", "--study", "t",
            "--seed", "0", "--ray", "--address", head.address, "--jobs", "2", "--set", f"output.root={tmp_path}",
            "--set", "video.enabled=false", "--set", "training.num_iterations=2000",
            "--set", "evaluation.stop_when_solved=true"]  # a study needs runs that can solve (smoke's never do)
    driver = start_cli(*args, log_dir=logs, env=cli_env())
    try:
        wait_for(lambda: sum(1 for rows in training_runs(temp).values() if rows > 0) == 2 or driver.poll() is not None,
                 240, "two trials to train")
        assert driver.poll() is None, read(logs, "stderr")[-3000:]
        driver.send_signal(signal.SIGINT)
        driver.wait(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    out = read(logs, "stdout")
    assert driver.returncode == 130, out[-2000:] + read(logs, "stderr")[-3000:]
    assert "Continue the study with the same command" in out and "--ray --address" in out
    folder = tmp_path / "tune" / "t"
    journal = optuna.storages.JournalStorage(JournalFileBackend(str(folder / "journal.log")))
    before = optuna.load_study(study_name="t", storage=journal).trials
    # Two trials trained when the Ctrl-C was sent. A trial can finish before that: trial 0 did in a fresh-clone CI,
    # while the other node's actor still started, and trials 1 and 2 were the two then training (so 5 trials: the
    # continued study always has one to run). A finished trial stays finished; every other one was stopped.
    stopped = [t for t in before if t.state == TrialState.FAIL]
    assert 2 <= len(before) <= 4 and len(stopped) >= 1, [t.state for t in before]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in before if t not in stopped), before
    for trial in stopped:  # each run got the Ctrl-C on its node, saved a checkpoint and came back
        assert trial.user_attrs["reason"] == "stopped by SIGINT; the run folder can be continued with train --resume"
        run = read_run(str(folder / "trials" / f"{trial.number:04d}"))
        assert run.get("exit_status") == 130 and 0 < run.get("iterations") < 2000
        assert os.listdir(folder / "trials" / f"{trial.number:04d}" / "checkpoints")
    wait_for(lambda: not training_runs(temp), 30, "the runs' temporary folders to go")

    resumed = run_cli(*args, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"{len(before)} trials so far, running up to {5 - len(before)} more on Ray" in resumed.stdout
    trials = optuna.load_study(study_name="t", storage=journal).trials
    assert len(trials) == 5 and [t.state for t in trials[:len(before)]] == [t.state for t in before]
    for trial in trials[len(before):]:
        assert trial.state in (TrialState.COMPLETE, TrialState.PRUNED), trial
        assert trial.intermediate_values  # its evaluations reached the driver from the node
        run = read_run(str(folder / "trials" / f"{trial.number:04d}"))
        assert run.config["agent"]["learning_rate"] == pytest.approx(trial.params["agent.learning_rate"])
        assert run.get("exit_status") in (0, 143)
        node = re.search(r"node ([0-9a-f]{8})\)$", trial.user_attrs["node"]).group(1)
        assert node in {n.node_id[:8] for n in head.worker_nodes}
    assert (folder / "trials.csv").is_file() and not glob.glob(str(folder / "**" / ".incoming"), recursive=True)
