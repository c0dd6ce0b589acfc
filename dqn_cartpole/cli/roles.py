"""The distributed roles as subcommands: replay-server, collect, evaluate-live, learn (and `train --topology local`).

Each reads the same YAML (`--config`, `--set`) plus `--replay-address HOST:PORT` and
`--run-dir`, checks its input first (one line, exit status 2), takes its hold on the run folder's lock
(`run_folder.lock`: a role never runs beside a `train` of the same folder), and only then imports
TensorFlow.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from typing import Any

from dqn_cartpole.cli.args import add_config_args
from dqn_cartpole.config import check_prioritized_across_processes, load_config, locate_config
from dqn_cartpole.console.imports import heavy_imports
from dqn_cartpole.errors import UserError
from dqn_cartpole.replay.reverb_tables import check_port_free, parse_address
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.lock import RunLock, join_run
from dqn_cartpole.run_folder.resolve import check_can_create, create_run_dir


def add_role(sub: Any, name: str, help_text: str, description: str) -> argparse.ArgumentParser:
    """One role's subcommand, with the arguments every role takes."""
    parser = sub.add_parser(name, help=help_text, description=description)
    add_config_args(parser, example="distributed.weight_refresh_steps=50")
    parser.add_argument("--replay-address", metavar="HOST:PORT", required=True,
                        help="the replay server (replay-server: only its PORT is used; it listens on every interface)")
    parser.add_argument("--run-dir", metavar="DIR", required=True, help="the run folder the roles share")
    return parser


def add_parsers(sub: Any) -> None:
    """Adds the role commands to `sub` (argparse subparsers)."""
    add_role(sub, "replay-server", "serve the replay and the learner's weights (Reverb)",
             "A standalone Reverb server: the replay tables and a 'variables' table, checkpointed into RUN_DIR on a "
             "timer and when stopped.")
    collect = add_role(sub, "collect", "collect experience into a replay server",
                       "A PyDriver collector: the agent's collect policy with the learner's weights, writing windows "
                       "to the replay server.")
    collect.add_argument("--collector-id", type=int, default=0, help="this collector's number (its seed offset)")
    # `--topology ray`: the env steps and episodes its earlier processes counted (its CSV is in the run folder,
    # which a collector on another node does not see).
    collect.add_argument("--count-from", metavar="STEPS,EPISODES", help=argparse.SUPPRESS)
    add_role(sub, "evaluate-live", "evaluate the learner's weights as they are pushed",
             "The evaluator: the greedy evaluation of the learner's newest weights every evaluation.eval_interval "
             "iterations (eval_metrics.csv, policy/best, the solve check and policy/final); a confirmed solve stops "
             "every role.")
    learn = add_role(sub, "learn", "train from a replay server and publish the weights",
                     "The learner: the single-process gradient step, checkpoints and exports, reading a replay server; "
                     "an evaluate-live role evaluates its weights.")
    learn.add_argument("--resume", action="store_true", help="continue RUN_DIR from its newest good checkpoint")
    learn.add_argument("--quiet", action="store_true", help="no progress bar, only the summary")
    learn.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)  # the launcher holds the lock


def load_role_config(args: argparse.Namespace) -> Any:
    """The role's config, checked, and the replay address parsed; before TensorFlow."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with contextlib.redirect_stderr(io.StringIO()):  # gymnasium's import-time notices
        config = load_config(locate_config(args.config), args.overrides)
    if config.replay.backend != "reverb":
        raise UserError(f"{args.command}: the roles share a Reverb server; set replay.backend: reverb "
                        f"(got {config.replay.backend})")
    check_prioritized_across_processes(config, f"the {args.command} role")
    parse_address(args.replay_address)
    return config


def join_role(run_dir: str) -> RunLock:
    """The role's shared hold on the run folder (created if missing), kept as long as the role lives."""
    check_can_create(run_dir, "--run-dir ")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--run-dir {run_dir}: cannot create the folder: {exc.strerror}") from None
    return join_run(run_dir)


def cmd_replay_server(args: argparse.Namespace) -> int:
    config = load_role_config(args)
    _, port = parse_address(args.replay_address)
    check_port_free(port)
    with contextlib.closing(join_role(args.run_dir)):
        with heavy_imports():
            from dqn_cartpole.distributed.server import serve

        return serve(config, port, args.run_dir)


def cmd_collect(args: argparse.Namespace) -> int:
    config = load_role_config(args)
    if args.collector_id < 0:
        raise UserError(f"--collector-id: must be 0 or more, got {args.collector_id}")
    count_from = parse_count_from(args.count_from)
    with contextlib.closing(join_role(args.run_dir)):
        with heavy_imports():
            from dqn_cartpole.distributed.collector import collect

        return collect(config, args.replay_address, args.collector_id, args.run_dir, count_from)


def parse_count_from(text: Any) -> Any:
    """`STEPS,EPISODES` -> (steps, episodes); None -> None."""
    if text is None:
        return None
    steps, _, episodes = text.partition(",")
    if not (steps.isdigit() and episodes.isdigit()):
        raise UserError(f"--count-from: expected STEPS,EPISODES (two whole numbers), got {text!r}")
    return int(steps), int(episodes)


def cmd_evaluate_live(args: argparse.Namespace) -> int:
    config = load_role_config(args)
    with contextlib.closing(join_role(args.run_dir)):
        with heavy_imports():
            from dqn_cartpole.distributed.evaluator import evaluate_live

        return evaluate_live(config, args.replay_address, args.run_dir)


def cmd_learn(args: argparse.Namespace) -> int:
    """The learner; by hand it owns the run folder (beside its hand-started roles), supervised it holds the
    launcher's lock. A resume is planned only under the lock."""
    config = load_role_config(args)
    if args.resume and not os.path.isdir(args.run_dir):
        raise UserError(f"--run-dir {args.run_dir}: no such folder to resume")
    if args.supervised:  # beside the run's owner (a launcher's lock it inherits, or a `--topology ray` driver's)
        created, lock = False, join_role(args.run_dir)
    else:
        created, lock = create_run_dir(args.run_dir, overwrite=False, beside_roles=True)
    with contextlib.closing(lock):
        plan = checkpointing.plan_resume(args.run_dir) if args.resume else None
        with heavy_imports():
            from dqn_cartpole.distributed.learner import run_learner

        return run_learner(config, args.run_dir, args.replay_address, plan, created, args.quiet, args.supervised)


COMMANDS = {"replay-server": cmd_replay_server, "collect": cmd_collect, "evaluate-live": cmd_evaluate_live,
            "learn": cmd_learn}
