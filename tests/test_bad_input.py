"""Every kind of malformed config and command line, run as a user would: a subprocess.

Each case must exit with status 2 and print exactly one line on stderr that names the problem,
with no traceback, and must leave no run folder behind (an existing run stays untouched). The
cases run a few at a time (each one is mostly Python start-up), so the whole table takes about
as long as a handful of them in a row.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from helpers import CONFIGS, REPO, cli_env, run_cli

SMOKE = os.path.join(CONFIGS, "smoke.yaml")
SPACE = os.path.join(CONFIGS, "tune", "default-space.yaml")


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple  # CLI arguments; "{dir}" is the case's own folder, "{cfg}" its config file
    needle: str  # must appear in the one error line
    config: str | None = None  # text of {cfg}
    setup: str = ""  # "run": {dir}/run is a run folder; "file": {dir}/file exists; "junk": {dir}/junk has files
    extra: dict = field(default_factory=dict)


def cfg(text: str, needle: str, id: str) -> Case:
    return Case(id, ("train", "--config", "{cfg}"), needle, config=text)


def override(item: str, needle: str, id: str) -> Case:
    return Case(id, ("train", "--config", SMOKE, "--set", item), needle)


CASES = [
    # -- the file itself
    cfg("", "the file is empty", "empty-file"),
    cfg("# only a comment\n", "the file is empty", "comment-only-file"),
    cfg("- env\n- agent\n", "expected a mapping of sections", "list-at-top"),
    cfg("42\n", "expected a mapping of sections", "scalar-at-top"),
    cfg("agent:\n  gamma: [0.9\n", "malformed YAML", "malformed-yaml"),
    cfg("!!python/object/apply:os.system ['touch {dir}/pwned']\n", "malformed YAML", "yaml-python-object-apply"),
    cfg("agent:\n  learning_rate: !!python/name:os.system\n", "malformed YAML", "yaml-python-name-tag"),
    cfg("env: !!python/object/new:collections.OrderedDict [[[id, CartPole-v1]]]\n", "malformed YAML",
        "yaml-python-object-new"),
    cfg("agnet:\n  gamma: 0.9\n", "unknown section 'agnet'", "unknown-section"),
    cfg("agent:\n  gama: 0.9\n", "unknown key 'agent.gama'", "unknown-key"),
    cfg("agent: 0.5\n", "agent: expected a mapping", "section-not-a-mapping"),
    # -- wrong types, one per section
    cfg("env:\n  id: [CartPole-v1]\n", "env.id: expected a string", "env-id-type"),
    cfg("network:\n  fc_layer_params: [64, wide]\n", "network.fc_layer_params: expected a list of integers",
        "network-type"),
    cfg("agent:\n  learning_rate: fast\n", "agent.learning_rate: expected a number", "agent-type"),
    cfg("replay:\n  capacity: lots\n", "replay.capacity: expected an integer", "replay-type"),
    cfg("training:\n  num_iterations: 1.5\n", "training.num_iterations: expected an integer", "training-type"),
    cfg("evaluation:\n  stop_when_solved: maybe\n", "evaluation.stop_when_solved: expected true or false",
        "evaluation-type"),
    cfg("video:\n  enabled: 1\n", "video.enabled: expected true or false", "video-type"),
    cfg("output:\n  tensorboard: yes please\n", "output.tensorboard: expected true or false", "output-type"),
    # -- out-of-range values, one per section
    cfg("env:\n  num_envs: 0\n", "env.num_envs: must be positive", "env-range"),
    cfg("network:\n  fc_layer_params: []\n", "network.fc_layer_params", "network-range"),
    cfg("agent:\n  gamma: 1.5\n", "agent.gamma: must be in [0, 1]", "agent-range"),
    cfg("replay:\n  reverb_port: 70000\n", "replay.reverb_port", "replay-range"),
    cfg("training:\n  keep_checkpoints: 0\n", "training.keep_checkpoints: must be positive", "training-range"),
    cfg("evaluation:\n  eval_interval: -5\n", "evaluation.eval_interval: must be positive", "evaluation-range"),
    cfg("video:\n  fps: 0\n", "video.fps: must be positive", "video-range"),
    cfg("video:\n  random_episodes: 0\n", "video.random_episodes: must be positive", "video-random-episodes-range"),
    cfg("output:\n  run_name: a/b\n", "output.run_name", "output-range"),
    cfg("env:\n  id: Pendulum-v1\n", "env.id", "env-id-unsupported"),
    # -- overrides and flags
    override("agent.gamma", "expected section.key=value", "set-without-value"),
    override("training.batch_size=big", "training.batch_size: expected an integer", "set-wrong-type"),
    override("replay.backend=redis", "replay.backend: must be one of", "set-bad-choice"),
    Case("unknown-flag", ("train", "--learning-rate", "1"), "unrecognized arguments"),
    # -- tracking (docs/tracking.md): an unknown tracker, or tracking keys without --track
    Case("track-unknown", ("train", "--config", SMOKE, "--track", "mlfow"), "did you mean 'mlflow'"),
    cfg("tracking:\n  project: cartpole\n", "tracking.project: is set, but the run is not tracked",
        "tracking-key-without-track"),
    override("tracking.tags=[team=rl]", "tracking.tags: is set, but the run is not tracked",
             "tracking-set-without-track"),
    Case("tracking-online-mlflow", ("train", "--config", SMOKE, "--track", "mlflow", "--set", "tracking.online=true"),
         "tracking.online: applies to --track wandb only"),
    Case("sweep-tracking-without-track", ("sweep", "--config", SMOKE, "--set", "tracking.group=g"),
         "tracking.group: is set, but the run is not tracked"),
    Case("tune-track-unknown", ("tune", "--config", SMOKE, "--space", SPACE, "--trials", "1", "--track", "neptune"),
         "--track: invalid choice"),
    Case("config-missing", ("train", "--config", "{dir}/nope.yaml"), "config file not found"),
    Case("config-is-a-folder", ("train", "--config", "{dir}"), "is a folder"),
    # -- the output folder
    Case("output-is-a-file", ("train", "--config", SMOKE, "--output-dir", "{dir}/file"), "is a file", setup="file"),
    Case("output-under-a-file", ("train", "--config", SMOKE, "--output-dir", "{dir}/file/run"), "is a file",
         setup="file"),
    Case("output-not-writable", ("train", "--config", SMOKE, "--output-dir", "/proc/dqn-cartpole-test-run"),
         "/proc/dqn-cartpole-test-run"),
    Case("existing-run-needs-overwrite", ("train", "--config", SMOKE, "--output-dir", "{dir}/run"), "--overwrite",
         setup="run"),
    Case("overwrite-refuses-non-run", ("train", "--config", SMOKE, "--output-dir", "{dir}/junk", "--overwrite"),
         "not a run folder", setup="junk"),
    # -- --resume
    Case("resume-missing", ("train", "--resume", "{dir}/nothing"), "no such folder"),
    Case("resume-a-file", ("train", "--resume", "{dir}/file"), "is a file", setup="file"),
    Case("resume-not-a-run", ("train", "--resume", "{dir}/junk"), "not a run folder", setup="junk"),
    Case("resume-changes-env", ("train", "--resume", "{dir}/run", "--set", "env.id=CartPole-v0"),
         "cannot change env.id", setup="run"),
    Case("resume-changes-network", ("train", "--resume", "{dir}/run", "--set", "network.fc_layer_params=[8]"),
         "cannot change network.fc_layer_params", setup="run"),
    cfg("agent:\n  n_step: 3\ntraining:\n  initial_collect_steps: 3\n", "training.initial_collect_steps: must be "
        "at least (agent.n_step + 1) x env.num_envs = 4", "initial-collect-below-one-window"),
    override("replay.sampling=sometimes", "replay.sampling: must be one of auto, dataset, direct", "sampling-choice"),
    Case("resume-with-config", ("train", "--resume", "{dir}/run", "--config", SMOKE), "cannot be combined",
         setup="run"),
    # -- report / plot of something that is not a run
    Case("report-missing", ("report", "{dir}/nothing"), "no such run folder"),
    Case("report-not-a-run", ("report", "{dir}/junk"), "not a run folder", setup="junk"),
    Case("plot-a-file", ("plot", "{dir}/file"), "no such run folder", setup="file"),
    Case("report-unreadable-config", ("report", "{dir}/run"), "cannot read", setup="bad-run"),
    Case("resume-bad-override", ("train", "--resume", "{dir}/run", "--set", "agent.gamma=2"), "agent.gamma",
         setup="run"),
    # -- found by trying the product as a new user would (issue 18)
    Case("report-non-numeric-csv", ("report", "{dir}/run"), "line 3, column average_return: 'abc' is not a number",
         setup="bad-csv"),
    Case("evaluate-policy-on-another-env", ("evaluate", "{dir}/policy", "--env", "Acrobot-v1"),
         "takes observations of shape (4,) and chooses among 2 actions, but Acrobot-v1 has", setup="policy"),
    Case("tune-storage-under-a-file", ("tune", "--config", SMOKE, "--space", SPACE, "--trials", "1", "--storage",
                                       "{dir}/file/journal.log"), "is a file, not a folder", setup="file"),
    Case("py-uniform-with-two-envs", ("train", "--config", SMOKE, "--set", "replay.backend=py_uniform", "--set",
                                      "env.num_envs=2", "--set", "training.collect_steps_per_iteration=2",
                                      "--output-dir", "{dir}/nested/run"), "py_uniform stores a single stream"),
    Case("local-resume-of-a-tf-uniform-run", ("train", "--topology", "local", "--resume", "{dir}/run"),
         "the run's replay is tf_uniform", setup="run"),
]


def _prepare(case: Case, folder: str, policy: str) -> list[str]:
    os.makedirs(folder)
    if case.config is not None:
        with open(os.path.join(folder, "c.yaml"), "w") as handle:
            handle.write(case.config.replace("{dir}", folder))
    if case.setup == "file":
        with open(os.path.join(folder, "file"), "w") as handle:
            handle.write("not a folder\n")
    elif case.setup == "junk":
        os.makedirs(os.path.join(folder, "junk"))
        with open(os.path.join(folder, "junk", "notes.txt"), "w") as handle:
            handle.write("precious\n")
    elif case.setup == "bad-run":
        os.makedirs(os.path.join(folder, "run"))
        with open(os.path.join(folder, "run", "config.yaml"), "w") as handle:
            handle.write("agent: [unclosed\n")
    elif case.setup in ("run", "bad-csv"):
        os.makedirs(os.path.join(folder, "run"))
        shutil.copyfile(SMOKE, os.path.join(folder, "run", "config.yaml"))  # a run folder, as --resume sees it
        if case.setup == "bad-csv":  # e.g. edited by hand
            with open(os.path.join(folder, "run", "eval_metrics.csv"), "w") as handle:
                handle.write("train_step,env_steps,average_return\n0,64,9.5\n100,164,abc\n")
    elif case.setup == "policy":  # the smoke run's CartPole policy
        shutil.copytree(policy, os.path.join(folder, "policy"))
    return [a.replace("{dir}", folder).replace("{cfg}", os.path.join(folder, "c.yaml")) for a in case.args]


def _snapshot(folder: str) -> list[tuple[str, float]]:
    found = []
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            found.append((os.path.relpath(path, folder), os.path.getmtime(path)))
    return sorted(found)


def _run(argv: list[str], cwd: str) -> subprocess.CompletedProcess:
    # TF_CPP_MIN_LOG_LEVEL=2 is a common export; it lets TensorFlow's C++ import print errors, so
    # every check must run before TensorFlow is imported.
    return run_cli(*argv, cwd=cwd, timeout=120, env=cli_env(TF_CPP_MIN_LOG_LEVEL="2"))


@pytest.fixture(scope="module")
def results(tmp_path_factory, smoke_run):
    """Runs every case (a few at a time); maps case id -> (folder, before, after, process)."""
    base = tmp_path_factory.mktemp("bad_input")
    policy = os.path.join(smoke_run[0], "policy", "best")
    prepared = {}
    for case in CASES:
        folder = str(base / case.id)
        prepared[case.id] = (folder, _prepare(case, folder, policy))
    before = {cid: _snapshot(folder) for cid, (folder, _) in prepared.items()}
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        futures = {cid: pool.submit(_run, argv, folder) for cid, (folder, argv) in prepared.items()}
        return {cid: (prepared[cid][0], before[cid], _snapshot(prepared[cid][0]), f.result())
                for cid, f in futures.items()}


def test_there_are_enough_cases():
    assert len(CASES) >= 25 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_with_one_line_and_no_run(case, results):
    folder, before, after, proc = results[case.id]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and case.needle in lines[0], lines[0]
    assert after == before, "the command created or changed files"  # no run folder, the old run untouched
    assert not os.path.exists("/proc/dqn-cartpole-test-run")
    assert proc.stdout == ""


def test_yaml_tags_never_run_code(results):
    folder, _, _, proc = results["yaml-python-object-apply"]
    assert proc.returncode == 2
    assert not os.path.exists(os.path.join(folder, "pwned"))


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_disk_full_is_one_clear_line_with_the_resume_command(tmp_path):
    """A 2 MB tmpfs (in a private mount namespace) fills up at the first checkpoint."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    run_dir = mount / "run"
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=2m tmpfs {mount}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    train = (f"{sys.executable} -m dqn_cartpole train --quiet --config {SMOKE} --set video.enabled=false "
             f"--set replay.capacity=100000 --output-dir {run_dir}")
    env = dict(os.environ, PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy")
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=2m tmpfs {mount} && exec {train}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert len(errors) == 1 and "disk full" in errors[0], proc.stderr
    assert f"train --resume {run_dir}" in errors[0]


@pytest.mark.parametrize("script, args, needle", [
    ("benchmark.py", ("--seeds", "5-x"), "--seeds 5-x"),
    ("benchmark.py", ("--scale-out", "1,x"), "--scale-out 1,x"),
    ("benchmark.py", ("--scale-out", "2", "--seeds", "3,3"), "listed twice"),
    ("benchmark.py", ("--scale-out", "2", "--priorities", "-1"), "--priorities -1: expected a number of rounds"),
    ("benchmark.py", ("--fixed-budget", "10", "--seeds", "9-0"), "is empty"),
])
def test_the_benchmark_scripts_refuse_bad_seeds_with_one_line(script, args, needle):
    """The scripts the docs quote take seeds as the CLI does (0-4, 0,3,7), and say what is wrong in one line."""
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", script), *args], capture_output=True,
                            text=True, timeout=60, env=cli_env())
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and needle in lines[0], result.stderr
    assert lines[0].startswith("error: ")
