"""`sweep`: every (grid point, seed) pair is an ordinary run folder under <output.root>/sweeps/NAME/, trained N at a
time on an executor (`executor.LocalSlots` here, `executor.RayActors` with --ray); the same command continues it, and
one with the same name but another grid is refused (docs/experiments.md, 'sweep: a grid x seeds').

With --population each grid point's seeds train as one population (`run_folder.population`: K seeds in one process,
one batched graph): the sweep writes the point's population folder, population__<point>/, whose manifest names the
point's member folders, and submits `train --resume` of it as one request; the members stay the ordinary folders
<point>__s<seed> (docs/experiments.md, 'Many seeds: a population sweep')."""

from __future__ import annotations

import datetime as dt
import os
import signal
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

import yaml

from dqn_cartpole.config import Override, override_source
from dqn_cartpole.console import exit_status
from dqn_cartpole.console.signals import STOP_CHILDREN, StopRequest
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import grid, ray_transfer
from dqn_cartpole.experiments.executor import (MEMORY_PER_RUN_MB, POLL_S, Ended, LocalSlots, RayActors, RunRequest,
                                               describe_node)
from dqn_cartpole.experiments.sweep_progress import SweepProgress
from dqn_cartpole.experiments.tracking_group import group_overrides
from dqn_cartpole.tracking.send import check_installed
from dqn_cartpole.processes.commands import continue_command, set_flags
from dqn_cartpole.run_folder import layout, population as population_folder, read_run
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.csv_files import dict_rows, read_csv, write_csv_atomic

MANIFEST_FILE = "sweep.yaml"
MEMBERS_FILE = "members.csv"  # one row per member, shown on the sweep's report.html
LOGS_DIR = "logs"
POPULATION_PREFIX = "population__"  # a point's population folder: population__<point label>, beside its members
POPULATION_MEMORY_MB = 2 * MEMORY_PER_RUN_MB  # issue 51's bound on a population's peak memory, as one seed's x2


@dataclass(frozen=True)
class Member:
    """One (grid point, seed) run of the sweep."""

    name: str  # folder name, e.g. "learning_rate=0.002__s3"
    run_dir: str
    overrides: tuple  # the point's overrides plus training.seed
    num_iterations: int
    train_steps_per_iteration: int


@dataclass(frozen=True)
class Population:
    """One grid point's seeds trained as one population (`sweep --population`)."""

    name: str  # its folder's and its request's name, e.g. "population__learning_rate=0.002"
    folder: str
    config: dict  # the point's resolved config, `training.seed` its first seed's
    seeds: tuple
    members: tuple  # its Members, in the seeds' order


@dataclass(frozen=True)
class SweepPlan:
    """Everything a sweep will do, checked before any process starts."""

    name: str
    folder: str
    config_path: str
    manifest: dict
    members: tuple
    jobs: Optional[int]  # runs at a time (on Ray, None: one per CPU of the cluster)
    runner: tuple = ()  # where the runs go, as the continue command says it: () here, ("--ray", ...) on Ray
    populations: tuple = ()  # with --population: one Population per grid point (jobs: populations at a time)

    @property
    def population(self) -> bool:
        return bool(self.manifest.get("population"))

    @property
    def logs(self) -> str:
        return os.path.join(self.folder, LOGS_DIR)

    def continue_command(self) -> str:
        m = self.manifest
        argv = ["sweep", "--config", m["config"], "--seeds", ",".join(str(s) for s in m["seeds"]),
                *(["--population"] if self.population else []), "--name", self.name,
                *(["--jobs", str(self.jobs)] if self.jobs is not None else []), *self.runner]
        for axis in m["grid"]:
            argv += ["--grid", axis]
        return continue_command(argv + set_flags(m["set"]))


@dataclass
class Outcome:
    """How the members of one sweep command ended."""

    done: list = field(default_factory=list)  # names of members that were already finished
    ok: list = field(default_factory=list)
    failed: list = field(default_factory=list)  # (name, exit status, last error line, log path)
    stopped_by: Optional[int] = None


# ---------------------------------------------------------------------------- planning


def plan_sweep(config_path: str, seeds_text: str, grid_texts: Sequence[str], overrides: Sequence[Override],
               jobs: Optional[int], name: Optional[str], population: bool = False) -> SweepPlan:
    """Parses and checks the whole sweep; raises UserError (one line) on any bad input. An override is a `--set`
    item or a `Flagged` one (the Python API's, whose errors name the argument as it was written). `population`: each
    grid point's seeds as one population (a config a population cannot run is refused, naming its key)."""
    seeds = grid.parse_seeds(seeds_text)
    points = grid.expand([grid.parse_axis(text) for text in grid_texts])
    for item, where in map(override_source, overrides):
        if item.split("=", 1)[0].strip() == grid.SEED_KEY:
            raise UserError(f"{where}: give seeds with " + ("--seeds" if where.startswith("--set") else "seeds="))
    if not seeds or not points:
        raise UserError("the sweep is empty: give at least one seed and one value per --grid key")
    if jobs is not None and jobs <= 0:
        raise UserError(f"--jobs: must be positive, got {jobs}")
    configs = grid.check_configs(config_path, [[*overrides, *point.overrides] for point in points], population)
    grid.first_error(configs)
    check_installed((configs[0].get("tracking") or {}).get("backend"))  # each run would refuse it: refused here
    name = name or f"{os.path.splitext(os.path.basename(config_path))[0]}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    if not name or "/" in name or name in (".", ".."):
        raise UserError(f"--name {name!r}: must be a plain folder name")
    folder = os.path.join(configs[0]["output"]["root"], "sweeps", name)
    members = []
    for point, config in zip(points, configs):
        for seed in seeds:
            member_name = f"{point.label}__s{seed}"
            members.append(Member(member_name, os.path.join(folder, member_name),
                                  (*point.overrides, f"{grid.SEED_KEY}={seed}",
                                   *group_overrides(config.get("tracking") or {}, name)),
                                  config["training"]["num_iterations"],
                                  config["training"]["train_steps_per_iteration"]))
    manifest = {"config": os.path.abspath(config_path), "seeds": seeds, "grid": list(grid_texts),
                "set": [override_source(o)[0] for o in overrides], "members": [m.name for m in members],
                **({"population": True} if population else {})}  # absent without: earlier sweeps' manifests match
    _check_manifest(folder, manifest)
    populations = plan_populations(folder, points, configs, seeds, members) if population else ()
    return SweepPlan(name, folder, os.path.abspath(config_path), manifest, tuple(members),
                     jobs or (default_jobs(len(populations), POPULATION_MEMORY_MB) if population
                              else default_jobs(len(members))), populations=populations)


def plan_populations(folder: str, points: Sequence[grid.Point], configs: Sequence[dict], seeds: Sequence[int],
                     members: Sequence[Member]) -> tuple:
    """One Population per grid point (`members` are the points' seeds in order, as `plan_sweep` makes them)."""
    populations = []
    for index, (point, config) in enumerate(zip(points, configs)):
        own = tuple(members[index * len(seeds):(index + 1) * len(seeds)])
        name = f"{POPULATION_PREFIX}{point.label}"
        populations.append(Population(name, os.path.join(folder, name),
                                      {**config, "training": {**config["training"], "seed": seeds[0]}},
                                      tuple(seeds), own))
    return tuple(populations)


def default_jobs(members: int, memory_mb: int = MEMORY_PER_RUN_MB) -> int:
    """What the machine can take: one run (or population) per core, capped by available memory at `memory_mb`
    each."""
    import psutil

    by_memory = int(psutil.virtual_memory().available // (memory_mb * 2**20))
    return max(1, min(os.cpu_count() or 1, by_memory, members))


def _check_manifest(folder: str, manifest: dict) -> None:
    path = os.path.join(folder, MANIFEST_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            earlier = yaml.safe_load(handle) or {}
        keys = list(dict.fromkeys([*manifest, "population"]))  # a sweep without --population writes no such key
        changed = ", ".join(k for k in keys if earlier.get(k) != manifest.get(k))
        if changed:
            raise UserError(f"{folder}: holds a sweep that asked for something else ({changed} differ); "
                            f"continue it with its own arguments (see {path}) or choose another --name")
    elif os.path.isdir(folder) and os.listdir(folder):
        raise UserError(f"{folder}: exists and is not a sweep (no {MANIFEST_FILE}); choose another --name")


def write_manifest(plan: SweepPlan) -> None:
    path = os.path.join(plan.folder, MANIFEST_FILE)
    if os.path.isfile(path):
        return
    data = {"name": plan.name, **plan.manifest, "created": dt.datetime.now().isoformat(timespec="seconds"),
            "command": plan.continue_command()}
    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))


def write_populations(plan: SweepPlan) -> None:
    """Each point's population folder with its manifest (`train --resume` of it starts the population from
    iteration 0); one that has its manifest already keeps it, with whatever the population wrote beside it."""
    for pop in plan.populations:
        if not population_folder.is_population(pop.folder):
            population_folder.write_manifest(pop.folder, pop.config, pop.seeds, [m.run_dir for m in pop.members],
                                             video_seeds=pop.seeds[:1], command=plan.continue_command())


def member_state(member: Member) -> str:
    """'done' (finished or diverged: never re-run), 'resume' (stopped or crashed) or 'new'."""
    if not os.path.isdir(member.run_dir) or not os.listdir(member.run_dir):
        return "new"
    if not os.path.isfile(os.path.join(member.run_dir, layout.CONFIG_FILE)):
        return "broken"
    status = read_run(member.run_dir).get("exit_status")
    return "done" if status in (exit_status.EXIT_OK, exit_status.EXIT_FAILED) else "resume"


# ---------------------------------------------------------------------------- running


def run_sweep(plan: SweepPlan, show_progress: bool = True, executor=None) -> Outcome:
    """Runs every unfinished member on `executor` (default: here, `plan.jobs` at a time); stops them all on
    SIGINT/SIGTERM."""
    os.makedirs(plan.folder, exist_ok=True)
    write_manifest(plan)
    write_populations(plan)
    ray_transfer.clear_staging(plan.folder)  # what an interrupted `sweep --ray` left half-received
    return SweepDriver(plan, executor or LocalSlots(plan.jobs, plan.logs), show_progress).run()


class SweepDriver:
    """One sweep command: submits the members while the executor has room, follows them, says how each ended. Here
    the progress is a bar of iterations; on Ray a count of runs, with a line for each run started, finished, lost or
    failed (`sweep_progress`)."""

    def __init__(self, plan: SweepPlan, executor, show_progress: bool) -> None:
        self.plan, self.executor, self.outcome = plan, executor, Outcome()
        self.members = {m.name: m for m in plan.members}
        self.populations = {p.name: p for p in plan.populations}
        self.on_ray = isinstance(executor, RayActors)
        self.where: dict = {}  # member name -> node it runs on (on Ray)
        if self.on_ray:
            self.progress = SweepProgress(f"sweep {plan.name}", len(plan.members), "runs", show_progress)
        else:
            self.progress = _progress_bar(plan, show_progress)

    def run(self) -> Outcome:
        queue, executor = self._queue(), self.executor
        with StopRequest(STOP_CHILDREN, second_signal_interrupts=False) as stop:
            try:
                while (queue or executor.busy()) and not stop.requested:
                    while queue and executor.room() > 0 and not stop.requested:
                        executor.submit(queue.pop(0))
                    self._handle(executor.step(POLL_S))
            finally:  # a signal, or an error in this loop: no run outlives the sweep
                self.outcome.stopped_by = stop.signum
                if executor.busy():
                    self._handle(executor.stop_all(stop.signum or signal.SIGTERM))
                executor.close()
        self._update()
        self.progress.close()
        write_page(self.plan)
        return self.outcome

    def _queue(self) -> list:
        """The requests to submit: each unfinished member's run, or (--population) each point's population that has
        an unfinished member (it skips its finished members itself)."""
        states = {}
        for member in self.plan.members:
            state = states[member.name] = member_state(member)
            if state == "done":
                self.outcome.done.append(member.name)
            elif state == "broken":
                self.outcome.failed.append((member.name, None, "holds files but no config.yaml; move it away",
                                            member.run_dir))
        self._update()
        if self.plan.population:
            return [RunRequest(pop.name, pop.folder, self._log(pop.name), self.plan.config_path, resume=True,
                               reuse=False)
                    for pop in self.plan.populations
                    if {states[m.name] for m in pop.members} & {"new", "resume"}
                    and "broken" not in {states[m.name] for m in pop.members}]
        return [RunRequest(member.name, member.run_dir, self._log(member.name), self.plan.config_path,
                           (*self.plan.manifest["set"], *member.overrides), resume=states[member.name] == "resume")
                for member in self.plan.members if states[member.name] in ("new", "resume")]

    def _log(self, key: str) -> str:
        return os.path.join(self.plan.logs, f"{key}.log")

    # -- events
    def _handle(self, events: list) -> None:
        for event in events:
            kind, key = event[0], event[1]
            if kind == "started" and event[3] is not None:
                node = describe_node(event[3])
                self.where[key] = node
                attempt = f" (attempt {event[2]})" if event[2] > 1 else ""
                self._event(f"{key}: started on {node}{attempt}")
            elif kind == "lost":
                self.where.pop(key, None)
                again = "; running it again on another node" if event[4] else ""
                self._event(f"{key}: lost with {describe_node(event[2])} ({event[3]}){again}", always=True)
            elif kind == "landed":
                self.where.pop(key, None)
                if key in self.populations:
                    self._landed_population(self.populations[key], event[2])
                else:
                    self._landed(self.members[key], event[2])
        self._update()

    def _landed(self, member: Member, ended: Ended) -> None:
        status, node = ended.status, describe_node(ended.node)
        if status is None and ended.cancelled:
            if ended.node is not None:
                self._event(f"{member.name}: stopped on {node} without sending its folder back in time; it starts "
                            f"again next time", always=True)
        elif status == exit_status.EXIT_OK:
            self.outcome.ok.append(member.name)
            self._event(f"{member.name}: finished on {node} in {ended.run_s:.1f} s")
        elif self.outcome.stopped_by is not None and status is not None and exit_status.is_stop(status):
            self._event(f"{member.name}: stopped on {node}, checkpoint saved")
        else:
            self.outcome.failed.append((member.name, status, ended.error, ended.log_path))
            self._event(f"{member.name}: failed (exit {status}): {ended.error or '?'}  [log: {ended.log_path}]",
                        always=True)

    def _landed_population(self, pop: Population, ended: Ended) -> None:
        """Each member of a population that ended, as its own summary.json says: finished, failed (diverged, or the
        population's own error when the member has no final summary), or stopped with the population."""
        for member in pop.members:
            if member.name in self.outcome.done:
                continue  # finished before this command: the population skipped it
            summary = read_summary(member.run_dir)
            status = summary.get("exit_status")
            if status == exit_status.EXIT_OK:
                self.outcome.ok.append(member.name)
            elif (self.outcome.stopped_by is not None and status is not None and exit_status.is_stop(status)
                  and ended.status is not None and exit_status.is_stop(ended.status)):
                continue  # stopped with the sweep, its checkpoint in the population's: it resumes next time
            elif status == exit_status.EXIT_FAILED and summary.get("diverged_at_iteration") is not None:
                self.outcome.failed.append((member.name, status, f"diverged at iteration "
                                            f"{summary['diverged_at_iteration']}", ended.log_path))
            else:
                self.outcome.failed.append((member.name, ended.status if status is None else status,
                                            ended.error or f"{pop.name} ended (exit {ended.status}) without "
                                                           f"finishing it", ended.log_path))

    def _event(self, text: str, always: bool = False) -> None:
        """A line above the progress (on Ray; here the summary says what failed)."""
        if self.on_ray:
            done = len(self.outcome.done) + len(self.outcome.ok)
            self.progress.event(f"[{done}/{len(self.plan.members)}] {text}", always)

    def _update(self) -> None:
        o = self.outcome
        if not self.on_ray:
            _update_bar(self.progress, self.plan, o)
            return
        where = ", ".join(f"{node}: {n}" for node, n in sorted(Counter(self.where.values()).items()))
        note = (f"{len(self.where)} running{f' ({where})' if where else ''}, {len(o.failed)} failed, "
                f"{self.executor.transfers.retried} retried")
        self.progress.update(len(o.done) + len(o.ok), note)


def write_page(plan: SweepPlan) -> str:
    """The sweep's report.html: every member's state, outcome and a link to its own report."""
    from dqn_cartpole.report.html import render_collection_page

    rows = []
    for member in plan.members:
        summary = read_summary(member.run_dir)
        rows.append({"run": member.name, "state": member_state(member),
                     "solved at env steps": summary.get("solved_env_steps", ""),
                     "best return": summary.get("best_return", ""), "final return": summary.get("final_return", ""),
                     "wall s": round(summary["wall_s"], 1) if summary.get("wall_s") is not None else ""})
    table = os.path.join(plan.folder, MEMBERS_FILE)
    write_csv_atomic(table, list(rows[0]), dict_rows(list(rows[0]), rows))
    links = [(m.name, os.path.join(m.run_dir, layout.REPORT_FILE)) for m in plan.members]
    return render_collection_page(os.path.join(plan.folder, layout.REPORT_FILE), f"Sweep {plan.name}", [], table,
                                  links)


def read_summary(run_dir: str) -> dict:
    """A member's summary.json through the run-folder API ({} while it has none)."""
    try:
        return read_run(run_dir).summary
    except UserError:
        return {}


def _progress_bar(plan: SweepPlan, enabled: bool):
    from dqn_cartpole.console.progress import counter  # a tqdm bar on a terminal, plain lines in a log

    total = sum(m.num_iterations for m in plan.members)
    return counter(total, f"sweep {plan.name}", enabled, unit="it", dynamic_ncols=True, smoothing=0.1)


def _update_bar(bar, plan: SweepPlan, outcome: Outcome) -> None:
    """Iterations done over all members: finished ones count in full, running ones by their train log."""
    finished = set(outcome.done) | set(outcome.ok)
    done = 0
    for member in plan.members:
        if member.name in finished:
            done += member.num_iterations
            continue
        rows = read_csv(os.path.join(member.run_dir, layout.TRAIN_METRICS_FILE))
        if rows and rows[-1].get("train_step"):
            done += min(member.num_iterations, int(rows[-1]["train_step"]) // member.train_steps_per_iteration)
    bar.n = done
    bar.set_postfix_str(f"{len(finished)}/{len(plan.members)} runs done, {len(outcome.failed)} failed", refresh=False)
    bar.refresh()


def summary_lines(plan: SweepPlan, outcome: Outcome, wall_s: float, where: Optional[str] = None) -> list[str]:
    """The final report: counts, failures with their log, and how to continue or compare (`where` the runs ran,
    default: here, --jobs at a time)."""
    jobs = f"with --jobs {plan.jobs}" + (" (populations at a time)" if plan.population else "")
    count = len(plan.populations)
    runs = f"{len(plan.members)} runs" + (f" in {count} population{'s' if count != 1 else ''}" if plan.population else "")
    lines = [f"sweep {plan.name}: {runs} ({len(outcome.done)} already done, {len(outcome.ok)} finished now, "
             f"{len(outcome.failed)} failed) in {wall_s:.1f} s {where or jobs}; folder {plan.folder}"]
    for name, status, error, log in outcome.failed:
        lines.append(f"  failed {name} (exit {status}): {error or '?'}  [log: {log}]")
    if outcome.stopped_by is not None or outcome.failed:
        lines.append(f"Continue the sweep (finished runs are skipped, stopped ones resume) with:\n  "
                     f"{plan.continue_command()}")
    else:
        lines.append(f"Compare the runs with:\n  {continue_command(['compare', plan.folder])}")
    return lines
