"""The single-process commands: train (and resume), evaluate, record, report (alias plot), specs.

Each handler checks its input first (bad input: one line, exit status 2), then imports
TensorFlow through `console.imports.heavy_imports()` only if it needs it: `report` never does.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from typing import Any, Callable, Optional

from dqn_cartpole.cli import population
from dqn_cartpole.cli.shortcuts import add_track_arg
from dqn_cartpole.cli.args import add_config_args, check_positive, check_seed, config_overrides, print_preset_note
from dqn_cartpole.config import (Config, dump_written, load, load_config, locate_config, override_values, to_dict,
                                 validate_env_id)
from dqn_cartpole.console.imports import heavy_imports
from dqn_cartpole.console.quiet import NativeStderrFilter
from dqn_cartpole.distributed import launcher
from dqn_cartpole.errors import UserError
from dqn_cartpole.report.command import redraw_run
from dqn_cartpole.run_folder import checkpointing, layout, population as population_folder
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.record import read_written
from dqn_cartpole.run_folder.lock import lock_run
from dqn_cartpole.run_folder.resolve import (check_recording_path, create_run_dir, removed_on_bad_input,
                                             resolve_policy, resolve_run_dir)
from dqn_cartpole.tracking.send import check_installed, send_run
from dqn_cartpole.tracking.stream import streamed
from dqn_cartpole.training import finished


def add_parsers(sub: Any) -> None:
    """Adds the single-process commands to `sub` (argparse subparsers)."""
    train = sub.add_parser("train", help="train an agent and write a run folder",
                           description="Train a DQN agent. Writes config, metrics, plots, videos, the policy, "
                                       "report.html and TensorBoard events to outputs/<run-name>/.")
    add_config_args(train, shortcuts=True)
    add_track_arg(train)
    train.add_argument("--output-dir", metavar="DIR", help="run folder (default: outputs/<env>__s<seed>__<time>)")
    train.add_argument("--overwrite", action="store_true", help="replace an existing run folder at --output-dir")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue a stopped or crashed run from its newest good checkpoint (with its own "
                            "config.yaml; --set may change keys that keep the env, network and replay shapes)")
    train.add_argument("--quiet", action="store_true", help="no progress bar, only the summary")
    train.add_argument("--topology", choices=("single", "local", "ray"), default="single",
                       help="single: one process (default); local: a replay server, a learner, an evaluator and "
                            "--collectors collectors as separate processes on this machine, supervised; ray: the "
                            "same roles as Ray actors, the collectors spread over a Ray cluster's nodes, every "
                            "failure of one role survived (needs the ray extra)")
    population.add_population_args(train)
    train.add_argument("--collectors", type=int, default=None,
                       help="collectors of --topology local or ray (default 2)")
    train.add_argument("--address", metavar="HOST:PORT",
                       help="--topology ray: the Ray cluster's head (default: RAY_ADDRESS, else the cluster `ray "
                            "start` began on this machine, else a Ray instance started for the run; local: always "
                            "that private instance)")

    evaluate = sub.add_parser("evaluate", help="average return of a saved policy",
                              description="Load a saved policy and report the return over N greedy episodes.")
    evaluate.add_argument("policy", metavar="RUN_DIR_OR_POLICY", help="a run folder or a policy SavedModel folder")
    evaluate.add_argument("--final", action="store_true", help="use the run's policy/final (default: policy/best)")
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    evaluate.add_argument("--env", help="gymnasium env id (default: the run's env, else CartPole-v1)")
    evaluate.add_argument("--seed", type=int, default=0, help="env seed (default 0)")

    record = sub.add_parser("record", help="write an mp4 of a saved or the random policy",
                            description="Record episodes of a saved policy (or of the random policy) to an mp4.")
    record.add_argument("policy", metavar="RUN_DIR_OR_POLICY", nargs="?", help="a run folder or a policy folder")
    record.add_argument("--final", action="store_true", help="use the run's policy/final (default: policy/best)")
    record.add_argument("--random", action="store_true", help="record the uniformly random policy instead")
    record.add_argument("--output", "-o", metavar="MP4",
                        help="output file; an existing one is refused without --overwrite, and inside a run folder "
                             "only its videos/ takes one (default: a new file in the run's videos/, or ./)")
    record.add_argument("--overwrite", action="store_true",
                        help="replace the -o file if it exists; without -o, replace the run's own "
                             "videos/trained-agent.mp4 (which report.html shows) instead of writing a new file next to "
                             "it")
    record.add_argument("--episodes", type=int, default=1, help="episodes to record (default 1)")
    record.add_argument("--fps", type=int,
                        help="frames per second (default: the run's video.fps, as its own videos; else "
                             "configs/default.yaml's, 25)")
    record.add_argument("--env", help="gymnasium env id (default: the run's env, else CartPole-v1)")
    record.add_argument("--seed", type=int, default=0, help="env seed (default 0)")

    report = sub.add_parser("report", aliases=["plot"], help="redraw a run's plots and write its report.html",
                            description="Redraw RUN_DIR/plots/*.png from the run's CSVs and write RUN_DIR/report.html: "
                                        "the outcome, the plots, the videos, the evaluation table, the config, the "
                                        "files and the provenance, with relative paths only. Needs no TensorFlow. "
                                        "'plot' is another name for this command.")
    report.add_argument("run_dir", metavar="RUN_DIR")

    specs = sub.add_parser("specs", help="show the env, agent and replay data specs and sample shapes",
                           description="Walk through the data as the replay buffer tutorial does: the env's "
                                       "time_step_spec and action_spec, the agent's collect_data_spec, and the "
                                       "shapes that get_next, as_dataset and a full pass of the configured "
                                       "replay backend return after a few random steps.")
    add_config_args(specs, example="replay.backend=reverb", shortcuts=True)
    specs.add_argument("--steps", type=int, default=20, help="random env steps collected first (default 20)")


# ---------------------------------------------------------------------------- train


def cmd_train(args: argparse.Namespace) -> int:
    """`train`: checks everything (in ~0.1 s, before TensorFlow), creates and locks the run folder, trains."""
    check_topology_args(args)
    population.check_population_args(args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.population is not None:
        return population.cmd_train_population(args)
    if args.resume and population_folder.is_population(args.resume):
        return population.cmd_resume_population(args)
    if args.topology == "local":
        return cmd_train_local(args)
    if args.topology == "ray":
        return cmd_train_ray(args)
    if args.resume:
        return cmd_resume(args)
    config, run_dir, path, written = new_run(args)
    created, lock = create_run_dir(run_dir, args.overwrite)
    print_preset_note(path, config)
    from dqn_cartpole.training.run import run_new  # light: it says what starts, then imports TensorFlow

    with contextlib.closing(lock):  # held as long as the run lives
        write_written(run_dir, written)
        return run_new(config, run_dir, path, created, args.quiet)


MAX_COLLECTORS = 1024


def check_topology_args(args: argparse.Namespace) -> None:
    """--collectors and --address only where they mean something; a number of collectors that can run."""
    if args.collectors is not None and args.topology == "single":
        raise UserError("--collectors: only for --topology local or ray (one process collects itself)")
    if args.address is not None and args.topology != "ray":
        raise UserError("--address: only for --topology ray (the Ray cluster to run on)")
    check_positive("--collectors", args.collectors)
    if args.collectors is not None and args.collectors > MAX_COLLECTORS:
        raise UserError(f"--collectors: at most {MAX_COLLECTORS} (one learner reads every collector), got "
                        f"{args.collectors}")
    args.collectors = 2 if args.collectors is None else args.collectors


def write_written(run_dir: str, written: dict) -> None:
    """config.written.yaml: what the user wrote for the run, which the report compares with the defaults."""
    write_text_atomic(RunLayout(run_dir).written_config, dump_written(written))


def cmd_train_local(args: argparse.Namespace) -> int:
    """`train --topology local`: the same checks and run folder as `train`, then every role as a process."""
    config, run_dir = (None, args.resume) if args.resume else new_run(args)[:2]
    config, plan, created, lock = claim_topology_run(args, config, run_dir, "local")
    with contextlib.closing(lock):  # every role inherits it: it lives as long as any of them does
        return launcher.launch(config, run_dir, args.collectors, plan, args.quiet, created, lock)


def claim_topology_run(args: argparse.Namespace, config: Any, run_dir: str, topology: str) -> tuple:
    """(the config as the roles share it, the resume plan or None, whether the folder was created, its lock) of a
    `--topology local` or `ray` run: a resumed run whose replay is not in Reverb is refused before the lock (bad
    input touches nothing), then planned under it; a new run's folder is created and locked."""
    if args.resume:
        config, plan, lock = lock_and_plan_resume(
            run_dir, args, lambda config: launcher.local_config(config, run_dir, checkpointing.ResumePlan(None),
                                                                topology))
        return launcher.local_config(config, run_dir, plan, topology), plan, False, lock
    config = launcher.local_config(config, run_dir, None, topology)
    return (config, None, *create_run_dir(run_dir, args.overwrite))


def new_run(args: argparse.Namespace) -> tuple:
    """(config, run folder, config file, what the user wrote) of a new run, checked; nothing created yet."""
    with contextlib.redirect_stderr(io.StringIO()):  # gymnasium's import-time notices
        if args.output_dir:
            resolve_run_dir(None, args.output_dir, args.overwrite)  # needs no config: check it first
        path = locate_config(args.config)
        loaded = load(path, config_overrides(args))
        check_installed(loaded.config.tracking.backend)  # refused before anything is created or trained
        return loaded.config, resolve_run_dir(loaded.config, args.output_dir, args.overwrite), path, loaded.written


def cmd_train_ray(args: argparse.Namespace) -> int:
    """`train --topology ray`: the checks of `--topology local`, then the cluster (joined or started: a missing
    extra or a silent address is one line, before anything is created), then the run folder and the roles."""
    from dqn_cartpole.processes import ray_cluster

    ray_cluster.import_ray("--topology ray")
    address = ray_cluster.cluster_address(args.address)
    if address is not None:
        ray_cluster.parse_cluster_address(address, "--address" if args.address else "RAY_ADDRESS")
    if args.resume:
        config, run_dir = resume_config(args.resume, args), args.resume
        launcher.local_config(config, run_dir, checkpointing.ResumePlan(None), "ray")
    else:
        config, run_dir = new_run(args)[:2]
    return launch_on_ray(args, config, run_dir, address)


def launch_on_ray(args: argparse.Namespace, config: Any, run_dir: str, address: Optional[str]) -> int:
    """Joins or starts Ray, then creates (or locks and plans) the run folder and runs the roles on it."""
    import time

    from dqn_cartpole.distributed import ray_topology
    from dqn_cartpole.processes.ray_cluster import ray_session

    started = time.monotonic()
    with ray_topology.quiet_ray(layout.RunLayout(run_dir).roles), \
            ray_session(address, config.distributed.connect_timeout_s, "--topology ray",
                        flag="--address" if args.address else "RAY_ADDRESS") as session:
        ready_s = time.monotonic() - started
        config, plan, created, lock = claim_topology_run(args, config, run_dir, "ray")
        with contextlib.closing(lock), removed_on_bad_input(run_dir, created), streamed(config, run_dir):
            status = ray_topology.run(config, run_dir, args.collectors, plan, args.quiet, session, ready_s)
    launcher.redraw(run_dir)
    ray_topology.command_time_line(run_dir, session.how, ready_s, time.monotonic() - started)
    send_run(config, run_dir)  # --track: once every role stopped and the plots are final
    return status


def cmd_resume(args: argparse.Namespace) -> int:
    """`train --resume RUN_DIR`: the run's config (plus --set), from its newest good checkpoint."""
    config, plan, lock = lock_and_plan_resume(args.resume, args)
    from dqn_cartpole.training.run import run_resumed  # light: it says what starts, then imports TensorFlow

    with contextlib.closing(lock):
        config = plan_resumed_run(args.resume, args, config, plan)
        return 0 if config is None else run_resumed(config, args.resume, plan, args.quiet)


def plan_resumed_run(run_dir: str, args: argparse.Namespace, config: Config, plan: checkpointing.ResumePlan,
                     again: Callable[[str, dict], str] = finished.cli_again) -> Optional[Config]:
    """What a resume of a finished run does (`finished.plan_finished`; `again` writes its hint): None when there is
    nothing to do (said on stdout), else the config to run (a note on stderr first, if any, and what the resume set
    added to config.written.yaml)."""
    given = override_values(config_overrides(args))
    resume = finished.plan_finished(run_dir, plan.found, config, given, again)
    if not resume.run:
        print(resume.line)  # the outcome: nothing to do, and how to go on
        return None
    if resume.line:
        print(resume.line, file=sys.stderr)  # with the run's other messages, above its progress
    before = read_written(RunLayout(run_dir).written_config)
    if before is not None:  # a run that recorded what was written: add what this command wrote
        write_written(run_dir, {**before, **given, **dict(resume.written)})
    return resume.config


def lock_and_plan_resume(run_dir: str, args: argparse.Namespace,
                         check: Callable[[Any], Any] = lambda config: None) -> tuple:
    """Checks `--resume RUN_DIR` and its config (`check` too) touching nothing, locks the run folder (refused
    beside any live process of the run), then plans the resume: the checkpoints are read only once no other
    process can write them. Returns (config, plan, lock)."""
    config = resume_config(run_dir, args)
    check(config)
    lock = lock_run(run_dir)
    try:
        plan = checkpointing.plan_resume(run_dir)
        check_frozen(run_dir, plan.found.state.get("config", {}) if plan.found else {}, config, "its checkpoint's")
    except BaseException:
        lock.close()
        raise
    return config, plan, lock


def check_resume_folder(run_dir: str, args: argparse.Namespace) -> None:
    """`--resume RUN_DIR` names a run folder this process may write in, with no flag a resume cannot take."""
    for flag, given in (("--config", args.config), ("--output-dir", args.output_dir), ("--overwrite", args.overwrite)):
        if given:
            raise UserError(f"--resume cannot be combined with {flag}: a resumed run keeps its folder and its "
                            f"config.yaml (change single keys with --set)")
    if not os.path.exists(run_dir):
        raise UserError(f"--resume {run_dir}: no such folder")
    if not os.path.isdir(run_dir):
        raise UserError(f"--resume {run_dir}: is a file, not a run folder")
    if not os.path.isfile(os.path.join(run_dir, layout.CONFIG_FILE)):
        raise UserError(f"--resume {run_dir}: not a run folder (no {layout.CONFIG_FILE}); give a folder that "
                        f"'train' wrote, e.g. outputs/<run-name>")
    if not os.access(run_dir, os.W_OK):
        raise UserError(f"--resume {run_dir}: cannot write there (no permission)")
    population = population_folder.member_of(run_dir)
    if population is not None:
        raise UserError(f"--resume {run_dir}: is one seed of the population {population}, which trains its seeds "
                        f"together; continue it with: train --resume {population}")


def resume_config(run_dir: str, args: argparse.Namespace) -> Any:
    """The checked run folder's config.yaml plus --set, refused if --set changes a key a resumed run keeps."""
    check_resume_folder(run_dir, args)
    config_file = os.path.join(run_dir, layout.CONFIG_FILE)
    with contextlib.redirect_stderr(io.StringIO()):  # gymnasium's import-time notices
        config = load_config(config_file, config_overrides(args))
        check_frozen(run_dir, to_dict(load_config(config_file)), config, "the run's")
    check_installed(config.tracking.backend)  # a tracked run continues its tracked run: its extra is needed
    return config


def check_frozen(run_dir: str, before: dict, config: Any, label: str) -> None:
    """One line if `config` changes a key of `before` (`label`'s config) that a resumed run keeps."""
    changes = checkpointing.frozen_changes(before, to_dict(config)) if before else []
    if changes:
        raise UserError(f"--resume {run_dir}: cannot change {', '.join(changes)} from {label} config; a resumed "
                        f"run keeps its env, network, n_step, replay backend and capacity, and seed; start a "
                        f"new run instead")


# ---------------------------------------------------------------------------- saved policies


def env_for(args: argparse.Namespace, run_dir: Optional[str]) -> tuple[str, Optional[int]]:
    """The env id (and time-limit override) to use: --env, else the run's config, else CartPole-v1."""
    if args.env:
        validate_env_id(args.env, "--env")
        return args.env, None
    if run_dir:
        config = load_config(os.path.join(run_dir, layout.CONFIG_FILE))
        return config.env.id, config.env.max_episode_steps
    return "CartPole-v1", None


def check_policy_fits(policy_dir: str, env_id: str) -> None:
    """A policy runs only on an env with its observation shape and number of actions (PolicySaver's
    policy_specs.pbtxt says what it was saved for); one line naming both otherwise."""
    from tf_agents.specs import tensor_spec

    from dqn_cartpole.env_ids import space_sizes

    specs_file = os.path.join(policy_dir, "policy_specs.pbtxt")
    if not os.path.isfile(specs_file):
        return  # not written by PolicySaver: nothing to check against
    saved = tensor_spec.from_pbtxt_file(specs_file)["collect_data_spec"]
    shape = tuple(saved.observation.shape)
    actions = int(saved.action.maximum) - int(saved.action.minimum) + 1
    env_shape, env_actions = space_sizes(env_id)
    if (shape, actions) != (env_shape, env_actions):
        raise UserError(f"{policy_dir}: the policy takes observations of shape {shape} and chooses among {actions} "
                        f"actions, but {env_id} has observations of shape {env_shape} and {env_actions} actions; "
                        f"give --env the env it was trained on")


def load_policy_or_fail(policy_dir: str) -> Any:
    """The saved policy, or one line saying why it cannot be loaded."""
    from dqn_cartpole.run_folder.export import load_policy

    try:
        return load_policy(policy_dir)
    except Exception as exc:  # pylint: disable=broad-except
        raise UserError(f"{policy_dir}: cannot load the policy: {str(exc).splitlines()[0]}") from None


def evaluate_policy(args: argparse.Namespace) -> tuple[str, str, Any]:
    """`evaluate`'s work (also the Python API's `Run.evaluate`): (policy folder, env id, `EvalResult`)."""
    check_positive("--episodes", args.episodes)
    check_seed("--seed", args.seed)
    policy_dir, run_dir = resolve_policy(args.policy, args.final)
    env_id, max_steps = env_for(args, run_dir)
    with heavy_imports():
        from dqn_cartpole.core.envs import make_batched_env
        from dqn_cartpole.core.evaluation import make_episode_runner

    check_policy_fits(policy_dir, env_id)
    env = make_batched_env(env_id, args.episodes, seed=args.seed, max_episode_steps=max_steps)
    try:
        return policy_dir, env_id, make_episode_runner(load_policy_or_fail(policy_dir), env)()
    finally:
        env.close()


def cmd_evaluate(args: argparse.Namespace) -> int:
    policy_dir, env_id, result = evaluate_policy(args)
    import numpy as np  # already imported with TensorFlow
    returns = result.returns
    print(f"{policy_dir} on {env_id}, {len(returns)} greedy episodes: mean {np.mean(returns):.1f}, "
          f"std {np.std(returns):.1f}, min {np.min(returns):.1f}, max {np.max(returns):.1f}")
    return 0


def record_output(args: argparse.Namespace, run_dir: Optional[str]) -> str:
    """Where `record` writes: -o as given; else the run's videos/ (or ./) under the usual name, unless that file
    exists: a run's own video (shown by its report.html) is replaced only with --overwrite, else the next free
    name is used (trained-agent-2.mp4, ...)."""
    if args.output:
        return args.output
    name = layout.RANDOM_VIDEO if args.random else layout.TRAINED_VIDEO
    path = os.path.join(run_dir, layout.VIDEOS_DIR, name) if run_dir else name
    if args.overwrite or not os.path.exists(path):
        return path
    stem, ext = os.path.splitext(path)
    number = 2
    while os.path.exists(f"{stem}-{number}{ext}"):
        number += 1
    return f"{stem}-{number}{ext}"


def record_fps(run_dir: Optional[str]) -> int:
    """`record`'s frame rate without --fps: the run's video.fps (what its own videos use), else the default's."""
    return load_config(os.path.join(run_dir, layout.CONFIG_FILE)).video.fps if run_dir else Config().video.fps


def cmd_record(args: argparse.Namespace) -> int:
    check_positive("--episodes", args.episodes)
    check_positive("--fps", args.fps)
    check_seed("--seed", args.seed)
    if args.random == bool(args.policy):
        raise UserError("record: give either a run folder / policy folder or --random")
    if args.output:  # before anything is read: the file named is checked first
        check_recording_path(args.output, args.overwrite)
    policy_dir, run_dir = resolve_policy(args.policy, args.final) if args.policy else (None, None)
    env_id, max_steps = env_for(args, run_dir)
    fps = args.fps or record_fps(run_dir)
    output = record_output(args, run_dir)
    check_recording_path(output, args.overwrite)
    with heavy_imports():
        from tf_agents.specs import tensor_spec

        from dqn_cartpole.core.envs import make_env
        from dqn_cartpole.core.policies import compiled_act_fn
        from dqn_cartpole.core.policies import random_act_fn
        from dqn_cartpole.report.video import record_video

    env = make_env(env_id)
    try:
        if args.random:
            act = random_act_fn(tensor_spec.from_spec(env.time_step_spec()), tensor_spec.from_spec(env.action_spec()),
                                seed=args.seed)
        else:
            check_policy_fits(policy_dir, env_id)
            act = compiled_act_fn(load_policy_or_fail(policy_dir), tensor_spec.from_spec(env.time_step_spec()))
    finally:
        env.close()
    returns = record_video(act, env_id, output, args.episodes, fps, args.seed, max_steps)
    print(f"wrote {output}: {len(returns)} episode(s), returns {', '.join(f'{r:.0f}' for r in returns)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """`report RUN_DIR` (alias `plot`): redraws the plots, then report.html."""
    print(f"wrote {redraw_run(args.run_dir)[-1]}")
    return 0


def cmd_specs(args: argparse.Namespace) -> int:
    config = load_config(locate_config(args.config), config_overrides(args))
    # as_dataset(4, 2) needs 2 steps, and Reverb one whole item; an empty Reverb table blocks reads.
    needed = config.agent.n_step + 1
    if args.steps < needed:
        raise UserError(f"--steps: must be at least {needed} (n_step + 1), got {args.steps}")
    with heavy_imports():
        from dqn_cartpole.core.specs import specs_report

    with NativeStderrFilter():
        lines = specs_report(config, args.steps, announce=lambda line: print(line, file=sys.stderr))
    print("\n".join(lines))
    return 0


COMMANDS = {"train": cmd_train, "evaluate": cmd_evaluate, "record": cmd_record, "report": cmd_report,
            "plot": cmd_report, "specs": cmd_specs}
