"""`train --population K`: K seeds (training.seed, +1, ... +K-1) of one config in one process, one batched graph,
each into an ordinary run folder (POP/s<seed>); `train --resume POP` continues it. Everything is checked before
TensorFlow is imported; bad input is one line, exit status 2, and touches no earlier run."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import os
import sys
from typing import Optional

from dqn_cartpole.cli.args import config_overrides, print_preset_note
from dqn_cartpole.config import MAX_SEED, dump_written, load, locate_config, population_problem, to_dict
from dqn_cartpole.console.exit_status import EXIT_FAILED
from dqn_cartpole.console.imports import heavy_imports
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments.grid import parse_seeds
from dqn_cartpole.processes.commands import resume_command
from dqn_cartpole.run_folder import checkpointing, population as population_folder, read_run
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.lock import lock_run
from dqn_cartpole.run_folder.resolve import create_run_dir, resolve_run_dir

MAX_POPULATION = 256  # seeds in one graph: memory grows with each seed's replay (about 2 MB per 50,000 steps)


def add_population_args(train: argparse.ArgumentParser) -> None:
    train.add_argument("--population", type=int, metavar="K", default=None,
                       help="train K seeds (training.seed and the K-1 after it) in one process as one batched graph, "
                            "each into its own run folder under --output-dir (docs/experiments.md)")
    train.add_argument("--video-seeds", metavar="SEEDS", default=None,
                       help="with --population: the seeds whose run folders get the videos, e.g. 0,3 or 0-15, or "
                            "none (default: the first seed)")


def check_population_args(args: argparse.Namespace) -> None:
    """Flags that only mean something with --population, and what it cannot take."""
    if args.population is None:
        if args.video_seeds is not None:
            raise UserError("--video-seeds: only with --population")
        return
    if args.population < 1 or args.population > MAX_POPULATION:
        raise UserError(f"--population: between 1 and {MAX_POPULATION} seeds, got {args.population}")
    if args.topology != "single":
        raise UserError(f"--population: trains in one process; it cannot take --topology {args.topology}")
    if args.resume:
        raise UserError("--population: a population continues with train --resume POP alone")


def cmd_train_population(args: argparse.Namespace) -> int:
    """A new population: checks everything, writes POP/population.yaml, trains."""
    check_population_args(args)
    with contextlib.redirect_stderr(io.StringIO()):  # gymnasium's import-time notices
        path = locate_config(args.config)
        loaded = load(path, config_overrides(args))
    config = loaded.config
    problem = population_problem(config)
    if problem is not None:
        raise UserError(f"--population: {problem}")
    first = config.training.seed
    if first + args.population - 1 > MAX_SEED:
        raise UserError(f"--population: seeds {first}..{first + args.population - 1} go past {MAX_SEED}")
    seeds = list(range(first, first + args.population))
    video_seeds = parse_video_seeds(args.video_seeds, seeds)
    folder = population_dir(config, args.population, args.output_dir, args.overwrite)
    created, lock = create_run_dir(folder, args.overwrite)
    print_preset_note(path, config)
    with contextlib.closing(lock):
        manifest = population_folder.write_manifest(folder, to_dict(config), seeds,
                                                    population_folder.default_members(folder, seeds), video_seeds,
                                                    resume_command(folder))
        for member in manifest.members:
            os.makedirs(member, exist_ok=True)
            write_text_atomic(RunLayout(member).written_config,
                              dump_written({**loaded.written, "training.seed": None}))
        progress = Progress(config.training.num_iterations, enabled=not args.quiet)
        progress.message(f"Training {config.env.id} with {os.path.basename(path)}: a population of {len(seeds)} seeds "
                         f"({seeds[0]}-{seeds[-1]}) in one graph -> {folder}")
        return run_population(manifest, progress, None)


def cmd_resume_population(args: argparse.Namespace) -> int:
    """`train --resume POP`: the population from its newest good checkpoint (or from the start)."""
    folder = args.resume
    for flag, given in (("--config", args.config), ("--output-dir", args.output_dir), ("--overwrite", args.overwrite),
                        ("--set", config_overrides(args))):
        if given:
            raise UserError(f"--resume {folder}: a population continues in its folder with its own config; "
                            f"drop {flag}")
    lock = lock_run(folder)
    with contextlib.closing(lock):
        manifest = population_folder.read_manifest(folder)
        if all(population_folder.member_finished(member) for member in manifest.members):
            print(f"The population {folder} has finished: every seed's run has ended; nothing to do.")
            print("\n".join(population_lines(manifest)))
            return 0
        plan = checkpointing.plan_resume(folder)
        for bad in plan.bad:
            print(f"warning: checkpoint {bad.path} is {bad.reason}", file=sys.stderr)
        progress = Progress(int(manifest.config["training"]["num_iterations"]), enabled=not args.quiet)
        start = os.path.basename(plan.found.path) if plan.found else "the beginning"
        progress.message(f"Resuming the population {folder} ({len(manifest.seeds)} seeds) from {start}")
        return run_population(manifest, progress, plan)


def run_population(manifest: population_folder.Manifest, progress: Progress,
                   plan: Optional[checkpointing.ResumePlan]) -> int:
    with heavy_imports():
        from dqn_cartpole.training.population import PopulationRun
    try:
        status = PopulationRun(manifest, progress, plan).run()
    except checkpointing.CheckpointError as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:  # pylint: disable=broad-except
        if not (isinstance(exc, checkpointing.DiskFullError) or checkpointing.is_disk_full(exc)):
            raise
        progress.close()
        print(f"error: disk full while training the population {manifest.folder} (no space left on device). "
              f"Free some space, then resume with: {resume_command(manifest.folder)}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        progress.close()
    print("\n".join(population_lines(manifest)))
    if status not in (0, 1):
        print(f"Stopped; the checkpoint is saved. Resume with:\n  {resume_command(manifest.folder)}")
    return status


def population_lines(manifest: population_folder.Manifest) -> list[str]:
    """The members' outcome, one line each, and the count solved."""
    lines, solved = [f"{'seed':>6}  {'solved at':>10}  {'env steps':>10}  {'policy/final':>12}  run folder"], 0
    for seed, member in zip(manifest.seeds, manifest.members):
        summary = read_run(member) if os.path.isfile(RunLayout(member).summary) else {}
        at = summary.get("solved_at_iteration")
        solved += at is not None
        final = ((summary.get("policies") or {}).get("final") or {}).get("average_return")
        lines.append(f"{seed:>6}  {'-' if at is None else at:>10}  {summary.get('solved_env_steps') or '-':>10}  "
                     f"{'-' if final is None else f'{final:.1f}':>12}  {member}")
    parents = {os.path.dirname(member) for member in manifest.members}
    where = parents.pop() if len(parents) == 1 else manifest.folder  # POP itself, or a sweep's folder
    lines.append(f"{solved}/{len(manifest.seeds)} seeds solved. Compare them: python -m dqn_cartpole compare {where}")
    return lines


def parse_video_seeds(text: Optional[str], seeds: list[int]) -> list[int]:
    if text is None:
        return seeds[:1]
    if text.strip().lower() == "none":
        return []
    chosen = parse_seeds(text)
    outside = [seed for seed in chosen if seed not in seeds]
    if outside:
        raise UserError(f"--video-seeds: {outside[0]} is not one of the population's seeds ({seeds[0]}-{seeds[-1]})")
    return chosen


def population_dir(config, size: int, output_dir: Optional[str], overwrite: bool) -> str:
    """POP: --output-dir, else output.root/output.run_name, else <env>__pop<K>__s<first>-<last>__<time>."""
    if output_dir is None and not config.output.run_name:
        first = config.training.seed
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        output_dir = os.path.join(config.output.root,
                                  f"{config.env.id}__pop{size}__s{first}-{first + size - 1}__{stamp}")
    return resolve_run_dir(config, output_dir, overwrite)
