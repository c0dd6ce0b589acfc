"""`make check-latest` (scripts/check_latest.py), in the process and without network or install: two resolutions
compared, the upgrade that broke a test named from given re-runs, the commands it runs, and its one-line errors."""

from __future__ import annotations

import json
import os
import sys

import pytest

from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))

import check_latest  # noqa: E402
from check_latest import Change, Rerun, Trial  # noqa: E402

LOCK = """version = 1
revision = 5
requires-python = ">=3.9, <3.12"

[[package]]
name = "dqn-cartpole"
source = {{ editable = "." }}

[[package]]
name = "optuna"
version = "{optuna}"
source = {{ registry = "https://pypi.org/simple" }}

[[package]]
name = "sqlalchemy"
version = "{sqlalchemy}"
source = {{ registry = "https://pypi.org/simple" }}

[[package]]
name = "tqdm"
version = "4.70.1"
source = {{ registry = "https://pypi.org/simple" }}
{extra}"""
GREENLET = """
[[package]]
name = "greenlet"
version = "3.5.6"
source = { registry = "https://pypi.org/simple" }
"""
POSTGRES = "tests/test_tune.py::test_a_study_in_postgresql_is_shared_through_the_database"
JOURNAL = "tests/test_tune.py::test_two_workers_share_a_journal_study_and_it_resumes"
BROWSER = "tests/test_report.py::test_report_html_in_a_browser"

OPTUNA = Change("optuna", "5.0.0", "5.1.0")
SQLALCHEMY = Change("sqlalchemy", "2.0.24", "2.1.9")
GREENLET_GONE = Change("greenlet", "3.5.6", None)
CHANGES = [GREENLET_GONE, OPTUNA, SQLALCHEMY]


def test_two_resolutions_differ_by_the_packages_whose_versions_changed_came_or_went():
    """uv.lock against the newest resolution: every changed version, a package gone, the project (no version in a
    lock) left out; the same lock twice differs in nothing."""
    locked = check_latest.lock_versions(LOCK.format(optuna="5.0.0", sqlalchemy="2.0.24", extra=GREENLET))
    latest = check_latest.lock_versions(LOCK.format(optuna="5.1.0", sqlalchemy="2.1.9", extra=""))
    assert locked == {"optuna": "5.0.0", "sqlalchemy": "2.0.24", "tqdm": "4.70.1", "greenlet": "3.5.6"}
    changes = check_latest.diff_versions(locked, latest)
    assert changes == CHANGES
    assert check_latest.diff_versions(latest, locked)[0] == Change("greenlet", None, "3.5.6")
    assert check_latest.diff_versions(locked, dict(locked)) == []
    assert [str(c) for c in changes] == ["greenlet 3.5.6 -> (gone)", "optuna 5.0.0 -> 5.1.0",
                                         "sqlalchemy 2.0.24 -> 2.1.9"]
    assert check_latest.upgradable(changes) == [OPTUNA, SQLALCHEMY]  # greenlet goes with sqlalchemy's upgrade


def test_the_upgrade_that_alone_fails_a_test_is_named_and_the_rest_said_plainly():
    """optuna 5.1.0 alone (SQLAlchemy kept at 2.0.24) fails the PostgreSQL test: `broke: optuna ...`. The journal
    test fails with no single upgrade (both needed), and the browser test fails on uv.lock too: not drift."""
    trials = [Trial(OPTUNA, moved=[OPTUNA], rerun=Rerun(frozenset({POSTGRES}))),
              Trial(SQLALCHEMY, moved=[GREENLET_GONE, SQLALCHEMY], rerun=Rerun())]
    verdict = check_latest.name_breakers({POSTGRES, JOURNAL, BROWSER}, Rerun(frozenset({BROWSER})), trials)
    assert [(t.change, tests) for t, tests in verdict.broke] == [(OPTUNA, [POSTGRES])]
    assert check_latest.verdict_lines(verdict, CHANGES) == [
        f"broke: optuna 5.0.0 -> 5.1.0: {POSTGRES}",
        f"no single upgrade fails {JOURNAL}: it needs several of them together (greenlet 3.5.6 -> (gone), "
        "optuna 5.0.0 -> 5.1.0, sqlalchemy 2.0.24 -> 2.1.9)",
        f"fails on uv.lock too (not drift; `make test` shows it): {BROWSER}"]


def test_what_moved_with_an_upgrade_is_named_beside_it():
    """An upgrade that needs another (sqlalchemy 2.1 drops greenlet) names both; two upgrades that fail the same
    test are both named."""
    trials = [Trial(OPTUNA, moved=[OPTUNA], rerun=Rerun(frozenset({POSTGRES}))),
              Trial(SQLALCHEMY, moved=[GREENLET_GONE, SQLALCHEMY], rerun=Rerun(frozenset({POSTGRES})))]
    lines = check_latest.verdict_lines(check_latest.name_breakers({POSTGRES}, Rerun(), trials), CHANGES)
    assert lines == [f"broke: optuna 5.0.0 -> 5.1.0: {POSTGRES}",
                     f"broke: sqlalchemy 2.0.24 -> 2.1.9 (with greenlet 3.5.6 -> (gone)): {POSTGRES}"]


def test_a_skipped_re_run_is_no_pass_and_an_untried_upgrade_is_said():
    """A test skipped on uv.lock (e.g. no PostgreSQL can start) gets no verdict, and neither does one that an
    upgrade skipped and none failed: neither is said to need several upgrades. An upgrade uv could not lock alone
    is named with uv's reason, its (empty) re-run not counted as a pass."""
    skipped = Rerun(skipped=frozenset({POSTGRES}))
    verdict = check_latest.name_breakers({POSTGRES}, skipped, [Trial(OPTUNA, moved=[OPTUNA], rerun=Rerun())])
    assert (verdict.broke, verdict.together, verdict.unjudged) == ([], [], [POSTGRES])
    trials = [Trial(OPTUNA, moved=[OPTUNA], rerun=skipped), Trial(SQLALCHEMY, error="uv: no solution")]
    verdict = check_latest.name_breakers({POSTGRES}, Rerun(), trials)
    assert check_latest.verdict_lines(verdict, CHANGES) == [
        f"no verdict (skipped when re-run; the logs say why): {POSTGRES}",
        "not tried alone: sqlalchemy 2.0.24 -> 2.1.9: uv: no solution"]
    assert check_latest.outcome(skipped, {POSTGRES, JOURNAL}) == "skips 1, passes 1 of 2"


def test_the_commands_are_makes_install_and_test_in_another_venv():
    """The extras are the Makefile's; the install is its `uv sync` (--frozen on a lock just made, bytecode compiled,
    the project from the checkout, editable); pytest is `make test`'s with the user's arguments last, and without
    the one test that checks the environment *is* uv.lock."""
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as handle:
        extras = check_latest.makefile_extras(handle.read())
    assert extras == ["--extra", "test"]
    assert check_latest.sync_command("uv", extras) == [
        "uv", "sync", "--frozen", "--extra", "test", "--compile-bytecode", "--no-install-project", "--quiet"]
    assert check_latest.editable_command("uv", "/v/bin/python")[-2:] == ["-e", REPO]
    assert check_latest.lock_command("uv") == ["uv", "lock", "--quiet"]
    assert check_latest.lock_command("uv", OPTUNA) == ["uv", "lock", "--quiet", "--upgrade-package", "optuna==5.1.0"]
    command = check_latest.pytest_command("/v/bin/python", ["tests/test_tune.py", "-k", "postgres"], "/c")
    assert command[:3] == ["/v/bin/python", "-m", "pytest"] and command[-3:] == ["tests/test_tune.py", "-k", "postgres"]
    assert "cache_dir=/c" in command and "tests/test_environment.py::test_the_environment_is_the_lock" in command
    with pytest.raises(check_latest.UserError, match="EXTRAS"):
        check_latest.makefile_extras("test:\n\tpytest\n")


def test_pytest_arguments_pass_through():
    options, rest = check_latest.parse_args(["tests/test_tune.py", "-k", "postgres", "--lock", "old.lock", "-x"])
    assert options.lock == "old.lock" and rest == ["tests/test_tune.py", "-k", "postgres", "-x"]
    assert check_latest.parse_args(["--", "--lock", "y"])[1] == ["--lock", "y"]


def test_the_failed_and_skipped_tests_are_read_from_pytests_own_records(tmp_path):
    """lastfailed (pytest's cache) names the failures, a file that failed to collect included; the JUnit XML
    report (xunit1) the skipped tests, a class's and a parametrized one's node ids whole."""
    (tmp_path / "v" / "cache").mkdir(parents=True)
    (tmp_path / "v" / "cache" / "lastfailed").write_text(json.dumps({POSTGRES: True, "tests/test_x.py": True}))
    assert check_latest.failed_tests(str(tmp_path)) == {POSTGRES, "tests/test_x.py"}
    assert check_latest.failed_tests(str(tmp_path / "none")) == set()
    xml = ('<testsuites><testsuite>'
           '<testcase classname="tests.test_tune" name="test_a" file="tests/test_tune.py"><skipped/></testcase>'
           '<testcase classname="tests.test_tune.TestK" name="test_b[a b]" file="tests/test_tune.py"><skipped/>'
           '</testcase><testcase classname="tests.test_tune" name="test_c" file="tests/test_tune.py"><failure/>'
           '</testcase><testcase classname="tests.test_tune" name="test_d" file="tests/test_tune.py"/>'
           '</testsuite></testsuites>')
    assert check_latest.skipped_tests(xml) == {"tests/test_tune.py::test_a", "tests/test_tune.py::TestK::test_b[a b]"}


def test_no_network_is_one_line_and_exit_2(monkeypatch, capsys):
    """uv's own words for an unreachable index become one line naming it, exit 2, no traceback; the temporary
    project copy is gone."""
    failing = [sys.executable, "-c", "import sys; sys.stderr.write('error: Failed to fetch: `https://pypi.org/simple/"
               "optuna/`\\n  Caused by: dns error: failed to lookup address information\\n'); sys.exit(2)"]
    monkeypatch.setattr(check_latest, "lock_command", lambda uv, upgrade=None: failing)
    made = []
    real_mkdtemp = check_latest.tempfile.mkdtemp
    monkeypatch.setattr(check_latest.tempfile, "mkdtemp", lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])
    assert check_latest.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("check-latest: resolving the newest releases: cannot reach the package index (no network?)")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert made and not os.path.exists(made[0])


def test_a_missing_lock_is_one_line_and_exit_2(tmp_path, capsys):
    assert check_latest.main(["--lock", str(tmp_path / "nope.lock")]) == 2
    assert capsys.readouterr().err == f"check-latest: no lock at {tmp_path / 'nope.lock'}\n"


def test_uvs_other_errors_are_one_line(capsys):
    """uv's many-line 'no solution' tree becomes one line naming the command that explains it; another error is
    its first `error:` line."""
    def fails_with(stderr: str) -> str:
        command = [sys.executable, "-c", f"import sys; sys.stderr.write({stderr!r}); sys.exit(1)"]
        with pytest.raises(check_latest.UserError) as caught:
            check_latest.run_uv(command, REPO, "locking it alone")
        return str(caught.value)

    tree = "error: No solution found when resolving dependencies:\n  cause: Because all of:\n    mlflow>=3.4\n"
    assert fails_with(tree).startswith("locking it alone: uv finds no resolution (`uv -c ")
    assert fails_with("warning: x\nerror: unexpected argument '--bogus' found\n  tip: y\n").endswith(
        "failed: error: unexpected argument '--bogus' found")
