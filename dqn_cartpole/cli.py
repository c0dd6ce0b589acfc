"""Command line: `python -m dqn_cartpole {train,evaluate,record,plot,specs,sweep,compare,tune}`.

Bad input ends in one line on stderr and exit status 2; heavy imports (TensorFlow) happen only
after the arguments and the config have been checked. A run stopped by Ctrl-C or SIGTERM exits
with 130 or 143 and prints the command that resumes it; a diverged run or a full disk exits with 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import os
import shlex
import shutil
import sys
from typing import Optional, Sequence

from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments import commands as experiments

EXIT_USAGE = 2
EXIT_FAILED = 1
REPO_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
DEFAULT_CONFIG = os.path.join(REPO_CONFIGS, "default.yaml")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dqn-cartpole", description="Train, watch and understand a DQN on CartPole.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    train = sub.add_parser("train", help="train an agent and write a run folder",
                           description="Train a DQN agent. Writes config, metrics, plots, videos, the policy "
                                       "and TensorBoard events to outputs/<run-name>/.")
    train.add_argument("--config", metavar="PATH", help=f"YAML config (default: configs/default.yaml)")
    train.add_argument("--set", metavar="SECTION.KEY=VALUE", action="append", default=[], dest="overrides",
                       help="override one config key, e.g. --set agent.learning_rate=5e-4 (repeatable)")
    train.add_argument("--output-dir", metavar="DIR", help="run folder (default: outputs/<env>__s<seed>__<time>)")
    train.add_argument("--overwrite", action="store_true", help="replace an existing run folder at --output-dir")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue a stopped or crashed run from its newest good checkpoint (with its own "
                            "config.yaml; --set may change keys that keep the env, network and replay shapes)")
    train.add_argument("--quiet", action="store_true", help="no progress bar, only the summary")

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
    record.add_argument("--output", "-o", metavar="MP4", help="output file (default: videos/ of the run, or ./)")
    record.add_argument("--episodes", type=int, default=1, help="episodes to record (default 1)")
    record.add_argument("--fps", type=int, default=50, help="frames per second (default 50)")
    record.add_argument("--env", help="gymnasium env id (default: the run's env, else CartPole-v1)")
    record.add_argument("--seed", type=int, default=0, help="env seed (default 0)")

    plot = sub.add_parser("plot", help="redraw a run's plots from its CSV metrics",
                          description="Redraw plots/returns.png and plots/loss.png from a run folder's CSVs.")
    plot.add_argument("run_dir", metavar="RUN_DIR")

    specs = sub.add_parser("specs", help="show the env, agent and replay data specs and sample shapes",
                           description="Walk through the data as the replay buffer tutorial does: the env's "
                                       "time_step_spec and action_spec, the agent's collect_data_spec, and the "
                                       "shapes that get_next, as_dataset and a full pass of the configured "
                                       "replay backend return after a few random steps.")
    specs.add_argument("--config", metavar="PATH", help="YAML config (default: configs/default.yaml)")
    specs.add_argument("--set", metavar="SECTION.KEY=VALUE", action="append", default=[], dest="overrides",
                       help="override one config key, e.g. --set replay.backend=reverb (repeatable)")
    specs.add_argument("--steps", type=int, default=20, help="random env steps collected first (default 20)")
    experiments.add_parsers(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of `python -m dqn_cartpole` and the `dqn-cartpole` script."""
    try:
        args = build_parser().parse_args(argv)
        if args.command in experiments.COMMANDS:  # they start training in child processes: no TensorFlow here
            return experiments.COMMANDS[args.command](args)
        from dqn_cartpole import quiet

        if args.command == "train":
            args.checked = check_train(args)  # bad input is refused in ~0.1 s, before TensorFlow is imported
        quiet.silence()  # before anything else imports TensorFlow
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # the disk, permissions, a vanished folder: one line, not a traceback
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


# ---------------------------------------------------------------------------- train


def check_train(args: argparse.Namespace) -> tuple:
    """Every check of `train`'s input, without side effects: (config path, config, run folder) or,
    with --resume, (config, checkpoint plan).

    Only a config that passes every other check gets its env id looked up, which imports
    gymnasium and TF-Agents; their import-time notices are kept off the console.
    """
    from dqn_cartpole.config import load_config

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with contextlib.redirect_stderr(io.StringIO()):
        if args.resume:
            return resolve_resume(args.resume, args)
        if args.output_dir:
            resolve_run_dir(None, args.output_dir, args.overwrite)  # needs no config: check it first
        config_path = args.config or (DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else None)
        config = load_config(config_path, args.overrides)
        return config_path, config, resolve_run_dir(config, args.output_dir, args.overwrite)


def cmd_train(args: argparse.Namespace) -> int:
    if args.resume:
        return cmd_resume(args)
    config_path, config, run_dir = getattr(args, "checked", None) or check_train(args)

    from dqn_cartpole.progress import Progress

    created = _make_run_dir(run_dir, args.overwrite)
    progress = Progress(config.training.num_iterations, enabled=not args.quiet)
    progress.message(f"Training {config.env.id} with {os.path.basename(config_path or 'defaults')} "
                     f"(seed {config.training.seed}, replay {config.replay.backend}) -> {run_dir}")
    return _run_training(config, run_dir, progress, None, created)


def cmd_resume(args: argparse.Namespace) -> int:
    """`train --resume RUN_DIR`: the run's config (plus --set), from its newest good checkpoint."""
    config, plan = getattr(args, "checked", None) or check_train(args)
    from dqn_cartpole.progress import Progress

    run_dir = args.resume
    for bad in plan.bad:
        instead = f"using {os.path.basename(plan.found.path)} instead" if plan.found else "no other checkpoint"
        print(f"warning: checkpoint {bad.path} is {bad.reason}; {instead}", file=sys.stderr)
    if plan.found is None:
        print(f"warning: {run_dir} has no usable checkpoint (it stopped before writing one); "
              f"starting it again from iteration 0 with its config.yaml", file=sys.stderr)
    progress = Progress(config.training.num_iterations, enabled=not args.quiet)
    start = f"{os.path.basename(plan.found.path)}" if plan.found else "the beginning"
    progress.message(f"Resuming {run_dir} ({config.env.id}, seed {config.training.seed}, replay "
                     f"{config.replay.backend}) from {start}")
    return _run_training(config, run_dir, progress, plan, created=False)


def _run_training(config, run_dir: str, progress, plan, created: bool) -> int:
    from dqn_cartpole.checkpointing import CheckpointError, DiskFullError
    from dqn_cartpole.run_folder.layout import RunLayout
    from dqn_cartpole.training import train

    try:
        result = train(config, RunLayout(run_dir), progress, plan)
    except UserError:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)  # bad input leaves no run folder behind
        raise
    except DiskFullError as exc:
        progress.close()
        print(f"error: {exc}. Free some space, then resume with: {resume_command(run_dir)}", file=sys.stderr)
        return EXIT_FAILED
    except CheckpointError as exc:
        raise UserError(str(exc)) from None
    finally:
        progress.close()
    write_summary_json(result, RunLayout(run_dir).summary)
    print_summary(result)
    if result.stopped_by:
        print(f"Stopped by {result.stopped_by} at iteration {result.iterations}; the checkpoint, plots and "
              f"policy are saved. Resume with:\n  {resume_command(run_dir)}")
    elif result.diverged_at_iteration is not None:
        print(f"Training diverged (the loss became NaN or Inf at iteration {result.diverged_at_iteration}) and "
              f"stopped. Lower agent.learning_rate or set agent.gradient_clipping, then continue with:\n"
              f"  {resume_command(run_dir)} --set agent.learning_rate=...", file=sys.stderr)
    return result.exit_status


def resume_command(run_dir: str) -> str:
    return f"python -m dqn_cartpole train --resume {shlex.quote(run_dir)}"


def resolve_resume(run_dir: str, args: argparse.Namespace):
    """Checks `--resume RUN_DIR` before anything heavy: a run folder, a compatible config, a checkpoint plan."""
    from dqn_cartpole import checkpointing
    from dqn_cartpole.run_folder import layout
    from dqn_cartpole.config import load_config, to_dict

    for flag, given in (("--config", args.config), ("--output-dir", args.output_dir), ("--overwrite", args.overwrite)):
        if given:
            raise UserError(f"--resume cannot be combined with {flag}: a resumed run keeps its folder and its "
                            f"config.yaml (change single keys with --set)")
    if not os.path.exists(run_dir):
        raise UserError(f"--resume {run_dir}: no such folder")
    if not os.path.isdir(run_dir):
        raise UserError(f"--resume {run_dir}: is a file, not a run folder")
    config_file = os.path.join(run_dir, layout.CONFIG_FILE)
    if not os.path.isfile(config_file):
        raise UserError(f"--resume {run_dir}: not a run folder (no {layout.CONFIG_FILE}); give a folder that "
                        f"'train' wrote, e.g. outputs/<run-name>")
    original = load_config(config_file)
    config = load_config(config_file, args.overrides)
    plan = checkpointing.plan_resume(run_dir)
    for label, before in (("the run's", to_dict(original)),
                          ("its checkpoint's", plan.found.state.get("config", {}) if plan.found else {})):
        changes = checkpointing.frozen_changes(before, to_dict(config)) if before else []
        if changes:
            raise UserError(f"--resume {run_dir}: cannot change {', '.join(changes)} from {label} config; a resumed "
                            f"run keeps its env, network, n_step, replay backend and capacity, and seed; start a "
                            f"new run instead")
    if not os.access(run_dir, os.W_OK):
        raise UserError(f"--resume {run_dir}: cannot write there (no permission)")
    return config, plan


def write_summary_json(result, path: str) -> None:
    """The summary as JSON, for scripts (benchmarks, sweeps) that read a finished run."""
    import dataclasses
    import resource

    from dqn_cartpole.run_folder import write_summary

    summary = dataclasses.asdict(result)
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    write_summary(path, summary)


def _check_positive(label: str, value: int) -> None:
    if value is not None and value <= 0:
        raise UserError(f"{label}: must be positive, got {value}")


def resolve_run_dir(config, output_dir: Optional[str], overwrite: bool) -> str:
    """The run folder: --output-dir, else output.root/output.run_name, else a fresh name."""
    if output_dir:
        path = output_dir
    elif config.output.run_name:
        path = os.path.join(config.output.root, config.output.run_name)
    else:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        base = os.path.join(config.output.root, f"{config.env.id}__s{config.training.seed}__{stamp}")
        path, n = base, 1
        while os.path.exists(path):
            n += 1
            path = f"{base}-{n}"
    from dqn_cartpole.run_folder.layout import CONFIG_FILE

    if os.path.isfile(path):
        raise UserError(f"{path}: is a file, not a folder; choose another --output-dir")
    if os.path.isdir(path) and os.listdir(path):
        if not overwrite:
            raise UserError(f"{path}: already holds a run; pass --overwrite to replace it, --resume {path} to "
                            f"continue it, or choose another --output-dir")
        if not os.path.exists(os.path.join(path, CONFIG_FILE)):
            raise UserError(f"{path}: holds files but is not a run folder (no {CONFIG_FILE}); refusing to delete "
                            f"it, even with --overwrite")
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UserError(f"{path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK):
        raise UserError(f"{path}: cannot write there (no permission on {probe})")
    return path


def _make_run_dir(path: str, overwrite: bool) -> bool:
    """Creates the run folder; returns whether it is new."""
    existed = os.path.isdir(path)
    if existed and overwrite:
        shutil.rmtree(path)
        existed = False
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{path}: cannot create the run folder: {exc.strerror}") from None
    return not existed


def print_summary(result) -> None:
    def fmt(value: Optional[float]) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        f"Done in {result.wall_s:.1f} s: {result.iterations} iterations, {result.train_steps} train steps, "
        f"{result.env_steps} env steps"
        + (f" ({result.iterations_per_s:.0f} it/s in the loop, {result.eval_s:.1f} s evaluating)."
           if result.iterations_per_s else "."),
        f"  best average return   {fmt(result.best_return)}",
        f"  final average return  {fmt(result.final_return)}",
    ]
    if result.solved_at_iteration is not None:
        lines.append(f"  solved                at iteration {result.solved_at_iteration}, "
                     f"policy saved after {result.solved_wall_s:.1f} s")
    if result.resumed_from:
        lines.append(f"  resumed from          {result.resumed_from}")
    if result.checkpoint_bytes is not None:
        lines.append(f"  last checkpoint       {result.checkpoint_bytes / 1e6:.2f} MB, written in "
                     f"{result.checkpoint_write_s:.2f} s")
    lines.append(f"Artifacts in {result.run_dir}:")
    width = max(len(k) for k in result.artifacts)
    lines += [f"  {name:<{width}}  {path}" for name, path in result.artifacts.items()]
    print("\n".join(lines))


# ---------------------------------------------------------------------------- saved policies


def resolve_policy(path: str, final: bool = False) -> tuple[str, Optional[str]]:
    """Returns (policy folder, run folder or None) for a run folder or a policy folder.

    A run folder means its `policy/best` (or `policy/final` with `final`), falling back to the other.
    """
    from dqn_cartpole.run_folder import layout
    from dqn_cartpole.export import recover_policy

    if not os.path.exists(path):
        raise UserError(f"{path}: no such run or policy folder")

    def run_of(folder: str) -> Optional[str]:
        return folder if os.path.exists(os.path.join(folder, layout.CONFIG_FILE)) else None

    if os.path.exists(os.path.join(path, "saved_model.pb")):
        parent = os.path.dirname(os.path.abspath(path))
        return path, run_of(parent) or run_of(os.path.dirname(parent))
    order = (layout.FINAL_POLICY, layout.BEST_POLICY) if final else (layout.BEST_POLICY, layout.FINAL_POLICY)
    for base, run in ((os.path.join(path, layout.POLICY_DIR), path), (path, os.path.dirname(os.path.abspath(path)))):
        for name in order:
            candidate = os.path.join(base, name)
            recover_policy(candidate)
            if os.path.exists(os.path.join(candidate, "saved_model.pb")):
                return candidate, run_of(run)
    raise UserError(f"{path}: not a run folder or a saved policy (no saved_model.pb)")


def env_for(args: argparse.Namespace, run_dir: Optional[str]) -> tuple[str, Optional[int]]:
    """The env id (and time-limit override) to use: --env, else the run's config, else CartPole-v1."""
    if args.env:
        from dqn_cartpole.config import _validate_env_id

        _validate_env_id(args.env, "--env")
        return args.env, None
    if run_dir:
        from dqn_cartpole.run_folder import layout
        from dqn_cartpole.config import load_config

        config = load_config(os.path.join(run_dir, layout.CONFIG_FILE))
        return config.env.id, config.env.max_episode_steps
    return "CartPole-v1", None


def _load_policy(policy_dir: str):
    from dqn_cartpole.export import load_policy

    try:
        return load_policy(policy_dir)
    except Exception as exc:  # pylint: disable=broad-except
        raise UserError(f"{policy_dir}: cannot load the policy: {str(exc).splitlines()[0]}") from None


def _load_act(policy_dir: str, env):
    from tf_agents.specs import tensor_spec

    from dqn_cartpole.policies import compiled_act_fn

    return compiled_act_fn(_load_policy(policy_dir), tensor_spec.from_spec(env.time_step_spec()))


def cmd_evaluate(args: argparse.Namespace) -> int:
    _check_positive("--episodes", args.episodes)
    policy_dir, run_dir = resolve_policy(args.policy, args.final)
    env_id, max_steps = env_for(args, run_dir)
    import numpy as np

    from dqn_cartpole.envs import make_batched_env
    from dqn_cartpole.evaluation import make_episode_runner

    env = make_batched_env(env_id, args.episodes, seed=args.seed, max_episode_steps=max_steps)
    try:
        result = make_episode_runner(_load_policy(policy_dir), env)()
    finally:
        env.close()
    returns = result.returns
    print(f"{policy_dir} on {env_id}, {len(returns)} greedy episodes: mean {np.mean(returns):.1f}, "
          f"std {np.std(returns):.1f}, min {np.min(returns):.1f}, max {np.max(returns):.1f}")
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    _check_positive("--episodes", args.episodes)
    _check_positive("--fps", args.fps)
    if args.random == bool(args.policy):
        raise UserError("record: give either a run folder / policy folder or --random")
    policy_dir, run_dir = resolve_policy(args.policy, args.final) if args.policy else (None, None)
    env_id, max_steps = env_for(args, run_dir)
    from dqn_cartpole.run_folder import layout

    name = layout.RANDOM_VIDEO if args.random else layout.TRAINED_VIDEO
    output = args.output or (os.path.join(run_dir, layout.VIDEOS_DIR, name) if run_dir else name)
    if os.path.isdir(output):
        raise UserError(f"--output {output}: is a folder; give an .mp4 file name")
    from tf_agents.specs import tensor_spec

    from dqn_cartpole.envs import make_env
    from dqn_cartpole.policies import random_act_fn
    from dqn_cartpole.video import record_video

    env = make_env(env_id)
    try:
        if args.random:
            act = random_act_fn(tensor_spec.from_spec(env.time_step_spec()), tensor_spec.from_spec(env.action_spec()),
                                seed=args.seed)
        else:
            act = _load_act(policy_dir, env)
    finally:
        env.close()
    returns = record_video(act, env_id, output, args.episodes, args.fps, args.seed, max_steps)
    print(f"wrote {output}: {len(returns)} episode(s), returns {', '.join(f'{r:.0f}' for r in returns)}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from dqn_cartpole.run_folder import layout as layout_lib

    run = layout_lib.RunLayout(args.run_dir)
    if not os.path.isdir(args.run_dir) or not os.path.exists(run.eval_metrics):
        raise UserError(f"{args.run_dir}: not a run folder (no {layout_lib.EVAL_METRICS_FILE})")
    env_id, _ = env_for(argparse.Namespace(env=None), args.run_dir if os.path.exists(run.config) else None)
    from dqn_cartpole import envs, plots

    for path in plots.plot_run(run, envs.max_return(env_id), env_id):
        print(f"wrote {path}")
    return 0


def cmd_specs(args: argparse.Namespace) -> int:
    from dqn_cartpole.config import load_config

    config = load_config(args.config or (DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else None), args.overrides)
    # as_dataset(4, 2) needs 2 steps, and Reverb one whole item; an empty Reverb table blocks reads.
    needed = config.agent.n_step + 1
    if args.steps < needed:
        raise UserError(f"--steps: must be at least {needed} (n_step + 1), got {args.steps}")
    from dqn_cartpole import quiet
    from dqn_cartpole.specs import REVERB_NOISE, specs_report

    with quiet.filtered_native_stderr(quiet.NATIVE_NOISE + REVERB_NOISE):
        lines = specs_report(config, args.steps, announce=lambda line: print(line, file=sys.stderr))
    print("\n".join(lines))
    return 0


COMMANDS = {"train": cmd_train, "evaluate": cmd_evaluate, "record": cmd_record, "plot": cmd_plot,
            "specs": cmd_specs}
