"""The training run's parts in-process: triggers, chunk sizing, the run state, resume planning.

The end-to-end tests (test_train_e2e, test_resume) run the whole CLI; these pin down each
part's rules directly, fast, so a refactor does not lean on the slow tests alone.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dqn_cartpole.config import load_config
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.policy_files import INFO_FILE
from dqn_cartpole.training import checkpoints as resume, triggers
from dqn_cartpole.training.loop import FIRST_CHUNK, Chunk, ChunkedLoop
from dqn_cartpole.training.state import RESUMED_FIELDS, RunState

from helpers import write_checkpoint


# ---------------------------------------------------------------------------- triggers


def test_every_fires_once_per_multiple_and_a_resumed_run_misses_none():
    # The loop calls triggers where chunks end: on every multiple of any interval (here 50 and 100).
    fired = []
    for start in (0, 250):  # a fresh run, and one resumed at iteration 250
        trigger = triggers.every(100, lambda: fired.append((start, iteration)), iteration=start)
        for iteration in range(start + 50, 401, 50):
            trigger(iteration)
    assert fired == [(0, 100), (0, 200), (0, 300), (0, 400), (250, 300), (250, 400)]


def test_periodic_checkpoint_skips_the_end_and_a_solved_run():
    saved, state = [], RunState()
    checkpoint = triggers.PeriodicCheckpoint(lambda: saved.append(state.iteration), state, total=1000)
    for iteration, stop in ((500, False), (1000, False), (700, True)):
        state.iteration, state.stop = iteration, stop
        checkpoint()
    assert saved == [500]  # the last one is written after the loop, with the final evaluation in it


def test_clock_continues_from_a_checkpoint():
    clock = triggers.Clock(0.0)
    clock.continue_from(12.5)
    assert 12.4 < clock.wall() < 14


# ---------------------------------------------------------------------------- the compiled loop's chunks


def test_chunks_end_on_every_interval_and_never_pass_the_total():
    loop = ChunkedLoop(run_iterations=None, intervals=[200, 500, 5000])
    assert loop.chunk_size(0, 30_000) == FIRST_CHUNK
    loop.max_chunk = 10_000
    assert loop.chunk_size(0, 30_000) == 200
    assert loop.chunk_size(450, 30_000) == 50  # the eval at 500 comes first
    assert loop.chunk_size(29_990, 30_000) == 10


def test_first_bad_loss_names_the_iteration():
    chunk = Chunk(first=400, size=4, time_step=None, policy_state=None,
                  losses=np.array([1.0, 2.0, np.nan, np.inf], np.float32))
    assert chunk.first_bad_loss()[0] == 403 and np.isnan(chunk.first_bad_loss()[1])
    assert Chunk(0, 2, None, None, np.array([1.0, 2.0])).first_bad_loss() is None


# ---------------------------------------------------------------------------- the run state


def test_run_state_round_trips_through_a_checkpoint_and_reports_a_summary():
    state = RunState(iteration=500, loss=0.5, last_return=200.0, best_return=300.0, best_iteration=400,
                     loop_s=2.0, loop_iterations=1000)
    saved = {"run_state": state.resumed_fields()}
    assert set(saved["run_state"]) == set(RESUMED_FIELDS)
    resumed = RunState()
    resumed.resume_from({"run_state": {**saved["run_state"], "from_a_newer_version": 1}}, iteration=500)
    assert resumed.resumed_fields() == state.resumed_fields() and resumed.iteration == 500
    assert resumed.loop_s == 0.0  # per process
    summary = state.summary("run", train_steps=500, env_steps=600, wall_s=9.0)
    assert summary["iterations_per_s"] == 500.0 and summary["best_return"] == 300.0
    assert summary["checkpoint_bytes"] is None and summary["exit_status"] == 0


# ---------------------------------------------------------------------------- resume planning


def test_resume_plan_takes_the_newest_good_checkpoint(tmp_path):
    root = str(tmp_path / "run" / "checkpoints")
    os.makedirs(root)
    write_checkpoint(root, 100)
    good = write_checkpoint(root, 200)
    write_checkpoint(root, 300, damage=True)
    os.makedirs(os.path.join(root, checkpointing.checkpoint_name(400) + checkpointing.TMP_SUFFIX))
    plan = checkpointing.plan_resume(str(tmp_path / "run"))
    assert plan.found.path == good and plan.found.iteration == 200
    reasons = sorted(bad.reason.split(":")[0] for bad in plan.bad)
    assert reasons == ["damaged", "partial"]


def test_prepare_folder_sets_bad_checkpoints_aside_and_leaves_the_metrics_until_the_restore_succeeded(tmp_path):
    from dqn_cartpole.run_folder.layout import RunLayout

    run = RunLayout(str(tmp_path / "run"))
    os.makedirs(run.checkpoints)
    good = write_checkpoint(run.checkpoints, 100)
    os.makedirs(os.path.join(good, checkpointing.METRICS_DIR))
    with open(os.path.join(good, checkpointing.METRICS_DIR, "eval_metrics.csv"), "w") as handle:
        handle.write("train_step\n0\n100\n")
    with open(run.eval_metrics, "w") as handle:
        handle.write("train_step\n0\n100\n200\n")  # a row written after the checkpoint
    write_checkpoint(run.checkpoints, 200, damage=True)
    found = resume.prepare_folder(run, checkpointing.plan_resume(run.root))
    assert found.iteration == 100
    # The restore can still fail (a build, a TF read, the replay's size): the CSVs stay as they were till then.
    assert open(run.eval_metrics).read() == "train_step\n0\n100\n200\n"
    checkpointing.restore_metrics(found, resume.metrics_files(run))  # what a successful restore ends with
    assert open(run.eval_metrics).read() == "train_step\n0\n100\n"
    assert not os.path.exists(os.path.join(run.checkpoints, checkpointing.checkpoint_name(200)))


@pytest.mark.parametrize("finished, asked_before, asked_now, done", [
    (False, 1000, 1000, False), (True, 1000, 1000, True), (True, 1000, 2000, False), (True, 1000, 500, True)])
def test_a_finished_run_trains_on_only_when_more_iterations_are_asked(tmp_path, finished, asked_before, asked_now,
                                                                     done):
    path = write_checkpoint(str(tmp_path), 1000, finished=finished, num_iterations=asked_before)
    found = checkpointing.Found(path, 1000, checkpointing.read_state(path))
    config = load_config(None, [f"training.num_iterations={asked_now}"])
    assert resume.already_done(found, config) is done


def test_a_better_best_policy_saved_after_the_checkpoint_is_kept(tmp_path):
    best = tmp_path / "best"
    best.mkdir()
    (best / INFO_FILE).write_text(json.dumps({"average_return": 480.0, "iteration": 1200}))
    state = RunState(best_return=450.0, best_iteration=1000)
    resume.adopt_best_on_disk(str(best), state)
    assert (state.best_return, state.best_iteration) == (480.0, 1200)
    state = RunState(best_return=490.0, best_iteration=1000)
    resume.adopt_best_on_disk(str(best), state)
    assert (state.best_return, state.best_iteration) == (490.0, 1000)


def test_resume_seed_depends_on_seed_and_iteration():
    seeds = {resume.resume_seed(s, i) for s in (0, 1) for i in (100, 200)}
    assert len(seeds) == 4 and all(0 <= s < 2**31 - 1 for s in seeds)


def test_the_exit_status_is_1_after_a_failure_even_when_stopped_then_128_plus_the_signal_then_1_after_a_divergence():
    import signal

    def status(signum=None, **fields) -> int:
        state = RunState(**fields)
        state.end(signum)
        return state.exit_status

    assert status() == 0 and status(diverged_at_iteration=7) == 1
    assert status(signal.SIGINT) == 130 and status(signal.SIGTERM, diverged_at_iteration=7) == 143
    assert status(failed=True) == 1 and status(signal.SIGTERM, failed=True) == 1  # a learner without data


def test_a_checkpoint_record_carries_the_run_state_and_the_rngs_which_restore_the_same_draws():
    import random

    class Replay:
        def size(self) -> int:
            return 7

        def inserts(self) -> int:
            return 9

    state = RunState(best_return=12.5, iteration=40)
    record = json.loads(json.dumps(resume.checkpoint_record(state, False, 80, 160, Replay(), None, 3.5, {"k": 1})))
    assert (record["train_step"], record["env_steps"], record["replay_size"], record["replay_inserts"]) == (80, 160, 7, 9)
    assert record["run_state"]["best_return"] == 12.5 and record["stream"] is None and record["config"] == {"k": 1}
    draws = (random.random(), float(np.random.random()))
    resume.restore_rng_state(record["rng"])
    assert (random.random(), float(np.random.random())) == draws


class FakeExporter:
    def __init__(self):
        self.saved = []

    def save(self, path, average_return, **kwargs):
        self.saved.append((path, average_return))


class FakePipeline:
    def env_step_count(self):
        return 1234


class FakeProgress:
    def __init__(self):
        self.lines = []

    def message(self, line):
        self.lines.append(line)


@pytest.mark.parametrize("margin, solved", [(0.0, True), (2.0, False)])
def test_a_solve_is_confirmed_only_with_the_margin_of_standard_errors_above_the_target(margin, solved):
    """A check averaging 480 with a standard error of about 10 passes 475 alone, not 475 + 2 standard errors."""
    from dqn_cartpole.core.evaluation import EvalResult

    config = load_config(None, [f"evaluation.solve_margin={margin}"])
    returns = np.concatenate([np.full(96, 500.0), np.full(4, 0.0)])  # mean 480, standard error about 9.8
    result = EvalResult(returns=returns, lengths=returns.astype(np.int64))
    assert result.average_return == 480.0 and 9.5 < result.standard_error < 10.0
    state, exporter, progress = RunState(), FakeExporter(), FakeProgress()
    check = triggers.SolveCheck(FakePipeline(), config, state, exporter, "final", 475.0, triggers.Clock(0.0),
                                progress)
    check.run_episodes = lambda: result
    check.check()
    assert state.stop is solved and (state.solved_at_iteration is not None) is solved
    assert [path for path, _ in exporter.saved] == (["final"] if solved else [])
    if solved:
        assert progress.lines[-1].startswith("Solved at iteration 0: average return 480.0 over 100 greedy episodes")


def test_the_standard_error_of_an_evaluation():
    from dqn_cartpole.core.evaluation import EvalResult

    returns = np.array([10.0, 20.0, 30.0, 40.0])
    assert EvalResult(returns=returns, lengths=np.ones(4)).standard_error == pytest.approx(np.std(returns, ddof=1) / 2)
    assert EvalResult(returns=np.array([7.0]), lengths=np.ones(1)).standard_error == 0.0


# ---------------------------------------------------------------------------- the session's parts


def fake_session(tmp_path, solved_at=None, stop=False, trained=True, signalled=False, **config_overrides):
    """What a part reads of a session: its config, layout, run state, stop request, clock and progress."""
    from types import SimpleNamespace

    from dqn_cartpole.run_folder.layout import RunLayout

    config = load_config(None, [f"{key}={value}" for key, value in config_overrides.items()])
    messages = []
    return SimpleNamespace(
        config=config, layout=RunLayout(str(tmp_path)), trained=trained,
        state=RunState(solved_at_iteration=solved_at, stop=stop), clock=triggers.Clock(0.0),
        stop_request=SimpleNamespace(requested=signalled), progress=SimpleNamespace(message=messages.append),
        messages=messages)


def test_the_single_process_and_the_learner_are_one_session_class_built_from_their_own_parts():
    from dqn_cartpole.console import signals
    from dqn_cartpole.distributed import following, learner
    from dqn_cartpole.training import local, session

    single = local.single_process_parts()
    assert (type(single.data), type(single.evaluation), type(single.finish)) == \
        (local.LocalCollection, local.InProcessEvaluation, local.OwnSolveCheck)
    assert single.stop_request.give_up_after_s is None and not single.finish.solved_elsewhere
    role = learner.learner_parts(load_config(), "localhost:1")
    assert (type(role.data), type(role.evaluation), type(role.finish)) == \
        (learner.LearnerData, following.FollowEvaluator, following.EvaluatorSolveCheck)
    assert role.stop_request.give_up_after_s == signals.ROLE_GIVE_UP_S and role.finish.solved_elsewhere
    assert role.data.link is role.evaluation.link  # one pusher and status watch for both
    subclasses = [value for module in (learner, following, local) for value in vars(module).values()
                  if isinstance(value, type) and issubclass(value, session.TrainingSession)
                  and value is not session.TrainingSession]
    assert subclasses == []


def test_who_owns_the_solve_check_decides_whether_policy_final_is_exported_again(tmp_path):
    from dqn_cartpole.console.exit_status import EXIT_CRASHED
    from dqn_cartpole.distributed.following import EvaluatorSolveCheck
    from dqn_cartpole.training.local import OwnSolveCheck

    final = tmp_path / "policy" / "final"
    own, evaluator = OwnSolveCheck(), EvaluatorSolveCheck(lambda: None)
    assert not own.keeps_solved_policy(fake_session(tmp_path, solved_at=100, stop=True))  # nothing on disk yet
    final.mkdir(parents=True)
    # This process's check: its solve stopped the run, or a resumed run had nothing left to train.
    assert own.keeps_solved_policy(fake_session(tmp_path, solved_at=100, stop=True))
    assert own.keeps_solved_policy(fake_session(tmp_path, solved_at=100, trained=False))
    assert not own.keeps_solved_policy(fake_session(tmp_path, solved_at=100, stop=False))  # trained on past it
    # The evaluator's: a solve it confirmed that stopped the run is final, whatever the learner trained after the
    # word came; a run that trains on past its solve (stop_when_solved false) exports its last weights.
    assert evaluator.keeps_solved_policy(fake_session(tmp_path, solved_at=100, stop=True))
    assert not evaluator.keeps_solved_policy(fake_session(tmp_path, solved_at=100, stop=False))
    assert not evaluator.keeps_solved_policy(fake_session(tmp_path))
    # A learner stopped by a signal ends lightly (its watchdog is counting); a single process never does.
    signalled = fake_session(tmp_path, signalled=True)
    assert evaluator.lightly(signalled) and not own.lightly(signalled)
    session = fake_session(tmp_path)
    assert EvaluatorSolveCheck(lambda: "no data").seal(session, {"exit_status": 1})["exit_status"] == EXIT_CRASHED
    assert session.state.exit_status == EXIT_CRASHED
    assert evaluator.seal(session, {"exit_status": 0}) == {"exit_status": 0}


def test_the_learner_takes_the_evaluators_results_in_and_stops_on_its_confirmed_solve(tmp_path):
    from dqn_cartpole.distributed.following import follow
    from dqn_cartpole.distributed.status import Evaluation

    session = fake_session(tmp_path, **{"training.train_steps_per_iteration": 2})
    assert follow(session, None) is None and session.state.last_return is None
    follow(session, Evaluation(train_step=400, env_steps=900, average_return=120.0, best_return=150.0,
                               best_iteration=100))
    state = session.state
    assert (state.last_return, state.best_return, state.best_iteration, state.stop) == (120.0, 150.0, 100, False)
    follow(session, Evaluation(train_step=1000, env_steps=2000, average_return=500.0, best_return=500.0,
                               best_iteration=500, solved=True, solved_return=498.5, solved_episodes=100))
    assert state.stop
    assert (state.solved_at_iteration, state.solved_return, state.solved_env_steps) == (500, 498.5, 2000)
    assert "Solved at iteration 500 (the evaluator's check" in session.messages[0]
    kept = fake_session(tmp_path, **{"evaluation.stop_when_solved": "false"})
    follow(kept, Evaluation(1000, 2000, 500.0, 500.0, 500, solved=True, solved_return=498.5, solved_episodes=100))
    assert not kept.state.stop and kept.state.solved_at_iteration == 1000  # marked (the target updates change), no stop
    assert "training on" in kept.messages[0]
