"""`sweep --population`: each grid point's seeds trained as one population (one request, `train --resume POP`), its
members the sweep's ordinary run folders.

Planning, the population folders' manifests, what the driver makes of a population that ended and the refusals are
checked in this process, without TensorFlow: the configs are loaded here by the loader `grid.check_configs` runs in
its spawned process (`grid._load_all`), and the population's process is played by a scripted executor that writes
what a population leaves in its members' folders (config.yaml, summary.json). One test spawns the real check, one
trains a real population sweep of the smoke config through the CLI and compares it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal

import pytest
import yaml

from helpers import SMOKE, run_cli

from dqn_cartpole.cli.main import main
from dqn_cartpole.console.exit_status import EXIT_FAILED, EXIT_OK
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import grid, sweep
from dqn_cartpole.experiments.executor import Ended
from dqn_cartpole.run_folder import layout, population

GRID = ["agent.learning_rate=[0.001,0.002]"]
SPAWNED_CHECK = grid.check_configs


@pytest.fixture(autouse=True)
def configs_here(monkeypatch):
    """The configs checked in this process (the spawned check's own loader): these tests stay fast."""
    monkeypatch.setattr(grid, "check_configs",
                        lambda path, lists, population=False: grid._load_all(path, [list(o) for o in lists],
                                                                              population))


def plan(tmp_path, seeds="0-2", population_flag=True, grid_texts=GRID, extra=()):
    return sweep.plan_sweep(SMOKE, seeds, grid_texts, [f"output.root={tmp_path}", *extra], None, "pop",
                            population=population_flag)


class ScriptedPopulations:
    """An executor whose population requests end at once, each as `script(request)` says: it writes the members'
    folders as the population would and returns the exit status. `stop_at`: a SIGINT to this process once that many
    requests were submitted (the sweep stops every run as on Ctrl-C; `on_stop(request)` writes what a stopped
    population leaves)."""

    stop_wait_s = 1.0

    def __init__(self, script, stop_at=None, on_stop=None):
        self.script, self.stop_at, self.on_stop = script, stop_at, on_stop
        self.submitted, self.pending = [], []

    def room(self):
        return 1

    def busy(self):
        return bool(self.pending)

    def submit(self, request):
        self.submitted.append(request)
        self.pending.append(request)
        if self.stop_at is not None and len(self.submitted) == self.stop_at:
            os.kill(os.getpid(), signal.SIGINT)  # StopRequest turns it into the sweep's stop

    def step(self, timeout_s):
        if self.stop_at is not None:
            return [("started", r.key, 1, None) for r in self.pending]
        events = []
        for request in self.pending:
            events += [("started", request.key, 1, None),
                       ("landed", request.key, Ended(request.key, self.script(request), "", request.log_path))]
        self.pending = []
        return events

    def stop_all(self, signum):
        events = [("landed", r.key, Ended(r.key, self.on_stop(r), "", r.log_path)) for r in self.pending]
        self.pending = []
        return events

    def close(self):
        pass


def write_member(run_dir, status=None, **summary):
    """A member folder as a population leaves it: its config, and (once it ended) its summary."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, layout.CONFIG_FILE), "w", encoding="utf-8") as handle:
        yaml.safe_dump({"training": {"seed": 0}}, handle)
    if status is not None:
        with open(os.path.join(run_dir, layout.SUMMARY_FILE), "w", encoding="utf-8") as handle:
            json.dump({"version": 1, "exit_status": status, "diverged_at_iteration": None, **summary}, handle)


def members_of(request):
    return population.read_manifest(request.run_dir).members


# ---------------------------------------------------------------------------- planning and the folders


def test_each_grid_point_is_one_population_of_its_seeds(tmp_path):
    found = plan(tmp_path)
    folder = os.path.join(str(tmp_path), "sweeps", "pop")
    assert [p.name for p in found.populations] == ["population__learning_rate=0.001",
                                                   "population__learning_rate=0.002"]
    for pop, rate in zip(found.populations, (0.001, 0.002)):
        assert pop.folder == os.path.join(folder, pop.name) and pop.seeds == (0, 1, 2)
        label = pop.name.removeprefix(sweep.POPULATION_PREFIX)
        assert [m.run_dir for m in pop.members] == [os.path.join(folder, f"{label}__s{s}") for s in (0, 1, 2)]
        assert pop.config["agent"]["learning_rate"] == rate and pop.config["training"]["seed"] == 0
    assert found.manifest["population"] is True
    assert "--population" in found.continue_command().split()
    without = plan(tmp_path / "other", population_flag=False)
    assert without.populations == () and "population" not in without.manifest
    assert "--population" not in without.continue_command().split()


def test_the_first_seed_is_the_populations_seed(tmp_path):
    (pop,) = plan(tmp_path, seeds="3,5,9", grid_texts=[]).populations
    assert pop.name == "population__base" and pop.seeds == (3, 5, 9) and pop.config["training"]["seed"] == 3


def test_the_sweep_writes_each_points_manifest_and_submits_one_resume_of_it(tmp_path):
    found = plan(tmp_path)
    executor = ScriptedPopulations(lambda r: [write_member(m, EXIT_OK) for m in members_of(r)] and EXIT_OK)
    outcome = sweep.run_sweep(found, show_progress=False, executor=executor)
    assert [r.argv() for r in executor.submitted] == [["train", "--resume", p.folder, "--quiet"]
                                                      for p in found.populations]
    assert not any(r.reuse for r in executor.submitted)  # a population is a process of its own
    for pop in found.populations:
        manifest = population.read_manifest(pop.folder)
        assert manifest.members == tuple(m.run_dir for m in pop.members)
        assert manifest.seeds == (0, 1, 2) and manifest.video_seeds == (0,)
        assert manifest.config == pop.config
        with open(population.manifest_path(pop.folder), encoding="utf-8") as handle:
            assert yaml.safe_load(handle)["command"] == found.continue_command()
    assert sorted(outcome.ok) == sorted(m.name for m in found.members) and not outcome.failed
    with open(os.path.join(found.folder, sweep.MANIFEST_FILE), encoding="utf-8") as handle:
        written = yaml.safe_load(handle)
    assert written["population"] is True and "--population" in written["command"]
    assert os.path.isfile(os.path.join(found.folder, layout.REPORT_FILE))  # the sweep page, of the members
    with open(os.path.join(found.folder, sweep.MEMBERS_FILE), encoding="utf-8") as handle:
        assert not any(line.startswith(sweep.POPULATION_PREFIX) for line in handle)


def test_each_member_is_marked_from_its_own_summary(tmp_path):
    found = plan(tmp_path, grid_texts=[])

    def one_diverges_one_never_ends(request):
        ok, diverged, unfinished = members_of(request)
        write_member(ok, EXIT_OK)
        write_member(diverged, EXIT_FAILED, diverged_at_iteration=120)
        write_member(unfinished)
        return EXIT_FAILED

    outcome = sweep.run_sweep(found, show_progress=False, executor=ScriptedPopulations(one_diverges_one_never_ends))
    log = os.path.join(found.logs, "population__base.log")
    assert outcome.ok == ["base__s0"]
    assert outcome.failed == [("base__s1", EXIT_FAILED, "diverged at iteration 120", log),
                              ("base__s2", EXIT_FAILED, "population__base ended (exit 1) without finishing it", log)]
    lines = sweep.summary_lines(found, outcome, 1.0)
    assert "3 runs in 1 population (0 already done, 1 finished now, 2 failed)" in lines[0]
    assert any("--population" in line for line in lines)  # how to continue it


def test_finished_points_are_skipped_and_an_unfinished_one_runs_again_whole(tmp_path):
    found = plan(tmp_path)
    done_point, half_point = found.populations
    for member in done_point.members:
        write_member(member.run_dir, EXIT_OK)
    write_member(half_point.members[0].run_dir, EXIT_OK)
    write_member(half_point.members[1].run_dir, EXIT_FAILED, diverged_at_iteration=7)  # done: never re-run
    write_member(half_point.members[2].run_dir, 130)  # stopped: resumes
    executor = ScriptedPopulations(lambda r: write_member(members_of(r)[2], EXIT_OK) or EXIT_OK)
    outcome = sweep.run_sweep(found, show_progress=False, executor=executor)
    assert [r.key for r in executor.submitted] == [half_point.name]
    assert sorted(outcome.done) == sorted([m.name for m in done_point.members] + [m.name for m in
                                                                                  half_point.members[:2]])
    assert outcome.ok == [half_point.members[2].name] and not outcome.failed
    again = ScriptedPopulations(lambda r: pytest.fail("a finished sweep submitted " + r.key))
    assert len(sweep.run_sweep(found, show_progress=False, executor=again).done) == 6


def test_a_point_with_a_broken_member_is_not_started(tmp_path):
    found = plan(tmp_path, grid_texts=[])
    os.makedirs(found.members[1].run_dir)
    open(os.path.join(found.members[1].run_dir, "stray.txt"), "w").close()
    executor = ScriptedPopulations(lambda r: pytest.fail("submitted a population over a broken member"))
    outcome = sweep.run_sweep(found, show_progress=False, executor=executor)
    assert [f[0] for f in outcome.failed] == ["base__s1"] and "move it away" in outcome.failed[0][2]


def test_a_stopped_sweep_leaves_its_stopped_members_to_resume(tmp_path):
    found = plan(tmp_path, grid_texts=[])

    def stopped(request):
        first, *others = members_of(request)
        write_member(first, EXIT_OK)  # it solved before the stop
        for member in others:
            write_member(member, 130)
        return 130

    executor = ScriptedPopulations(None, stop_at=1, on_stop=stopped)
    with contextlib.redirect_stderr(io.StringIO()):
        outcome = sweep.run_sweep(found, show_progress=False, executor=executor)
    assert outcome.stopped_by == signal.SIGINT
    assert outcome.ok == ["base__s0"] and not outcome.failed
    assert [sweep.member_state(m) for m in found.members] == ["done", "resume", "resume"]


# ---------------------------------------------------------------------------- refusals


def test_switching_population_on_or_off_in_a_sweeps_folder_is_refused(tmp_path):
    sweep.write_manifest(plan(tmp_path, population_flag=False))
    with pytest.raises(UserError, match=r"asked for something else \(population differ\)"):
        plan(tmp_path)
    sweep.write_manifest(plan(tmp_path / "b"))
    with pytest.raises(UserError, match=r"asked for something else \(population differ\)"):
        plan(tmp_path / "b", population_flag=False)
    assert plan(tmp_path / "b").population  # the same command continues it


def _cli(*argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(list(argv))
    return status, [line for line in err.getvalue().splitlines() if line.strip()]


@pytest.mark.parametrize("extra, needle", [
    (("--set", "replay.sampling=dataset"), "error: --population: replay.sampling: dataset: a population samples "
                                           "directly"),
    (("--grid", "network.dueling=[false,true]"), "error: --population: network.dueling:"),  # its second point
    (("--ray",), "error: --population: not with Ray"),
])
def test_what_a_population_cannot_run_is_one_line_and_exit_2(tmp_path, extra, needle):
    status, lines = _cli("sweep", "--config", SMOKE, "--seeds", "0-2", "--population", "--name", "x",
                         "--set", f"output.root={tmp_path}/out", *extra)
    assert status == 2 and len(lines) == 1 and lines[0].startswith(needle), lines
    assert not os.path.exists(tmp_path / "out")


def test_the_python_apis_population_sweep_is_refused_on_ray_naming_its_argument(tmp_path):
    import dqn_cartpole as dq

    with pytest.raises(dq.UserError, match=r"^sweep\(population=True\): not with Ray"):
        dq.sweep(SMOKE, seeds="0-2", population=True, ray=True, overrides={"output.root": str(tmp_path)})
    assert not os.listdir(tmp_path)


def test_the_spawned_check_refuses_what_a_population_cannot_run():
    checked = SPAWNED_CHECK(SMOKE, [["network.noisy=true"], ["replay.backend=reverb"],
                                    ["env.num_envs=2", "training.collect_steps_per_iteration=2"],
                                    ["collection.driver=py"], ["agent.kind=double_dqn"]], population=True)
    assert [str(c).split(": ")[1] if isinstance(c, UserError) else c["agent"]["kind"] for c in checked] == [
        "network.noisy", "replay.backend", "env.num_envs", "collection.driver", "double_dqn"]
    assert not isinstance(SPAWNED_CHECK(SMOKE, [["network.noisy=true"]])[0], UserError)  # without it: fine


# ---------------------------------------------------------------------------- end to end


def test_a_population_sweep_of_the_smoke_config_trains_its_members_and_compare_reads_them(tmp_path):
    """Through the CLI: seeds 0-2 as one population, three finished member folders, compare reads the sweep folder
    (not the population folder beside them), and the same command again has nothing left to run."""
    from dqn_cartpole.experiments import compare

    argv = ("sweep", "--config", SMOKE, "--seeds", "0-2", "--population", "--name", "e2e", "--quiet",
            "--set", f"output.root={tmp_path}")
    first = run_cli(*argv, timeout=120)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "3 runs in 1 population (0 already done, 3 finished now, 0 failed)" in first.stdout
    folder = os.path.join(str(tmp_path), "sweeps", "e2e")
    members = [os.path.join(folder, f"base__s{seed}") for seed in (0, 1, 2)]
    assert population.read_manifest(os.path.join(folder, "population__base")).members == tuple(members)
    assert [sweep.read_summary(m).get("exit_status") for m in members] == [EXIT_OK] * 3
    runs = compare.load_runs([folder])
    assert sorted(r.root for r in runs) == members
    assert sorted(r.config["training"]["seed"] for r in runs) == [0, 1, 2]
    status, lines = _cli("compare", folder, "--output", str(tmp_path / "compare"))
    assert status == 0 and os.path.isfile(tmp_path / "compare" / "table.md"), lines
    log = os.path.join(folder, "logs", "population__base.log")
    size = os.path.getsize(log)
    again = run_cli(*argv, timeout=60)
    assert again.returncode == 0 and "(3 already done, 0 finished now, 0 failed)" in again.stdout, again.stderr
    assert os.path.getsize(log) == size  # no population started
