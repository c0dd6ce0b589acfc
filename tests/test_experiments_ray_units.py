"""The parts of `sweep --ray` and `tune --ray` that need no cluster, in process: a run folder's way back (packed,
unpacked, its paths moved, swapped in whole), the study's pruning from reported evaluations, the progress lines
away from a terminal, and the head's token authentication, against a stand-in head answering as Ray's does.
"""

from __future__ import annotations

import io
import json
import os
from concurrent import futures

import pytest

from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import ray_transfer


def make_run(folder, written_at: str) -> None:
    """A small run folder whose summary.json names its files under `written_at`, as a worker's does."""
    os.makedirs(os.path.join(folder, "policy", "best"))
    os.makedirs(os.path.join(folder, "videos"))
    open(os.path.join(folder, "config.yaml"), "w").write("training: {seed: 3}\n")
    open(os.path.join(folder, "videos", "trained-agent.mp4"), "wb").write(os.urandom(50_000))
    open(os.path.join(folder, "policy", "best", "saved_model.pb"), "wb").write(b"\x00model")
    summary = {"run_dir": written_at, "env_steps": 123, "artifacts": {"video": f"{written_at}/videos/trained-agent.mp4",
                                                                      "elsewhere": "/data/other"},
               "phases": {"start-up and imports": 3.5}, "resumed_from": [f"{written_at}/checkpoints/ckpt-1"]}
    json.dump(summary, open(os.path.join(folder, "summary.json"), "w"))


def files(folder) -> dict:
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if name != "summary.json":
                found[os.path.relpath(path, folder)] = open(path, "rb").read()
    return found


def test_a_run_folder_comes_back_whole_with_its_paths_moved_to_the_driver(tmp_path):
    worker = tmp_path / "worker" / "lr=1e-3__s3"
    make_run(str(worker), str(worker))
    data = ray_transfer.pack(str(worker))
    sweep = tmp_path / "sweep"
    target = sweep / "lr=1e-3__s3"
    ray_transfer.install(data, str(target), str(worker))
    assert files(target) == files(worker)
    summary = json.load(open(target / "summary.json"))
    assert summary["run_dir"] == str(target) and summary["env_steps"] == 123
    assert summary["artifacts"] == {"video": f"{target}/videos/trained-agent.mp4", "elsewhere": "/data/other"}
    assert summary["resumed_from"] == [f"{target}/checkpoints/ckpt-1"]
    assert sorted(os.listdir(sweep)) == ["lr=1e-3__s3"]  # no staging left behind

    # A resumed run comes back over its stopped folder: the new one replaces it whole (no stale files kept).
    (worker / "videos" / "trained-agent.mp4").unlink()
    (worker / "report.html").write_text("<html></html>")
    ray_transfer.install(ray_transfer.pack(str(worker)), str(target), str(worker))
    assert files(target) == files(worker)


def test_an_interrupted_swap_is_put_back_and_half_received_folders_are_dropped(tmp_path):
    stage = tmp_path / ray_transfer.STAGING_DIR
    (stage / "run-a.old").mkdir(parents=True)  # set aside, its replacement not yet in place
    (stage / "run-a.old" / "config.yaml").write_text("x: 1\n")
    (stage / "run-b").mkdir()  # half unpacked
    (stage / "run-b" / "config.yaml").write_text("x: 2\n")
    ray_transfer.clear_staging(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["run-a"]
    assert (tmp_path / "run-a" / "config.yaml").read_text() == "x: 1\n"


def test_a_tar_cannot_write_outside_its_folder(tmp_path):
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(tarfile.OutsideDestinationError):
        ray_transfer.unpack(buffer.getvalue(), str(tmp_path / "run"))
    assert not (tmp_path / "escaped.txt").exists()


def test_a_folder_too_large_to_send_is_refused_with_one_line(tmp_path, monkeypatch):
    make_run(str(tmp_path / "run"), "/w")
    monkeypatch.setattr(ray_transfer, "MAX_FOLDER_BYTES", 10_000)
    with pytest.raises(ray_transfer.FolderTooLarge, match="more than the 0 MB a run may send back"):
        ray_transfer.pack(str(tmp_path / "run"))


# ---------------------------------------------------------------------------- pruning on the driver


def study_on_ray(tmp_path):
    """A study as `tune` makes it (make_study's sampler and pruner), in memory, with a TrialRuns factory."""
    import optuna

    from dqn_cartpole.experiments import space, tune

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space_file = tmp_path / "space.yaml"
    space_file.write_text("agent.learning_rate: {low: 1e-4, high: 1e-2, log: true}\n")
    plan = tune.TunePlan("t", str(tmp_path), "/c/smoke.yaml", str(space_file),
                         tuple(space.load_space(str(space_file))), trials=8, jobs=None,
                         storage_url=str(tmp_path / "journal.log"), overrides=("video.enabled=false",),
                         sampler_seed=0, warmup_env_steps=1000)
    study = tune.make_study(plan, optuna.storages.InMemoryStorage())
    return study, lambda: tune.TrialRuns(plan, study.ask(), "host:1:2")


def test_evaluations_reported_from_a_worker_prune_a_trial_below_the_median(tmp_path):
    from optuna.trial import TrialState

    study, new_trial = study_on_ray(tmp_path)
    good = new_trial()
    job = good.request()
    assert job.key == "0000" and job.report_evaluations and job.run_dir == os.path.join(str(tmp_path), "trials", "0000")
    assert job.overrides[0] == "video.enabled=false" and job.overrides[1].startswith("agent.learning_rate=")
    assert good.evaluations([(500, 50.0), (1500, 200.0), (2500, 400.0)]) is None
    study.tell(good.trial, 2500.0)
    bad = new_trial()
    assert bad.evaluations([(500, 9.0)]) is None  # before the warm-up (the first third of the budget)
    reason = bad.evaluations([(500, 9.0), (1500, 10.0)])  # a retried run repeats the steps it had reported
    assert reason == "pruned by the median rule at env step 1500 (average return 10)"
    assert bad.evaluations([(2500, 500.0)]) is None  # once pruned, the run is being stopped: nothing more is reported
    running = study.get_trials(states=(TrialState.RUNNING,))
    assert [t.intermediate_values for t in running] == [{500: -9.0, 1500: -10.0}]


# ---------------------------------------------------------------------------- progress away from a terminal


def test_progress_away_from_a_terminal_is_plain_lines_without_carriage_returns():
    from dqn_cartpole.experiments.sweep_progress import SweepProgress

    stream = io.StringIO()
    progress = SweepProgress("sweep s", 8, "runs", stream=stream, plain_every_s=3600)
    progress.update(0, "0 running")
    progress.event("[0/8] a: started on 10.0.0.2")
    progress.update(1, "1 running")  # within plain_every_s: no line
    progress.update(2, "0 running, 0 failed")
    progress.close()  # the last state, once
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[0].startswith("sweep s: 0/8 runs [") and lines[1] == "[0/8] a: started on 10.0.0.2"
    assert lines[2].startswith("sweep s: 2/8 runs [") and lines[2].endswith("0 running, 0 failed")
    assert len(lines) == 3
    quiet = io.StringIO()
    progress = SweepProgress("sweep s", 8, "runs", enabled=False, stream=quiet)
    progress.event("started", always=False)
    progress.event("x: failed (exit 1)", always=True)
    progress.update(3, "note")
    progress.close()
    assert quiet.getvalue() == "x: failed (exit 1)\n"


# ---------------------------------------------------------------------------- the head's token authentication


@pytest.fixture
def token_head():
    """A gRPC server answering the GCS call `check_answers` makes as a Ray head under token auth does."""
    import grpc

    token = "0123456789abcdef"

    def cluster_id(request, context):
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: Authentication token is missing")
        return b"\n\x00"

    handler = grpc.method_handlers_generic_handler("ray.rpc.NodeInfoGcsService", {
        "GetClusterId": grpc.unary_unary_rpc_method_handler(cluster_id)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", token
    finally:
        server.stop(0)


def test_a_head_under_token_auth_says_what_this_machine_lacks_in_one_line(token_head, tmp_path, monkeypatch):
    from dqn_cartpole.processes.ray_cluster import check_answers

    address, token = token_head
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    with pytest.raises(UserError, match="uses token authentication: set RAY_AUTH_MODE=token, with the head's token"):
        check_answers(address, 5, "--address")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(UserError, match=r"this machine has no token \(.*/\.ray/auth_token\)"):
        check_answers(address, 5, "--address")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "not-the-token")
    with pytest.raises(UserError, match="refuses this machine's token \\(from RAY_AUTH_TOKEN\\)"):
        check_answers(address, 5, "--address")
    (tmp_path / "token").write_text(token + "\n")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    check_answers(address, 5, "--address")  # the head's token: it answers


def test_a_silent_address_is_given_up_on_this_process_clock_when_grpcs_deadline_comes_late(monkeypatch):
    """The probe's wait is bounded by this process's clock (PROBE_BACKSTOP_S past the connect timeout), not by
    gRPC's deadline alone: here gRPC is asked for a 60 s deadline, as if its timers ran late, and the answer is still
    "timed out" within the timeout and the backstop."""
    import socket
    import time

    import grpc

    from dqn_cartpole.processes import ray_cluster

    real_channel = grpc.insecure_channel

    class LateDeadlines:
        def __init__(self, target):
            self.channel = real_channel(target)

        def unary_unary(self, method):
            call = self.channel.unary_unary(method)

            class Late:
                @staticmethod
                def future(request, timeout, metadata=None):
                    return call.future(request, timeout=60, metadata=metadata)
            return Late()

        def close(self):
            self.channel.close()

    monkeypatch.setattr(grpc, "insecure_channel", LateDeadlines)
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        began = time.monotonic()
        with pytest.raises(UserError, match=r"no Ray cluster answers there within 1 s \(timed out\)"):
            ray_cluster.check_answers(f"127.0.0.1:{silent.getsockname()[1]}", 1, "--address")
        took = time.monotonic() - began
    assert 1 + ray_cluster.PROBE_BACKSTOP_S - 0.1 < took < 1 + ray_cluster.PROBE_BACKSTOP_S + 1.5, took


def test_the_python_apis_sweep_with_ray_is_sweep_ray(smoke_run, tmp_path, monkeypatch, capsys):
    """`dq.sweep(..., ray=True)` takes `sweep --ray`'s path, with its checks: a sweep whose members are done (copies
    of a finished run) is summed up without starting Ray, as the command's."""
    import shutil

    import dqn_cartpole as dq
    from dqn_cartpole.config import locate_config
    from dqn_cartpole.experiments.sweep import plan_sweep, write_manifest

    monkeypatch.chdir(tmp_path)  # smoke.yaml's output.root, outputs/, is relative
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(dq.UserError, match=r"sweep\(address=...\): only with ray=True"):
        dq.sweep("smoke", address="127.0.0.1:6379")
    with pytest.raises(dq.UserError, match="the Ray client"):
        dq.sweep("smoke", ray=True, address="ray://127.0.0.1:10001")
    plan = plan_sweep(locate_config("smoke"), "0,1", [], [], None, "done")
    os.makedirs(plan.folder)
    write_manifest(plan)
    for member in plan.members:
        shutil.copytree(smoke_run[0], member.run_dir)
    runs = dq.sweep("smoke", seeds=[0, 1], name="done", progress=False, ray=True)
    assert runs == [dq.Run(member.run_dir) for member in plan.members]
    out = capsys.readouterr().out
    assert "sweep done: 2 runs (2 already done, 0 finished now, 0 failed)" in out
    assert "(nothing left for Ray to run)" in out, out
