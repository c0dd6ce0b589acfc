"""`make check-latest`: the suite on the newest releases pyproject.toml allows, and which upgrade broke it.

Usage: python scripts/check_latest.py [--lock PATH] [--latest-lock PATH] [PYTEST_ARGS...]
       make check-latest [ARGS="tests/test_tune.py -k postgres"]

1. Resolves the newest releases that pyproject.toml allows, ignoring uv.lock: `uv lock` on a copy of the project
   without its lock, so every setting of [tool.uv] (the overrides, the environments, TensorFlow's dependency
   metadata, and whatever is added there later) applies exactly as it did when uv.lock was made.
2. Prints what differs from uv.lock (package: locked -> latest); if nothing does, says so and stops (exit 0).
3. Installs the resolution into .venv-latest as `make` installs the lock (`uv sync` with the Makefile's extras,
   bytecode compiled; the project editable from this checkout) and runs `python -m pytest PYTEST_ARGS` there, as
   `make test` does (pyproject's pytest settings).
4. If tests fail, re-runs them in a venv made from uv.lock (a temporary one), then with one changed package at a
   time upgraded to its latest version (`uv lock --upgrade-package NAME==VERSION` on a copy of uv.lock: it moves
   only what that version needs), and prints `broke: NAME OLD -> NEW: TEST ...` for each upgrade that alone fails
   them. Exit 1. Exit 2 for a problem before the suite ran (no network, uv's error, a bad argument).

See docs/testing.md, "Catching drift: make check-latest".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from typing import Iterable, Optional
from xml.etree import ElementTree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from dqn_cartpole.errors import UserError  # noqa: E402

LATEST_VENV = os.path.join(REPO, ".venv-latest")
LOGS = os.path.join(LATEST_VENV, "check-latest-logs")  # the re-runs' output, from the last run that made any
JUNIT = "junit.xml"
# What `uv lock` reads to lock the project: pyproject.toml, and what setuptools needs to build the project's metadata
# (its version is dynamic, read from dqn_cartpole/version.py; the readme is part of the metadata).
PROJECT_FILES = ("pyproject.toml", "README.md", "dqn_cartpole", "configs")
# Checks that the environment *is* uv.lock, false by design in .venv-latest: left out there.
LOCK_ONLY_TESTS = ("tests/test_environment.py::test_the_environment_is_the_lock",)
# uv's words when it cannot reach the index (no network, a proxy, DNS): the run stops with one line.
NETWORK_WORDS = ("Failed to fetch", "error sending request", "dns error", "Network connectivity is disabled",
                 "Could not connect", "tcp connect error", "operation timed out", "Connection refused")


@dataclass(frozen=True)
class Change:
    """One package whose version differs between two resolutions (None: not in that one)."""

    name: str
    locked: Optional[str]
    latest: Optional[str]

    def __str__(self) -> str:
        return f"{self.name} {self.locked or '(none)'} -> {self.latest or '(gone)'}"


@dataclass(frozen=True)
class Rerun:
    """Which of the re-run tests failed, and which were skipped (no verdict either way: e.g. no PostgreSQL)."""

    failed: frozenset = frozenset()
    skipped: frozenset = frozenset()


@dataclass
class Trial:
    """uv.lock with one package upgraded: what moved with it, and how the re-run tests went."""

    change: Change
    moved: list = field(default_factory=list)  # every Change against uv.lock, the upgraded package's included
    rerun: Rerun = Rerun()
    error: str = ""  # why it could not be tried (uv could not resolve or install it)


# --- reading and comparing resolutions --------------------------------------------------------------------------


def lock_versions(lock_text: str) -> dict:
    """name -> version of every package a uv.lock pins (the project itself, which has no version there, left out)."""
    packages = tomllib.loads(lock_text).get("package", [])
    return {p["name"]: p["version"] for p in packages if "version" in p}


def diff_versions(locked: dict, latest: dict) -> list:
    """The packages whose version differs, added or gone, by name."""
    names = sorted(set(locked) | set(latest))
    return [Change(n, locked.get(n), latest.get(n)) for n in names if locked.get(n) != latest.get(n)]


def upgradable(changes: Iterable[Change]) -> list:
    """The changes that can be tried one at a time: a package in both. One that appears or goes comes with another's
    upgrade, and is tried with it."""
    return [c for c in changes if c.locked and c.latest]


# --- naming the package that broke ------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What the failed tests say: the upgrades that break them alone, the rest, and those that fail on uv.lock too."""

    broke: list  # (Trial, sorted tests it fails)
    together: list  # tests that every single upgrade passes
    on_the_lock: list  # tests that fail on uv.lock as well: not drift
    unjudged: list  # tests skipped when re-run on uv.lock, or by an upgrade that fails none: no verdict
    untried: list  # trials that could not run


def name_breakers(latest_failed: set, lock: Rerun, trials: list) -> Verdict:
    """Which single upgrade reproduces which of the tests that failed on the latest resolution. A skipped test is
    no pass: a test that some upgrade skipped and none failed is not said to need several upgrades."""
    drift = latest_failed - lock.failed - lock.skipped
    broke, explained, unsure = [], set(), set()
    for trial in trials:
        if trial.error:
            continue
        hit = sorted(trial.rerun.failed & drift)
        if hit:
            broke.append((trial, hit))
            explained.update(hit)
        unsure.update(trial.rerun.skipped & drift)
    return Verdict(broke=broke, together=sorted(drift - explained - unsure),
                   on_the_lock=sorted(latest_failed & lock.failed),
                   unjudged=sorted((latest_failed & lock.skipped) | (unsure - explained)),
                   untried=[t for t in trials if t.error])


def verdict_lines(verdict: Verdict, changes: list) -> list:
    """The report's last lines: `broke: ...` per breaking upgrade, then what no single upgrade explains."""
    lines = []
    for trial, tests in verdict.broke:
        along = [str(m) for m in trial.moved if m.name != trial.change.name]
        with_ = f" (with {', '.join(along)})" if along else ""
        lines.append(f"broke: {trial.change}{with_}: {' '.join(tests)}")
    if verdict.together:
        lines.append(f"no single upgrade fails {' '.join(verdict.together)}: it needs several of them together "
                     f"({', '.join(str(c) for c in changes)})")
    if verdict.unjudged:
        lines.append(f"no verdict (skipped when re-run; the logs say why): {' '.join(verdict.unjudged)}")
    for trial in verdict.untried:
        lines.append(f"not tried alone: {trial.change}: {trial.error}")
    if verdict.on_the_lock:
        lines.append(f"fails on uv.lock too (not drift; `make test` shows it): {' '.join(verdict.on_the_lock)}")
    return lines


# --- the commands -----------------------------------------------------------------------------------------------


def makefile_extras(makefile_text: str) -> list:
    """The extras `make` installs: the Makefile's `EXTRAS := ...` line."""
    found = re.findall(r"^EXTRAS\s*:?=\s*(.*)$", makefile_text, re.M)
    if len(found) != 1:
        raise UserError("the Makefile has no single `EXTRAS := ...` line: cannot tell which extras `make` installs")
    return found[0].split()


def lock_command(uv: str, upgrade: Optional[Change] = None) -> list:
    """`uv lock` in a project copy: without a lock there, the newest releases; with uv.lock there and a change,
    uv.lock with that one package moved to its latest version (and what that version needs)."""
    command = [uv, "lock", "--quiet"]
    if upgrade is not None:
        command += ["--upgrade-package", f"{upgrade.name}=={upgrade.latest}"]
    return command


def sync_command(uv: str, extras: list) -> list:
    """`make`'s install (`uv sync --locked EXTRAS --compile-bytecode`) from a project copy's lock into the venv named
    by UV_PROJECT_ENVIRONMENT: --frozen as the lock was just made; the project comes from the checkout instead."""
    return [uv, "sync", "--frozen", *extras, "--compile-bytecode", "--no-install-project", "--quiet"]


def editable_command(uv: str, python: str) -> list:
    """The project, editable from this checkout, into the venv of `python` (its dependencies are already there)."""
    return [uv, "pip", "install", "--python", python, "--no-deps", "--compile-bytecode", "--quiet", "-e", REPO]


def pytest_command(python: str, args: list, cache_dir: str) -> list:
    """`make test`'s command in another venv, with a pytest cache of its own (its lastfailed names the failures)
    and a JUnit XML report in it (which names the skipped tests; xunit1 gives each test's file)."""
    deselect = [a for t in LOCK_ONLY_TESTS for a in ("--deselect", t)]
    report = ["--junitxml", os.path.join(cache_dir, JUNIT), "-o", "junit_family=xunit1"]
    return [python, "-m", "pytest", "-o", f"cache_dir={cache_dir}", *report, *deselect, *args]


def failed_tests(cache_dir: str) -> set:
    """The node ids pytest recorded as failed (or as a file that failed to collect) in its cache's lastfailed."""
    path = os.path.join(cache_dir, "v", "cache", "lastfailed")
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as handle:
        return set(json.load(handle))


def skipped_tests(junit_xml: str) -> set:
    """The node ids a pytest JUnit XML report (xunit1) marks as skipped."""
    skipped = set()
    for case in ElementTree.fromstring(junit_xml).iter("testcase"):
        path, name = case.get("file"), case.get("name")
        if case.find("skipped") is None or not path or not name:
            continue
        module, classname = path[:-len(".py")].replace("/", "."), case.get("classname", "")
        classes = classname[len(module) + 1:].split(".") if classname.startswith(module + ".") else []
        skipped.add("::".join([path, *classes, name]))
    return skipped


# --- running them -----------------------------------------------------------------------------------------------


def say(message: str) -> None:
    print(f"== check-latest: {message}", flush=True)


def find_uv() -> str:
    """The uv beside this interpreter (.venv/bin/uv, which `make` installs), else one on the PATH."""
    found = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")
    if found is None:
        raise UserError(f"no uv beside {sys.executable} or on the PATH: run `make install` first")
    return found


def uv_env(venv: Optional[str] = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    env["UV_PYTHON_DOWNLOADS"] = "never"  # as the Makefile: the venvs use this machine's Python 3.11
    if venv:
        env["UV_PROJECT_ENVIRONMENT"] = venv
    return env


def run_uv(command: list, cwd: str, what: str, venv: Optional[str] = None) -> None:
    """A uv command to its end; its failure is one line (the network's, or uv's own last error line)."""
    proc = subprocess.run(command, cwd=cwd, env=uv_env(venv), capture_output=True, text=True)
    if proc.returncode == 0:
        return
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    if any(word in proc.stderr for word in NETWORK_WORDS):
        raise UserError(f"{what}: cannot reach the package index (no network?): {lines[-1] if lines else ''}")
    shown = " ".join(arg for arg in command[1:] if arg != "--quiet")
    if "No solution found" in proc.stderr:  # uv's explanation is a tree of many lines: its command gives it
        raise UserError(f"{what}: uv finds no resolution (`uv {shown}` says why)")
    errors = [line for line in lines if line.startswith("error")] or lines[-1:]
    raise UserError(f"{what}: `uv {shown}` failed: {errors[0] if errors else f'exit {proc.returncode}'}")


def project_copy(folder: str, lock: Optional[str]) -> str:
    """The project's files in `folder`, with `lock` as its uv.lock (or none)."""
    for name in PROJECT_FILES:
        source = os.path.join(REPO, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(folder, name), symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, folder)
    if lock:
        shutil.copy2(lock, os.path.join(folder, "uv.lock"))
    return folder


def install(uv: str, project: str, venv: str, extras: list) -> None:
    """The project copy's lock into `venv` (made if missing, exact after), then the checkout editable."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        run_uv([uv, "venv", "--quiet", "--python", sys.executable, venv], REPO, "creating " + venv)
    run_uv(sync_command(uv, extras), project, "installing into " + venv, venv=venv)
    run_uv(editable_command(uv, python), REPO, "installing the project into " + venv)


def run_pytest(venv: str, args: list, cache_dir: str, log: Optional[str] = None) -> tuple:
    """`make test`'s pytest in `venv`: its exit status and a Rerun (failed and skipped tests). With `log`, its
    output goes there, not to the console."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SDL_AUDIODRIVER="dummy", VIRTUAL_ENV=venv, PATH=os.path.join(venv, "bin") + os.pathsep + env["PATH"])
    command = pytest_command(os.path.join(venv, "bin", "python"), args, cache_dir)
    if log is None:
        code = subprocess.run(command, cwd=REPO, env=env).returncode
    else:
        with open(log, "w", encoding="utf-8") as handle:
            code = subprocess.run(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code not in (0, 1):  # 2 interrupted, 3 internal error, 4 usage error, 5 no tests collected
        raise UserError(f"pytest could not run the tests in {venv} (exit {code}; pytest's arguments: {args})"
                        + (f": see {log}" if log else ""))
    report = os.path.join(cache_dir, JUNIT)
    skipped = skipped_tests(read(report)) if os.path.exists(report) else set()
    return code, Rerun(frozenset(failed_tests(cache_dir)), frozenset(skipped))


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def seconds(start: float) -> str:
    return f"{time.monotonic() - start:.0f} s"


def relative(path: str) -> str:
    return os.path.relpath(path, REPO) if path.startswith(REPO + os.sep) else path


def resolve_latest(uv: str, work: str, given: Optional[str] = None) -> str:
    """The newest releases pyproject.toml allows: `uv lock` in a copy of the project that has no uv.lock. With
    `given`, that resolution instead (in a copy of the project, for `uv sync`)."""
    folder = os.path.join(work, "latest")
    os.makedirs(folder)
    project_copy(folder, lock=given)
    if given is None:
        run_uv(lock_command(uv), folder, "resolving the newest releases")
    return os.path.join(folder, "uv.lock")


def try_alone(uv: str, work: str, lock: str, change: Change, failed: list, seen: dict, run: "Runner") -> Trial:
    """uv.lock with `change` alone, installed into the lock's venv, the failed tests re-run there."""
    trial = Trial(change)
    folder = os.path.join(work, "alone-" + change.name)
    os.makedirs(folder)
    try:
        run_uv(lock_command(uv, change), project_copy(folder, lock), "locking it alone")
        trial.moved = diff_versions(lock_versions(read(lock)), lock_versions(read(os.path.join(folder, "uv.lock"))))
        key = frozenset(trial.moved)
        if key in seen:  # the same set of versions as an upgrade already tried (one needs the other)
            trial.rerun = seen[key].rerun
        else:
            install(uv, folder, run.venv, run.extras)
            trial.rerun = run.tests(failed, "alone-" + change.name)
            seen[key] = trial
    except UserError as exc:
        trial.error = str(exc)
    return trial


@dataclass
class Runner:
    """Re-runs of the failed tests in one venv, each logged to a file of its own."""

    venv: str
    extras: list
    work: str
    logs: str

    def tests(self, node_ids: list, name: str) -> Rerun:
        log = os.path.join(self.logs, name + ".log")
        return run_pytest(self.venv, node_ids, os.path.join(self.work, "cache-" + name), log=log)[1]


def bisect(uv: str, work: str, lock: str, changes: list, latest_failed: set, extras: list) -> Verdict:
    """The failed tests re-run on uv.lock, then on uv.lock with each changed package upgraded alone."""
    os.makedirs(LOGS)
    run = Runner(os.path.join(work, "venv-lock"), extras, work, LOGS)
    start = time.monotonic()
    folder = os.path.join(work, "lock")
    os.makedirs(folder)
    install(uv, project_copy(folder, lock), run.venv, extras)
    on_lock = run.tests(sorted(latest_failed), "lock")
    say(f"on {relative(lock)} (a temporary venv): {outcome(on_lock, latest_failed)} ({seconds(start)})")
    drift = sorted(latest_failed - on_lock.failed - on_lock.skipped)
    trials, seen = [], {}
    for change in upgradable(changes) if drift else []:
        start = time.monotonic()
        trial = try_alone(uv, work, lock, change, drift, seen, run)
        trials.append(trial)
        result = f"not tried: {trial.error}" if trial.error else outcome(trial.rerun, set(drift))
        say(f"{change} alone: {result} ({seconds(start)})")
    say(f"the re-runs' output: {relative(LOGS)}/")
    return name_breakers(latest_failed, on_lock, trials)


def outcome(rerun: Rerun, tried: set) -> str:
    """`fails 1, skips 1 of 2`: the counts that are not zero."""
    failed, skipped = len(rerun.failed & tried), len(rerun.skipped & tried)
    counts = {"fails": failed, "skips": skipped, "passes": len(tried) - failed - skipped}
    return ", ".join(f"{word} {n}" for word, n in counts.items() if n) + f" of {len(tried)}"


def check(lock: str, pytest_args: list, given: Optional[str] = None) -> int:
    """The whole check; its exit status. `given`: a resolution to check instead of the newest."""
    uv, extras = find_uv(), makefile_extras(read(os.path.join(REPO, "Makefile")))
    for path in (lock, given):
        if path is not None and not os.path.isfile(path):
            raise UserError(f"no lock at {path}")
    work = tempfile.mkdtemp(prefix="check-latest-")
    os.chmod(work, 0o755)  # the tests run PostgreSQL from the venv in here as `nobody` when run as root
    try:
        start = time.monotonic()
        if given is None:
            say("resolving the newest releases pyproject.toml allows ([tool.uv] applied, uv.lock ignored)")
        else:
            say(f"checking {given} instead of the newest releases")
        latest = resolve_latest(uv, work, given)
        locked_versions, latest_versions = lock_versions(read(lock)), lock_versions(read(latest))
        changes = diff_versions(locked_versions, latest_versions)
        if not changes:
            newest = "" if given else f": its {len(locked_versions)} packages are the newest pyproject.toml allows"
            say(f"nothing differs from {relative(lock)}{newest} ({seconds(start)})")
            return 0
        say(f"{len(changes)} of {len(latest_versions)} packages differ from {relative(lock)} ({seconds(start)}):")
        for change in changes:
            print(f"   {change.name}: {change.locked or '(none)'} -> {change.latest or '(gone)'}")
        return suite_on_latest(uv, work, lock, latest, changes, extras, pytest_args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def suite_on_latest(uv: str, work: str, lock: str, latest: str, changes: list, extras: list,
                    pytest_args: list) -> int:
    """Install the latest resolution into .venv-latest, run the suite there, and on a failure find its cause."""
    start = time.monotonic()
    say(f"installing it into {relative(LATEST_VENV)} (uv sync {' '.join(extras)} --compile-bytecode, "
        "the project editable)")
    install(uv, os.path.dirname(latest), LATEST_VENV, extras)
    shutil.rmtree(LOGS, ignore_errors=True)  # an earlier run's, about another resolution
    shutil.copy2(latest, os.path.join(LATEST_VENV, "uv.lock"))  # the resolution tried, for a look after
    say(f"installed in {seconds(start)}; its lock: {relative(LATEST_VENV)}/uv.lock")
    start = time.monotonic()
    shown = " ".join(pytest_args) or "(the whole suite)"
    say(f"the suite in {relative(LATEST_VENV)}: python -m pytest {shown} (without {', '.join(LOCK_ONLY_TESTS)})")
    code, rerun = run_pytest(LATEST_VENV, pytest_args, os.path.join(work, "cache-latest"))
    failed = set(rerun.failed)
    if code == 0:
        say(f"green: the suite passes on the newest releases ({seconds(start)}). To re-lock: `uv lock --upgrade`, "
            "then `make test` (docs/testing.md)")
        return 0
    if not failed:
        say(f"pytest failed (exit {code}) but recorded no failed test ({seconds(start)})")
        return 1
    say(f"{len(failed)} failed on the newest releases ({seconds(start)}); re-running them on uv.lock, "
        f"then with each of the {len(upgradable(changes))} upgrades alone")
    verdict = bisect(uv, work, lock, changes, failed, extras)
    for line in verdict_lines(verdict, changes):
        print(line, flush=True)
    return 1


def parse_args(argv: Optional[list]) -> tuple:
    parser = argparse.ArgumentParser(
        prog="check_latest.py", allow_abbrev=False,
        description="Run the suite on the newest releases pyproject.toml allows, and name the upgrade that broke "
                    "it. Every other argument goes to pytest (e.g. tests/test_tune.py -k postgres).")
    parser.add_argument("--lock", default=os.path.join(REPO, "uv.lock"),
                        help="the lock to compare with and to bisect from (default: uv.lock)")
    parser.add_argument("--latest-lock", metavar="PATH",
                        help="check this resolution instead of resolving the newest releases (to replay a drift, "
                             "or to try a lock made elsewhere)")
    options, rest = parser.parse_known_args(argv)
    if "--" in rest:  # `check_latest.py --lock L -- -k x`: what follows `--` is pytest's
        rest.remove("--")
    return options, rest


def main(argv: Optional[list] = None) -> int:
    options, pytest_args = parse_args(argv)
    try:
        given = os.path.abspath(options.latest_lock) if options.latest_lock else None
        return check(os.path.abspath(options.lock), pytest_args, given)
    except UserError as exc:
        print(f"check-latest: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("check-latest: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
