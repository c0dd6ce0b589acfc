"""The `sweep`, `compare` and `tune` commands: their argparse definitions and handlers.

`cli/main.py` registers them with `add_parsers(subparsers)` and dispatches through `COMMANDS`. None of
these handlers imports TensorFlow: training happens in child processes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time

from dqn_cartpole.cli.shortcuts import add_shortcut_args, add_track_arg, shortcut_overrides
from dqn_cartpole.config import locate_config, locate_space
from dqn_cartpole.console.exit_status import EXIT_FAILED, EXIT_OK, for_signal


def add_parsers(sub) -> None:
    """Adds `sweep`, `compare` and `tune` to the CLI's subparsers."""
    sweep = sub.add_parser("sweep", help="train a grid of configs x seeds, several runs at a time",
                           description="Train every (grid point, seed) pair as its own run folder under "
                                       "<output.root>/sweeps/NAME/. Running the same command again continues the "
                                       "sweep: finished runs are skipped, stopped ones resume.")
    sweep.add_argument("--config", metavar="PATH", required=True,
                       help="YAML config every run starts from (or a shipped config's name)")
    sweep.add_argument("--seeds", default="0", help="seeds, e.g. 0-4 or 0,2,7 (default 0)")
    sweep.add_argument("--population", action="store_true",
                       help="train each grid point's seeds as one population: one process, one batched graph, "
                            "the same run folders (dqn and double_dqn on tf_uniform replay; not with --ray)")
    sweep.add_argument("--grid", metavar="SECTION.KEY=[V1,V2]", action="append", default=[],
                       help="a key and the values to try, e.g. agent.learning_rate=[1e-3,2e-3] (repeatable; "
                            "every combination is run)")
    sweep.add_argument("--set", metavar="SECTION.KEY=VALUE", action="append", default=[], dest="overrides",
                       help="override one config key for every run (repeatable)")
    add_shortcut_args(sweep, seed=False)  # --seeds says the seeds
    add_track_arg(sweep)
    sweep.add_argument("--jobs", type=int, help="runs at a time, or populations with --population (default: cores, "
                                                "capped at ~700 MB of free memory per run, 1400 MB per population; "
                                                "with --ray, one per CPU of the cluster)")
    add_ray_args(sweep, "run")
    sweep.add_argument("--name", help="sweep folder name (default: <config>-<time>); reuse it to continue")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")

    compare = sub.add_parser("compare", help="compare runs across seeds: plot and table with confidence intervals",
                             description="Group runs by the config keys that differ among the runs that read "
                                         "them (ignoring the seed and output keys), report each group across its "
                                         "seeds with 95%% stratified bootstrap confidence intervals (rliable), and "
                                         "say whether each group is better than the first, with the probability "
                                         "of improvement, or that its seeds cannot tell.")
    compare.add_argument("paths", metavar="PATH", nargs="+", help="run folders, sweep folders or globs")
    compare.add_argument("--output", metavar="DIR", help="where report.html, the plots, table.md and table.csv go "
                                                         "(default: outputs/compare/<name or time>)")
    compare.add_argument("--name", help="name of the default output folder")
    compare.add_argument("--statistic", choices=("iqm", "mean"), default="iqm",
                         help="the line drawn per group (default iqm: the mean of the middle 50%%)")

    tune = sub.add_parser("tune", help="search hyperparameters with Optuna (TPE + median pruning)",
                          description="Run an Optuna study: each trial is a training run folder under "
                                      "<output.root>/tune/NAME/trials/NNNN (NNNN/sSEED with --seeds). The "
                                      "objective (minimised, --objective) is the env steps, wall seconds or CPU "
                                      "seconds to a confirmed solve, averaged over --seeds (an unsolved run scores "
                                      "2 x its budget), or the final policy's return after the whole budget, "
                                      "negated.")
    tune.add_argument("--config", metavar="PATH", required=True,
                      help="YAML config every trial starts from (or a shipped config's name)")
    tune.add_argument("--space", metavar="SPACE.yaml", required=True, help="search space, one entry per config key")
    tune.add_argument("--trials", type=int, required=True, help="trials the study should hold in total")
    tune.add_argument("--jobs", type=int, help="trials at a time (default 1; with --ray, one per CPU of the cluster)")
    tune.add_argument("--storage", metavar="URL", help="postgresql://... or mysql://... to share the study between "
                                                       "machines, or a journal .log file (default: "
                                                       "<output.root>/tune/NAME/journal.log)")
    tune.add_argument("--study", metavar="NAME", help="study name (default: the config's file name)")
    tune.add_argument("--set", metavar="SECTION.KEY=VALUE", action="append", default=[], dest="overrides",
                      help="override one config key for every trial (repeatable)")
    tune.add_argument("--seed", type=int, help="seed of the TPE sampler (default: random)")
    tune.add_argument("--seeds", metavar="SEEDS",
                      help="train every trial on these seeds, e.g. 0-4 or 0,2,7, one after another; the trial "
                           "scores the mean of its seeds and may be pruned between them (default: the config's "
                           "training.seed, once)")
    tune.add_argument("--objective", choices=("env_steps", "wall_s", "cpu_s", "final_return"), default="env_steps",
                      help="what a trial minimises, to a confirmed solve: env_steps (default); wall_s, the run's "
                           "wall seconds from process start (run --jobs 1 on a quiet machine); cpu_s, its CPU "
                           "seconds (about the wall time of an idle machine, and steady when others share the "
                           "cores). An unsolved run scores twice its budget. Or after the whole budget: "
                           "final_return, the final policy's average return over fresh episodes, negated (needs "
                           "--set evaluation.stop_when_solved=false)")
    add_shortcut_args(tune, seed=False)  # its --seed is the sampler's
    add_track_arg(tune)
    add_ray_args(tune, "trial")


def add_ray_args(parser, what: str) -> None:
    parser.add_argument("--ray", action="store_true",
                        help=f"run each {what} on a Ray cluster, one per CPU: the cluster at --address, else "
                             f"RAY_ADDRESS, else the cluster `ray start` began on this machine, else a local Ray "
                             f"instance started for this command (needs the ray extra: "
                             f'pip install "dqn_cartpole[ray]")')
    parser.add_argument("--address", metavar="HOST:PORT",
                        help="the Ray cluster's head (with --ray), e.g. 10.0.0.1:6379 (default: RAY_ADDRESS, else "
                             "the cluster `ray start` began on this machine, else a private instance; local: always "
                             "a private instance)")


def ray_runner(args: argparse.Namespace, command: str) -> tuple:
    """Checks the Ray options before anything else (one line and exit 2: no Ray, a silent or malformed address);
    returns what the continue command adds: () without --ray."""
    from dqn_cartpole.errors import UserError

    if args.address is not None and not args.ray:
        raise UserError("--address: only with --ray")
    if not args.ray:
        return ()
    from dqn_cartpole.processes import ray_cluster

    ray_cluster.import_ray(f"{command} --ray")
    address = ray_cluster.cluster_address(args.address)
    flag = "--address" if args.address else "RAY_ADDRESS"
    if address is not None and address.startswith("ray://"):
        raise UserError(f"{flag} {address}: the Ray client (ray://) is not supported here; run the command on a node "
                        f"of the cluster (e.g. its head) with HOST:PORT")
    if address is not None and address != ray_cluster.LOCAL:
        ray_cluster.check_answers(address, RAY_CONNECT_TIMEOUT_S, flag)
    return ("--ray", "--address", args.address) if args.address else ("--ray",)


RAY_CONNECT_TIMEOUT_S = 10.0


def check_population_runner(population: bool, ray: bool, where: str = "--population") -> None:
    """A population on Ray is refused: an actor sends back the one folder it trained (the population's), and a
    sweep's population writes its members beside it. `where`: the argument as the caller wrote it."""
    from dqn_cartpole.errors import UserError

    if population and ray:
        raise UserError(f"{where}: not with Ray (a Ray worker sends back one run folder, and a population writes "
                        f"one per seed); run the population sweep on this machine")


def cmd_sweep(args: argparse.Namespace) -> int:
    from dqn_cartpole.experiments import sweep

    check_population_runner(args.population, args.ray)
    runner = ray_runner(args, "sweep")
    args.config = locate_config(args.config)  # a shipped config's name works from any folder, as with train
    overrides = shortcut_overrides(args) + args.overrides
    plan = sweep.plan_sweep(args.config, args.seeds, args.grid, overrides, args.jobs, args.name, args.population)
    outcome = run_planned_sweep(plan, args, runner)
    if outcome.stopped_by is not None:
        return for_signal(outcome.stopped_by)
    return EXIT_FAILED if outcome.failed else EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from dqn_cartpole.experiments import compare, compare_table

    runs = compare.load_runs(args.paths)
    folder = compare.output_folder(args.output, args.name)
    found = compare.compare(runs, folder, args.statistic)
    print(compare_table.terminal_report(found.rows, found.groups, found.verdicts))
    print(f"\npage: {found.page}")
    print(f"  beside it: {', '.join(compare.PLOTS)}, table.md, table.csv")
    return EXIT_OK


def cmd_tune(args: argparse.Namespace) -> int:
    from dqn_cartpole.experiments import tune

    runner = ray_runner(args, "tune")
    args.config, args.space = locate_config(args.config), locate_space(args.space)
    jobs = args.jobs if runner or args.jobs is not None else 1
    plan = tune.plan_tune(args.config, args.space, args.trials, jobs, args.storage, args.study,
                          shortcut_overrides(args, seed=False) + args.overrides, args.seed, args.seeds, args.objective)
    if runner:
        from dqn_cartpole.experiments.executor import RayActors

        with ray_cluster_session(args, "tune --ray") as (ray, _):
            return tune.run_tune(dataclasses.replace(plan, runner=runner), RayActors(ray, plan.jobs))
    return tune.run_tune(plan)


def run_planned_sweep(plan, args: argparse.Namespace, runner: tuple):
    """The sweep here, or (`runner`: `ray_runner`'s) on the Ray cluster; prints its summary (with what Ray added) and
    returns its outcome. A sweep with nothing left to run does not start or join Ray."""
    from dqn_cartpole.experiments import sweep
    from dqn_cartpole.experiments.executor import RayActors

    if not runner:
        start = time.time()
        outcome = sweep.run_sweep(plan, show_progress=not args.quiet)
        print("\n".join(sweep.summary_lines(plan, outcome, time.time() - start)))
        return outcome
    plan = dataclasses.replace(plan, jobs=args.jobs, runner=runner)
    if all(sweep.member_state(member) in ("done", "broken") for member in plan.members):
        start = time.time()
        outcome = sweep.run_sweep(plan, show_progress=not args.quiet)
        print("\n".join(sweep.summary_lines(plan, outcome, time.time() - start, "(nothing left for Ray to run)")))
        return outcome
    with ray_cluster_session(args, "sweep --ray") as (ray, joined):
        start = time.time()
        executor = RayActors(ray, plan.jobs)
        executor.transfers.cluster = joined
        outcome = sweep.run_sweep(plan, show_progress=not args.quiet, executor=executor)
        wall_s = time.time() - start
    where = f"on Ray ({'--jobs ' + str(plan.jobs) + ', ' if plan.jobs else ''}one run per CPU)"
    print("\n".join(sweep.summary_lines(plan, outcome, wall_s, where)))
    print(executor.transfers.line())
    return outcome


@contextlib.contextmanager
def ray_cluster_session(args: argparse.Namespace, what: str):
    """(the ray module, the line it printed: which cluster, how long joining or starting it took) for the block."""
    from dqn_cartpole.experiments.executor import check_cluster, cluster_errors_in_one_line
    from dqn_cartpole.processes import ray_cluster

    start = time.time()
    with ray_cluster.ray_session(args.address, RAY_CONNECT_TIMEOUT_S, what) as session, cluster_errors_in_one_line():
        import ray  # pylint: disable=import-outside-toplevel

        cluster = check_cluster(ray)
        nodes = f"{cluster['nodes']} node{'s' if cluster['nodes'] != 1 else ''}"
        hosts = ", ".join(cluster["hosts"])
        joined = f"{session.how} in {time.time() - start:.1f} s: {cluster['cpus']} CPUs on {nodes} ({hosts})"
        print(joined, flush=True)
        yield ray, joined


COMMANDS = {"sweep": cmd_sweep, "compare": cmd_compare, "tune": cmd_tune}
