"""Checkpoint and resume: SIGKILL at several points, a corrupt checkpoint, Ctrl-C, a NaN loss.

Every run here is configs/smoke.yaml for 400 iterations (checkpoints every 100, logs every 50,
evaluations every 100), without videos or TensorBoard. A run that is killed, interrupted or locked
is a subprocess, as a user runs it; `DQN_CARTPOLE_TEST_KILL=stage:n` makes the trainer SIGKILL itself
at an exact point (see `checkpointing.crash_point`); one test kills it from outside at whatever
point it has reached. Runs and resumes that are not about the process itself train in this process
through the Python API (`dqn_cartpole.train`: the same run a fresh process gives, tests/test_api.py),
which saves each one TensorFlow's import in a new process.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import NamedTuple

import numpy as np
import pytest

from helpers import (C51_SETS, CONFIGS, KILL_ENV, REPO, c51_atoms_by_hand, check_c51_run, cli_env, run_cli, run_python,
                     start_cli)

import dqn_cartpole as dq

SMOKE = os.path.join(CONFIGS, "smoke.yaml")
N = 400
TRAIN_STEPS = list(range(50, N + 1, 50))
EVAL_STEPS = list(range(0, N + 1, 100))


def train_args(run_dir: str, *sets: str, iterations: int = N) -> list[str]:
    extra = [a for s in sets for a in ("--set", s)]
    return ["train", "--quiet", "--config", SMOKE, "--output-dir", run_dir, "--set", "video.enabled=false",
            "--set", "output.tensorboard=false", "--set", f"training.num_iterations={iterations}", *extra]


def overrides(*sets: str, iterations: int = N) -> list[str]:
    """`train_args`' --set items, for the Python API."""
    return ["video.enabled=false", "output.tensorboard=false", f"training.num_iterations={iterations}", *sets]


def train_here(run_dir: str, *sets: str, iterations: int = N) -> dq.Run:
    """`train_args`' run, in this process."""
    return dq.train(SMOKE, run_dir, overrides=overrides(*sets, iterations=iterations), progress=False)


def resume_here(run_dir: str, *sets: str) -> dq.Run:
    """`train --quiet --resume RUN_DIR --set ...`, in this process."""
    return dq.train(resume=run_dir, overrides=list(sets), progress=False)


def cli(*args: str, kill: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=timeout, env=cli_env(**({KILL_ENV: kill} if kill else {})))


def start(*args: str, log_dir) -> subprocess.Popen:
    return start_cli(*args, log_dir=log_dir)


def wait_for_checkpoint(run_dir: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    folder = os.path.join(run_dir, "checkpoints")
    while time.time() < deadline and proc.poll() is None:
        if os.path.isdir(folder) and any(n.startswith("ckpt-") and "." not in n for n in os.listdir(folder)):
            return
        time.sleep(0.02)
    raise AssertionError("no checkpoint appeared")


def resume(run_dir: str, *sets: str) -> subprocess.CompletedProcess:
    extra = [a for s in sets for a in ("--set", s)]
    return cli("train", "--quiet", "--resume", run_dir, *extra)


def lock_files(run_dir: str) -> list[str]:
    return sorted(name for name in os.listdir(run_dir) if name in ("run.lock", "roles.lock"))


def rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def checkpoints(run_dir: str) -> list[str]:
    """The checkpoint folders, a temporary one's unique token (`ckpt-N.<pid>-<hex>.tmp`) left out."""
    return sorted(re.sub(r"\.\d+-[0-9a-f]{8}\.tmp$", ".tmp", name)
                  for name in os.listdir(os.path.join(run_dir, "checkpoints")))


def assert_complete(run_dir: str) -> None:
    """The run reached N train steps with continuous metrics, a final policy and a best one."""
    train = rows(os.path.join(run_dir, "train_metrics.csv"))
    assert [int(r["train_step"]) for r in train] == TRAIN_STEPS
    env_steps = [int(r["env_steps"]) for r in train]
    assert env_steps == sorted(set(env_steps))
    assert all(r["loss"] not in ("", "nan") for r in train)
    evals = rows(os.path.join(run_dir, "eval_metrics.csv"))
    assert [int(r["train_step"]) for r in evals] == EVAL_STEPS
    walls = [float(r["wall_s"]) for r in evals]
    assert walls == sorted(walls)
    for which in ("final", "best"):
        assert os.path.exists(os.path.join(run_dir, "policy", which, "saved_model.pb")), which
    with open(os.path.join(run_dir, "policy", "final", "policy_info.json")) as handle:
        assert json.load(handle)["train_step"] == N
    with open(os.path.join(run_dir, "summary.json")) as handle:
        assert json.load(handle)["train_steps"] == N
    for name in ("returns.png", "loss.png"):
        assert os.path.getsize(os.path.join(run_dir, "plots", name)) > 0
    newest = [n for n in checkpoints(run_dir) if n.startswith("ckpt-") and "." not in n][-1]
    with open(os.path.join(run_dir, "checkpoints", newest, "state.json")) as handle:
        state = json.load(handle)
    assert state["iteration"] == N and state["train_step"] == N and state["finished"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    """An uninterrupted run (in this process)."""
    run_dir = str(tmp_path_factory.mktemp("reference") / "run")
    assert train_here(run_dir).summary["exit_status"] == 0
    return run_dir


def test_uninterrupted_run_keeps_the_newest_checkpoints_and_the_best_policy(reference):
    assert_complete(reference)
    assert checkpoints(reference) == ["ckpt-0000000200", "ckpt-0000000300", "ckpt-0000000400"]  # keep 3
    evals = rows(os.path.join(reference, "eval_metrics.csv"))
    returns = [float(r["average_return"]) for r in evals]
    best_at = max(i for i, r in enumerate(returns) if r == max(returns))  # ties go to the later one
    with open(os.path.join(reference, "policy", "best", "policy_info.json")) as handle:
        info = json.load(handle)
    assert info["train_step"] == int(evals[best_at]["train_step"])
    assert f"{info['average_return']:.6g}" == evals[best_at]["average_return"]


def test_sigkill_during_a_checkpoint_write_then_resume_matches_the_uninterrupted_run(reference, tmp_path):
    run_dir = str(tmp_path / "run")
    killed = cli(*train_args(run_dir), kill="checkpoint-write:2")  # TF files written, no manifest, no rename
    assert killed.returncode == -signal.SIGKILL
    assert checkpoints(run_dir) == ["ckpt-0000000100", "ckpt-0000000200.tmp"]
    assert lock_files(run_dir) == ["roles.lock", "run.lock"]  # a killed run cannot remove them: the kernel freed them
    result = resume(run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert lock_files(run_dir) == []  # the resume ended in its own time: removed
    assert re.search(r"ckpt-0000000200\.\d+-[0-9a-f]{8}\.tmp is partial", result.stderr)
    assert "Resumed from ckpt-0000000100: iteration 100 of 400" in result.stderr
    assert_complete(run_dir)
    # Fixed seed, uniform backend: the same config and the same rows as a run never interrupted.
    with open(os.path.join(run_dir, "config.yaml")) as a, open(os.path.join(reference, "config.yaml")) as b:
        assert a.read() == b.read()
    for name in ("train_metrics.csv", "eval_metrics.csv"):
        mine, theirs = rows(os.path.join(run_dir, name)), rows(os.path.join(reference, name))
        assert [(r["train_step"], r["env_steps"]) for r in mine] == [(r["train_step"], r["env_steps"]) for r in theirs]
    # Up to the checkpoint it is the same seeded run, row for row (the rows after it are not dropped or doubled).
    same = ("train_step", "env_steps", "loss", "epsilon", "replay_size")
    kept = rows(os.path.join(run_dir, "train_metrics.csv"))[:2]
    assert [[r[k] for k in same] for r in kept] == [
        [r[k] for k in same] for r in rows(os.path.join(reference, "train_metrics.csv"))[:2]]


@pytest.fixture(scope="module")
def c51_killed(tmp_path_factory) -> dict:
    """A prioritized C51 run on py_uniform, SIGKILLed from outside once it has a checkpoint, then resumed in this
    process; the priorities (the sum-tree and the largest) of the checkpoint it resumed from, read before the
    resume."""
    tmp_path = tmp_path_factory.mktemp("c51")
    run_dir = str(tmp_path / "run")
    proc = start(*train_args(run_dir, "replay.backend=py_uniform", "replay.prioritized=true", *C51_SETS),
                 log_dir=tmp_path)
    try:
        wait_for_checkpoint(run_dir, proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    newest = [n for n in checkpoints(run_dir) if n.startswith("ckpt-") and "." not in n][-1]
    saved = py_priorities(run_dir, newest)
    shutil.copytree(run_dir, tmp_path / "copy")  # as killed: test_priorities_survive_a_sigkill_and_the_resume
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):  # the resume's Progress writes to sys.stderr
        resume_here(run_dir)
    return {"run_dir": run_dir, "status": proc.returncode, "stderr": (tmp_path / "stderr").read_text(),
            "resumed": printed.getvalue(), "killed_at": newest, "saved": saved, "copy": str(tmp_path / "copy")}


def py_priorities(run_dir: str, checkpoint: str, by_slot: bool = False) -> tuple:
    """(the sum-tree's leaves holding a window, the largest priority seen) in a py_uniform prioritized run's
    checkpoint (`replay.prioritized_py`: both in the buffer's NumpyState); `by_slot`: the leaves as {slot: leaf}."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(run_dir, "checkpoints", checkpoint, "tf", "ckpt"))

    def state(name: str) -> np.ndarray:
        return np.load(io.BytesIO(reader.get_tensor(f"replay/_np_state/{name}/.ATTRIBUTES/py_state")))

    tree = state("sum_tree")
    leaves = tree[len(tree) // 2:]
    if by_slot:
        return {int(slot): float(leaves[slot]) for slot in np.flatnonzero(leaves)}, float(state("max_priority"))
    return leaves[leaves > 0], float(state("max_priority"))


def test_external_sigkill_py_uniform_then_resume_c51(c51_killed):
    run_dir = c51_killed["run_dir"]
    assert c51_killed["status"] == -signal.SIGKILL, c51_killed["stderr"][-3000:]
    assert f"Resumed from {c51_killed['killed_at']}" in c51_killed["resumed"]
    assert_complete(run_dir)
    with open(os.path.join(run_dir, "config.yaml")) as handle:
        written = handle.read()
    assert "backend: py_uniform" in written and "kind: c51" in written and "prioritized: true" in written
    check_c51_run(run_dir)  # its atoms and Q probe: policy/final's network's, by hand


def test_a_sigkilled_prioritized_run_resumes_with_the_priorities_it_had_written(c51_killed):
    run_dir = c51_killed["run_dir"]
    leaves, largest = c51_killed["saved"]
    assert len(leaves) > 100 and len(set(leaves.round(9))) > 10  # written back, not all new items' initial value
    assert largest != 1.0  # INITIAL_MAX_PRIORITY: the largest written replaced it
    train = rows(os.path.join(run_dir, "train_metrics.csv"))
    assert all(r["priority_mean"] and r["importance_weight_min"] for r in train)  # before the kill and after
    _, final_largest = py_priorities(run_dir, checkpoints(run_dir)[-1])
    assert final_largest >= largest  # the largest is never forgotten: the resume loaded it


@pytest.fixture(scope="module")
def reverb_killed(tmp_path_factory) -> dict:
    """A prioritized DQN run on Reverb, SIGKILLed (by its crash point) while it writes its second checkpoint: the
    TensorFlow files of ckpt-200 are written, its Reverb table is not, and ckpt-100 is the newest complete one."""
    run_dir = str(tmp_path_factory.mktemp("reverb") / "run")
    killed = cli(*train_args(run_dir, "replay.backend=reverb", "replay.prioritized=true", iterations=200),
                 kill="checkpoint-write:2")
    return {"run_dir": run_dir, "status": killed.returncode, "stderr": killed.stderr}


class Priorities(NamedTuple):
    """What a checkpoint keeps of prioritized replay: each stored item's priority (Reverb: by item key, its
    priority; py_uniform: by slot, its sum-tree leaf, priority^alpha; items not whole yet, at 0, left out) and the
    largest priority seen, which new items enter at."""

    items: dict
    largest: float


def reverb_priorities(run_dir: str, checkpoint: str) -> Priorities:
    """A Reverb run's checkpoint, read from its files: Reverb's table checkpoint (`items.tfrecord`, ZLIB records of
    Reverb's own `PrioritizedItem` protos: every item's key, table and priority, so no server and no sampling is
    needed to see them all) and the largest, a variable of the TensorFlow checkpoint."""
    import tensorflow as tf
    from reverb.cc import schema_pb2

    from dqn_cartpole.replay.reverb_tables import TABLE_NAME

    folder = os.path.join(run_dir, "checkpoints", checkpoint)
    (table,) = os.listdir(os.path.join(folder, "reverb"))
    records = tf.data.TFRecordDataset(os.path.join(folder, "reverb", table, "items.tfrecord"), compression_type="ZLIB")
    items = {}
    for record in records.as_numpy_iterator():
        item = schema_pb2.PrioritizedItem.FromString(record)
        if item.table == TABLE_NAME:  # the other table (insertion order) holds the same items by their index
            items[item.key] = item.priority
    largest = tf.train.load_checkpoint(os.path.join(folder, "tf", "ckpt")).get_tensor(
        "replay_max_priority/.ATTRIBUTES/VARIABLE_VALUE")
    return Priorities(items, float(largest))


def py_priorities_by_slot(run_dir: str, checkpoint: str) -> Priorities:
    leaves, largest = py_priorities(run_dir, checkpoint, by_slot=True)
    return Priorities(leaves, largest)


@pytest.mark.parametrize("backend", ["py_uniform", "reverb"])
def test_priorities_survive_a_sigkill_and_the_resume(backend, request):
    """A prioritized run killed with SIGKILL resumes with the priorities its checkpoint holds: one iteration later
    (one train step, a batch of 32) every other item has the priority it had, and the largest seen, which new items
    enter at, is the checkpoint's or one the step just wrote. Fails if the resume loses them (all at 1 or all at the
    largest, an empty or uniform sum-tree, a largest reset to 1), or if the resume itself breaks.
    py_uniform: the C51 run above (killed from outside), its folder as the kill left it; Reverb: a DQN run."""
    if backend == "py_uniform":
        killed = request.getfixturevalue("c51_killed")
        run_dir, read = killed["copy"], py_priorities_by_slot
    else:
        killed = request.getfixturevalue("reverb_killed")
        run_dir, read = killed["run_dir"], reverb_priorities
        assert killed["status"] == -signal.SIGKILL, killed["stderr"][-3000:]
        assert checkpoints(run_dir) == ["ckpt-0000000100", "ckpt-0000000200.tmp", "reverb-server"]
    newest = [n for n in checkpoints(run_dir) if n.startswith("ckpt-") and "." not in n][-1]
    iteration = int(newest[len("ckpt-"):])
    before = read(run_dir, newest)
    values = np.array(list(before.items.values()))
    assert len(values) > 100 and len(set(values.round(9))) > 10  # written back: not one value for all
    assert before.largest > 1.0  # the largest written replaced the initial 1

    resumed = resume_here(run_dir, f"training.num_iterations={iteration + 1}")
    assert resumed.summary["exit_status"] == 0 and resumed.summary["resumed_from"].endswith(newest)
    after = read(run_dir, f"ckpt-{iteration + 1:010d}")

    assert set(before.items) <= set(after.items)  # every item is still there (capacity 2,000: none evicted)
    rewritten = {k: after.items[k] for k in before.items if after.items[k] != before.items[k]}
    assert 0 < len(rewritten) <= 32, len(rewritten)  # the one batch written back; every other item kept its own
    new = {k: v for k, v in after.items.items() if k not in before.items}
    assert new  # the collected step's window (and the seam's, where the killed episode stood)
    # The largest carried on from the checkpoint: the old one, or a priority the step just wrote, and nothing else.
    alpha = resumed.config.replay.priority_exponent  # py_uniform's leaves are priority^alpha
    written = [v ** (1 / alpha) if backend == "py_uniform" else v for v in [*rewritten.values(), *new.values()]]
    assert after.largest == pytest.approx(max(before.largest, *written), rel=1e-6)
    assert after.largest >= before.largest


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    killed = cli(*train_args(run_dir), kill="checkpoint-rename:4")  # complete, but killed before the rename
    assert killed.returncode == -signal.SIGKILL
    assert checkpoints(run_dir) == ["ckpt-0000000100", "ckpt-0000000200", "ckpt-0000000300", "ckpt-0000000400.tmp"]
    data = os.path.join(run_dir, "checkpoints", "ckpt-0000000300", "tf", "ckpt.data-00000-of-00001")
    with open(data, "r+b") as handle:  # flip some bytes in the middle of the weights and the replay
        handle.seek(os.path.getsize(data) // 2)
        chunk = handle.read(64)
        handle.seek(os.path.getsize(data) // 2)
        handle.write(bytes(b ^ 0xFF for b in chunk))
    capsys.readouterr()
    resume_here(run_dir)
    stderr = capsys.readouterr().err
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert any(re.search(r"ckpt-0000000400\.\d+-[0-9a-f]{8}\.tmp is partial", w) for w in warnings), warnings
    assert any("ckpt-0000000300 is damaged" in w and "checksum" in w and "using ckpt-0000000200" in w
               for w in warnings), warnings
    assert "Resumed from ckpt-0000000200: iteration 200 of 400" in stderr
    assert_complete(run_dir)
    assert "ckpt-0000000300.damaged" in checkpoints(run_dir)  # set aside for a look, not reused


def test_resuming_a_finished_run_only_rewrites_its_artifacts(reference, tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(reference, run_dir)
    shutil.rmtree(os.path.join(run_dir, "plots"))
    shutil.rmtree(os.path.join(run_dir, "policy", "final"))
    metrics = open(os.path.join(run_dir, "train_metrics.csv")).read()
    resume_here(run_dir)
    assert_complete(run_dir)
    assert open(os.path.join(run_dir, "train_metrics.csv")).read() == metrics


def test_resume_refuses_a_different_env_or_network(reference):
    for item, needle in (("env.id=CartPole-v0", "cannot change env.id"),
                         ("network.fc_layer_params=[64, 64]", "cannot change network.fc_layer_params")):
        result = resume(reference, item)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and needle in lines[0], result.stderr
        assert "Traceback" not in result.stderr


def test_sigint_saves_everything_and_exits_130_then_a_nan_loss_keeps_the_last_good_checkpoint(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    proc = start(*train_args(run_dir, iterations=1_000_000), log_dir=tmp_path)
    try:
        wait_for_checkpoint(run_dir, proc)
        proc.send_signal(signal.SIGINT)
        sent = time.time()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout, stderr = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    assert proc.returncode == 130, stderr[-3000:]
    assert time.time() - sent < 60
    assert "SIGINT received" in stderr and "Traceback" not in stderr
    assert f"python -m dqn_cartpole train --resume {run_dir}" in stdout
    newest = checkpoints(run_dir)[-1]
    with open(os.path.join(run_dir, "checkpoints", newest, "state.json")) as handle:
        state = json.load(handle)
    stopped_at = state["iteration"]
    assert not state["finished"] and 0 < stopped_at < 1_000_000
    for path in ("plots/returns.png", "plots/loss.png", "policy/final/saved_model.pb", "policy/best/saved_model.pb"):
        assert os.path.exists(os.path.join(run_dir, path)), path
    with open(os.path.join(run_dir, "policy", "final", "policy_info.json")) as handle:
        assert json.load(handle)["train_step"] == stopped_at

    # Resume (in this process) with a learning rate that blows the weights up: the loss turns NaN at once.
    with pytest.raises(dq.RunFailed, match=r"^Training diverged \(the loss became NaN or Inf at iteration "):
        resume_here(run_dir, "agent.learning_rate=1e30", f"training.num_iterations={stopped_at + 200}")
    stderr = capsys.readouterr().err
    assert "Training diverged: the loss became nan" in stderr
    assert f"The last good checkpoint ({newest}) is kept and exported as policy/final" in stderr
    assert checkpoints(run_dir)[-1] == newest  # nothing written after the divergence
    with open(os.path.join(run_dir, "policy", "final", "policy_info.json")) as handle:
        assert json.load(handle)["train_step"] == stopped_at  # the last good weights, not NaNs


def test_recover_policy_finishes_an_interrupted_swap(tmp_path):
    from dqn_cartpole.run_folder.policy_files import recover_policy

    path = tmp_path / "final"
    (tmp_path / "final.old").mkdir()
    (tmp_path / "final.old" / "which").write_text("old")
    (tmp_path / "final.tmp").mkdir()
    (tmp_path / "final.tmp" / "which").write_text("new")
    recover_policy(str(path))  # killed between the two renames: the new one is complete
    assert (path / "which").read_text() == "new" and not (tmp_path / "final.old").exists()


# The README's snippet: load a saved policy with only TensorFlow and TF-Agents (and gymnasium to play it).
README_SNIPPET = """
import gymnasium as gym
import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

policy = tf.saved_model.load("{policy}")         # RUN_DIR/policy/best or RUN_DIR/policy/final
print("trained for", policy.get_train_step().numpy(), "train steps")

env = gym.make("CartPole-v1")
observation, _ = env.reset(seed=0)
total, done = 0.0, False
while not done:
    step = ts.restart(tf.constant([observation], dtype=tf.float32), batch_size=1)  # a batch of one
    action = int(policy.action(step).action.numpy()[0])                 # greedy action
    observation, reward, terminated, truncated, _ = env.step(action)
    total += reward
    done = terminated or truncated
print("return", total)
"""


# After the snippet (which loads policy/best): policy/final loads too and acts on a batch of observations, and
# nothing of this project was imported.
FINAL_AND_ISOLATION = """
final = tf.saved_model.load("{final}")
obs = tf.constant(np.random.uniform(-0.05, 0.05, size=(5, 4)).astype(np.float32))
actions = final.action(ts.restart(obs, batch_size=5)).action.numpy()
assert actions.shape == (5,) and set(actions.tolist()) <= {0, 1}, actions
import sys
assert not any(m.startswith('dqn_cartpole') for m in sys.modules)
print('isolated')
"""


# And a C51 policy/final (the killed and resumed run's) acts greedily on its expected Q-values (by hand from its
# weights: both actions are greedy at some of the states; an argmax over the atom logits would differ).
C51_GREEDY = """
c51 = tf.saved_model.load("{c51}")
states = np.load("{states}")
actions = c51.action(ts.restart(tf.constant(states), batch_size=len(states))).action.numpy()
assert (actions == np.load("{greedy}")).all(), actions
print('c51 greedy')
"""


# And policies with dueling heads (network.dueling; C51's distributional one), and a noisy one (network.noisy: on its
# mean weights, the same at every call), exported here, act as they did here.
DUELING_GREEDY = """
for name in ("dqn", "c51", "noisy_c51"):
    dueling = tf.saved_model.load("{dueling}/" + name)
    for _ in range(2):
        actions = dueling.action(ts.restart(tf.constant(states), batch_size=len(states))).action.numpy()
        assert (actions == np.load("{dueling}/" + name + ".npy")).all(), (name, actions)
print('dueling greedy')
"""


def export_dueling_policies(folder: str, states) -> None:
    """A dueling DQN and a dueling C51 policy (their initial weights), exported as a run exports them, with the
    greedy actions they take here at `states`."""
    import contextlib

    import numpy as np
    import tensorflow as tf

    from dqn_cartpole.config import load_config
    from dqn_cartpole.distributed import parts
    from dqn_cartpole.run_folder.export import make_saver
    from tf_agents.trajectories import time_step as ts

    for name, sets in (("dqn", ["agent.kind=dqn"]), ("c51", ["agent.kind=c51"]),
                       ("noisy_c51", ["agent.kind=c51", "network.noisy=true"])):
        with contextlib.ExitStack() as stack:
            _, _, agent = parts.agent_with_envs(load_config(None, sets + ["network.dueling=true"]), 1, 0, stack)
            make_saver(agent.policy, agent.train_step_counter).save(os.path.join(folder, name))
            step = ts.restart(tf.constant(states), batch_size=len(states))
            np.save(os.path.join(folder, name + ".npy"), agent.policy.action(step).action.numpy())


def test_readme_snippet_loads_a_policy_in_a_fresh_process_with_only_tf_agents(reference, c51_killed, tmp_path):
    import numpy as np

    from dqn_cartpole.core.q_probe import QProbe

    c51_final = os.path.join(c51_killed["run_dir"], "policy", "final")
    # The comparison below means something only if both actions are greedy at some of the states. A short run's
    # policy picks one action at 91-96% of the probe's states (and at all of them in one CI run), so the states are
    # the probe's plus up to 128 per action from a box twice CartPole's range (50-70% one action), each with a clear
    # gap between its two expected Q-values (float32 in the policy, float64 here: a near tie could go either way).
    support = (51, -10.0, 10.0)  # smoke + kind c51: C51's defaults
    pool = np.random.default_rng(0).uniform(-1.0, 1.0, (20_000, 4)) * np.array([4.8, 10.0, 0.42, 10.0])
    _, pool_q = c51_atoms_by_hand(c51_final, pool, *support)
    clear = np.abs(pool_q[:, 1] - pool_q[:, 0]) > 1e-3
    picked = [pool[clear & (pool_q.argmax(axis=1) == action)][:128] for action in (0, 1)]
    states = np.concatenate([QProbe.states_of("CartPole-v1", 0), *picked]).astype(np.float32)
    _, expected_q = c51_atoms_by_hand(c51_final, states, *support)
    assert set(expected_q.argmax(axis=1)) == {0, 1}
    np.save(tmp_path / "states.npy", states)
    np.save(tmp_path / "greedy.npy", expected_q.argmax(axis=1))
    code = README_SNIPPET.replace("{policy}", os.path.join(reference, "policy", "best")) + \
        FINAL_AND_ISOLATION.replace("{final}", os.path.join(reference, "policy", "final")) + \
        C51_GREEDY.replace("{c51}", c51_final).replace("{states}", str(tmp_path / "states.npy")).replace(
            "{greedy}", str(tmp_path / "greedy.npy")) + \
        DUELING_GREEDY.replace("{dueling}", str(tmp_path / "dueling"))
    export_dueling_policies(str(tmp_path / "dueling"), states)
    result = run_python(code, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained for" in result.stdout and "return" in result.stdout and "isolated" in result.stdout
    assert "c51 greedy" in result.stdout and "dueling greedy" in result.stdout


@pytest.mark.parametrize("jit_compile", [True, False])
def test_a_nan_loss_with_or_without_xla_rolls_back_to_the_last_good_checkpoint(tmp_path, jit_compile, capsys):
    """Without XLA, TF-Agents' check_numerics used to raise from inside the graph (a traceback); both runs train in
    this process, where the diverged run raises RunFailed with its one line."""
    run_dir = str(tmp_path / "run")
    train_here(run_dir, f"training.jit_compile={str(jit_compile).lower()}", iterations=200)
    newest = checkpoints(run_dir)[-1]
    with open(os.path.join(run_dir, "checkpoints", newest, "state.json")) as handle:
        state = json.load(handle)
    assert len(state["stream"]["observation"]) == 1 and len(state["stream"]["observation"][0]) == 4
    capsys.readouterr()
    with pytest.raises(dq.RunFailed) as failed:
        resume_here(run_dir, "agent.learning_rate=1e30", "training.num_iterations=400")
    assert "\n" not in str(failed.value) and failed.value.run == dq.Run(run_dir)
    assert str(failed.value).endswith("then continue with: dqn_cartpole.train(resume=%r, overrides="
                                      "{'agent.learning_rate': ...})" % run_dir)
    assert "Training diverged: the loss became nan" in capsys.readouterr().err
    with open(os.path.join(run_dir, "policy", "final", "policy_info.json")) as handle:
        info = json.load(handle)
    # policy/final holds the checkpoint's weights, and says so: its iteration and env steps, not the diverged ones.
    assert (info["train_step"], info["iteration"], info["env_steps"]) == (200, 200, state["env_steps"])


def test_one_process_at_a_time_per_run_folder(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = start(*train_args(run_dir, iterations=1_000_000), log_dir=tmp_path)
    try:
        wait_for_checkpoint(run_dir, proc)
        before = sorted(os.listdir(run_dir))
        for args in (("train", "--quiet", "--resume", run_dir),
                     ("train", "--quiet", "--config", SMOKE, "--output-dir", run_dir, "--overwrite")):
            result = cli(*args, timeout=60)
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert result.returncode == 2 and len(lines) == 1, result.stderr
            assert f"in use by another dqn_cartpole process (pid {proc.pid} (train))" in lines[0]
            assert sorted(os.listdir(run_dir)) == before  # --overwrite touched nothing
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    assert proc.returncode == 143
    assert lock_files(run_dir) == []  # stopped by SIGTERM, it ended in its own time: no lock file left
    resumed = resume_here(run_dir, f"training.num_iterations={N}")  # the lock went with the process
    assert resumed.summary["exit_status"] == 0 and resumed.summary["resumed_from"]
