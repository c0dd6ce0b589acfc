"""tune's study checks, in-process and without a run: a study that can never see a solve is refused before its first
trial (tests/test_experiments_bad_input.py has the one-line errors); one whose trials all scored the same says so."""

import os

import pytest

from helpers import CONFIGS

from dqn_cartpole.experiments import study_checks
from dqn_cartpole.experiments.tune import plan_tune, run_tune

SMOKE = os.path.join(CONFIGS, "smoke.yaml")
SPACE = "agent.learning_rate: {low: 1e-4, high: 1e-2, log: true}\n"


def plan(tmp_path, space: str = SPACE, *overrides: str, storage=None):
    path = tmp_path / "space.yaml"
    path.write_text(space)
    return plan_tune(SMOKE, str(path), trials=2, jobs=1, storage_url=storage, study_name="t",
                     overrides=[f"output.root={tmp_path}", *overrides], sampler_seed=0)


def test_a_space_that_lets_some_trials_solve_is_accepted(tmp_path):
    assert plan(tmp_path, SPACE + "evaluation.stop_when_solved: {choices: [true, false]}\n").trials == 2
    assert plan(tmp_path, SPACE, "evaluation.stop_when_solved=true").trials == 2


@pytest.mark.parametrize("values, warns", [([728.0, 728.0, 728.0], True), ([728.0, 700.0], False), ([728.0], False),
                                           ([], False)])
def test_the_warning_needs_two_equal_scores(values, warns):
    warning = study_checks.all_equal_warning(values)
    assert (warning is not None) is warns
    if warns:
        assert warning.startswith("warning: all 3 completed trials scored the same (728): the study cannot tell")


def test_a_study_whose_trials_all_scored_the_same_warns_at_its_end(tmp_path, capsys, monkeypatch):
    """Two completed trials with one score (as when no run solves) are in the study; tune runs no more and warns
    (after its outputs, which are not drawn here: test_tune.py checks them)."""
    import optuna

    from dqn_cartpole.experiments import tune_outputs

    monkeypatch.setattr(tune_outputs, "write_outputs", lambda study, plan: ["wrote the outputs"])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    checked = plan(tmp_path, SPACE, "evaluation.stop_when_solved=true", storage=str(tmp_path / "journal.log"))
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(checked.storage_url))
    study = optuna.create_study(study_name="t", storage=storage, direction="minimize")
    for rate in (1e-3, 2e-3):
        study.add_trial(optuna.trial.create_trial(
            params={"agent.learning_rate": rate}, value=728.0,
            distributions={"agent.learning_rate": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)},
            user_attrs={"overrides": [f"agent.learning_rate={rate}"]}))
    assert run_tune(checked) == 0
    out, err = capsys.readouterr()
    assert "wrote the outputs" in out
    assert "warning: all 2 completed trials scored the same (728)" in err and err.count("\n") == 1
