"""tune's study checks, in-process and without a run: a study that can never see a solve is refused before its first
trial (tests/test_experiments_bad_input.py has the one-line errors); one whose trials all scored the same says so."""

import os

import pytest

from helpers import CONFIGS

from dqn_cartpole.config import load_config, to_dict
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import study_checks
from dqn_cartpole.experiments.tune import TunePlan, run_tune

SMOKE = os.path.join(CONFIGS, "smoke.yaml")


def test_a_study_is_refused_only_when_no_trial_can_solve():
    """In-process on resolved configs (plan_tune's own checks of them spawn a process: test_experiments_bad_input)."""
    never = to_dict(load_config(SMOKE))  # smoke.yaml: stop_when_solved false
    solving = to_dict(load_config(SMOKE, ["evaluation.stop_when_solved=true"]))
    with pytest.raises(UserError, match=f"^{SMOKE}: evaluation.stop_when_solved is false, so no run stops at a "
                                        rf"solve \(each trains its whole budget past it\); --objective cpu_s is measured at a confirmed solve"):
        study_checks.check_can_solve(SMOKE, [], never, [never], "cpu_s", "solved_cpu_s")
    study_checks.check_can_solve(SMOKE, [], never, [never, solving], "cpu_s", "solved_cpu_s")  # a value of the space
    study_checks.check_can_solve(SMOKE, [], never, [], "best_return", "best_return")  # measured without a solve
    short = ["evaluation.stop_when_solved=true", "env.max_episode_steps=100"]
    out_of_reach = to_dict(load_config(SMOKE, short))
    with pytest.raises(UserError, match=r"^--set env.max_episode_steps=100: evaluation.solve_return 475 is above the "
                                        r"best return CartPole-v1 allows here \(100\), so no run can solve it; "
                                        r".*lower evaluation.solve_return or raise env.max_episode_steps$"):
        study_checks.check_can_solve(SMOKE, short, out_of_reach, [], "env_steps", "solved_env_steps")
    assert study_checks.why_never_solved(solving) is None


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
    checked = TunePlan("t", str(tmp_path / "tune" / "t"), SMOKE, str(tmp_path / "space.yaml"), (), trials=2, jobs=1,
                       storage_url=str(tmp_path / "journal.log"), overrides=(), sampler_seed=0, warmup_env_steps=0)
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
