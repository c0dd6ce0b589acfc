"""Evaluation beside the training (`evaluation.overlap`): a worker (a child process by default) evaluates a copy of
the weights while the trainer trains on, and the trainer takes the outcome in one eval interval later.

Timing belongs in scripts/benchmark.py; these tests check the mechanism: the trainer went on past each evaluated
iteration before its outcome was taken in, a seeded run gives the same rows, the same solve and the same policy
twice (whatever the worker's timing), policy/final holds the very weights the check passed (not the live ones at
the stop), and the worker plays the episodes the trainer's own in-line evaluation plays, without TensorFlow.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from dqn_cartpole.config import load_config
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core import snapshot_evaluation
from dqn_cartpole.core.evaluation import make_episode_runner
from dqn_cartpole.core.envs import make_batched_env
from dqn_cartpole.core.policies import NumpyGreedy
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training import artifacts, overlap, triggers
from dqn_cartpole.training.session import TrainingSession

EVAL_INTERVAL = 100
# A short run that solves early: the default agent on CartPole-v1, "solved" at an average of 60 over 20 episodes
# (the default agent gets there within a few hundred iterations), no videos or TensorBoard.
QUICK = ["training.seed=3", "evaluation.solve_return=60", "evaluation.solve_margin=0", "evaluation.solve_episodes=20",
         f"evaluation.eval_interval={EVAL_INTERVAL}", "evaluation.num_eval_episodes=5", "video.enabled=false",
         "output.tensorboard=false", "training.initial_collect_steps=200", "training.num_iterations=3000",
         "training.log_interval=100", "training.checkpoint_interval=1000"]


def rows(path: str, leave_out: tuple = ("wall_s", "train_steps_per_s")) -> list[dict]:
    with open(path, newline="") as handle:
        return [{k: v for k, v in row.items() if k not in leave_out} for row in csv.DictReader(handle)]


def policy_weights(policy_dir: str) -> list[np.ndarray]:
    """The saved policy's variables in the order the policy saved them (`model_variables/0`, `/1`, ...: the network's
    layers in order). Not sorted by name: Keras numbers its layers' names per process (dense_2, dense_10), so two
    runs in one process could sort differently (seen in CI)."""
    import os

    reader = tf.train.load_checkpoint(os.path.join(policy_dir, "variables", "variables"))
    count = sum(1 for name in reader.get_variable_to_shape_map() if name.startswith("model_variables/"))
    return [reader.get_tensor(f"model_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(count)]


class Run:
    """One seeded run in this process, with what its overlapped evaluation did."""

    def __init__(self, folder: str, mode: str, monkeypatch):
        self.folder, self.snapshots, self.session = folder, [], None
        taken = triggers.Snapshot.take

        def take(*args, **kwargs):
            self.snapshots.append(taken(*args, **kwargs))
            return self.snapshots[-1]

        # The evaluations are what is tested here: the plots and videos are left out (each costs a second or two),
        # and the policy a solve hands over for the trained agent's video is kept.
        self.video_policies = []
        with monkeypatch.context() as patch:
            patch.setattr(triggers.Snapshot, "take", take)
            patch.setattr(artifacts.ArtifactWorkers, "make", lambda self, *args, close_logs, **kwargs: close_logs() or {})
            patch.setattr(artifacts.ArtifactWorkers, "start_final", lambda _, policy: self.video_policies.append(policy))
            session = TrainingSession(load_config(None, [*QUICK, f"evaluation.overlap={mode}"]), RunLayout(folder),
                                      Progress(3000, enabled=False))
            self.summary = session.run()
        self.evaluation = session.evaluate

    def snapshot_at(self, iteration: int) -> triggers.Snapshot:
        (snapshot,) = [s for s in self.snapshots if s.iteration == iteration]
        return snapshot


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        return {name: Run(str(tmp_path_factory.mktemp(name)), mode, monkeypatch)
                for name, mode in (("process", "process"), ("thread", "thread"))}
    finally:
        monkeypatch.undo()


def test_the_trainer_trains_on_while_each_evaluation_runs_and_takes_it_in_one_interval_later(runs):
    run = runs["process"]
    assert isinstance(run.evaluation, overlap.OverlappedEvaluation)
    assert isinstance(run.evaluation.worker, snapshot_evaluation.ProcessWorker)
    solved = run.summary["solved_at_iteration"]
    assert solved is not None and solved > 0, run.summary
    # Every evaluated iteration k was taken in at k + eval_interval: the trainer ran that interval's chunks while
    # the worker evaluated the copy of the weights of k.
    assert run.evaluation.settled == [(k, k + EVAL_INTERVAL) for k in range(0, solved + 1, EVAL_INTERVAL)]
    assert run.summary["iterations"] == solved + EVAL_INTERVAL  # it stopped one interval after the weights that solved
    assert run.summary["parallel"]["evaluations (another process)"] > 0 and run.summary["evaluator_peak_rss_mb"] > 0
    assert [int(r["train_step"]) for r in rows(os.path.join(run.folder, "eval_metrics.csv"))] == \
        list(range(0, solved + 1, EVAL_INTERVAL))  # each row names the train step of the weights it evaluated


def test_a_seeded_run_gives_the_same_rows_the_same_solve_and_the_same_policy_twice(runs):
    """Twice the same seed, once with the worker in a child process and once in a thread (another timing
    altogether): the decisions fall at the same iterations, so everything the run writes is the same."""
    first, again = runs["process"], runs["thread"]
    assert isinstance(again.evaluation.worker, snapshot_evaluation.ThreadWorker)
    assert rows(os.path.join(first.folder, "eval_metrics.csv")) == rows(os.path.join(again.folder, "eval_metrics.csv"))
    assert rows(os.path.join(first.folder, "train_metrics.csv")) == rows(os.path.join(again.folder, "train_metrics.csv"))
    for key in ("solved_at_iteration", "solved_return", "solved_env_steps", "iterations", "best_return"):
        assert first.summary[key] == again.summary[key], key
    for a, b in zip(policy_weights(os.path.join(first.folder, "policy", "final")),
                    policy_weights(os.path.join(again.folder, "policy", "final"))):
        np.testing.assert_array_equal(a, b)


def test_policy_final_holds_the_weights_the_check_passed_not_the_live_ones_at_the_stop(runs):
    run = runs["process"]
    solved = run.summary["solved_at_iteration"]
    checked = run.snapshot_at(solved)
    final = policy_weights(os.path.join(run.folder, "policy", "final"))
    assert len(final) == len(checked.values)  # both in the policy's order of its variables
    for saved, value in zip(final, checked.values):
        np.testing.assert_array_equal(saved, value)
    # The live weights at the stop, one interval later, are others.
    live = [v.numpy() for v in run.evaluation.pipeline.agent.policy.variables()]
    assert any(not np.array_equal(a, b) for a, b in zip(live, checked.values))
    # The trained agent's video plays those weights too, handed over as soon as the solve was taken in.
    (video_policy,) = run.video_policies
    for (kernel, bias, _), (checked_kernel, checked_bias, _) in zip(video_policy.q_network.layers(), checked.layers):
        np.testing.assert_array_equal(kernel, checked_kernel)
        np.testing.assert_array_equal(bias, checked_bias)
    info = __import__("json").load(open(os.path.join(run.folder, "policy", "final", "policy_info.json")))
    assert (info["iteration"], info["train_step"], info["solved"]) == (solved, checked.train_step, True)
    assert tf.saved_model.load(os.path.join(run.folder, "policy", "final")).get_train_step().numpy() == \
        checked.train_step


def balanced_layers(seed: int) -> list:
    """Dense weights [4 -> 8 -> 2] that balance CartPole for a while (Q(right) - Q(left) grows with the angle and
    angular velocity), with noise."""
    rng = np.random.default_rng(seed)
    lean = np.zeros((4, 8), np.float32)
    lean[2:, :4], lean[2:, 4:] = 1.0, -1.0
    out = np.zeros((8, 2), np.float32)
    out[:4, 1], out[4:, 0] = 1.0, 1.0
    noise = lambda shape: rng.normal(0.0, 0.05, shape).astype(np.float32)  # noqa: E731
    return [(lean + noise((4, 8)), np.zeros(8, np.float32), "relu"), (out + noise((8, 2)), noise(2), "linear")]


SPEC = dict(env_id="CartPole-v1", max_episode_steps=None, episodes=6, seed=31, gamma=0.9, minimum_action=0,
            check_above=50.0, check_episodes=12, check_seed=500, max_return=500.0)


def test_each_worker_plays_the_episodes_the_trainer_would_play_in_line():
    """The worker's episodes (an evaluation, then the solve check) are the trainer's own NumPy evaluation's: the
    same greedy loop over the same seeded copies, in a child process and in a thread alike."""
    layers = balanced_layers(7)
    outcomes = {}
    for name, worker_class in snapshot_evaluation.WORKERS.items():
        worker = worker_class(snapshot_evaluation.EvaluationSpec(**SPEC))
        try:
            for iteration in (0, 100):
                worker.submit(snapshot_evaluation.Job(iteration, layers))
            outcomes[name] = [worker.result(), worker.result()]
        finally:
            worker.close()
    greedy = NumpyGreedy(type("Fixed", (), {"layers": lambda self: layers})(), 0)
    env = make_batched_env("CartPole-v1", 6, seed=31)
    try:
        in_line = [make_episode_runner(greedy, env, gamma=0.9)() for _ in range(2)]
    finally:
        env.close()
    assert in_line[0].lengths.min() > 20  # long enough to be a real comparison
    for name, (first, second) in outcomes.items():
        for outcome, expected in ((first, in_line[0]), (second, in_line[1])):  # the second continues the stream
            np.testing.assert_array_equal(outcome.result.returns, expected.returns, err_msg=name)
            np.testing.assert_array_equal(outcome.result.first_observations, expected.first_observations)
            np.testing.assert_allclose(outcome.result.discounted_returns, expected.discounted_returns, rtol=1e-12)
        assert first.check is not None and len(first.check.returns) == 12  # it reached 50: the check ran
    np.testing.assert_array_equal(outcomes["process"][0].check.returns, outcomes["thread"][0].check.returns)


def test_a_worker_that_cannot_evaluate_says_why_in_one_line():
    worker = snapshot_evaluation.ProcessWorker(snapshot_evaluation.EvaluationSpec(**{**SPEC, "env_id": "CartPole-v9"}))
    try:
        worker.submit(snapshot_evaluation.Job(0, balanced_layers(1)))
        with pytest.raises(snapshot_evaluation.EvaluatorFailed) as failed:
            worker.result()
    finally:
        worker.close()
    assert str(failed.value).startswith("error: the evaluator failed: ") and "CartPole-v9" in str(failed.value)
    assert "\n" not in str(failed.value)


def test_the_evaluator_process_never_imports_tensorflow():
    code = ("import sys, dqn_cartpole.core.snapshot_evaluation; print(sorted(m for m in sys.modules if m.split('.')[0] "
            "in ('tensorflow', 'tf_agents', 'tensorflow_probability')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]
