"""Scale-out benchmark: `python scripts/benchmark.py --scale-out 1,2 [--iterations 6000] [--seeds 1,2,3]`
(or this file directly, with the same arguments).

What it measures and prints, and its options: docs/benchmarks.md ("Scale-out records").

The Ray figures of docs/benchmarks.md (scale-out records) come from
    flock /tmp/dqn-heavy.lock python scripts/benchmark.py --scale-out 2 --ray --ray-failures --solve-only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import benchmark_ray
from benchmark_common import (DEFAULT_REFERENCE, REPO, load_averages, project_rate, reference_rate, run_main,
                              run_stoppable, run_train)
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments.grid import parse_seeds

# 100 greedy CartPole-v1 episodes of a saved policy, batched, in a fresh interpreter without this project.
PLAIN_TF_SCORE = """
import sys
import gymnasium as gym
import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

policy = tf.saved_model.load(sys.argv[1])
envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(100)])
observation, _ = envs.reset(seed=list(range(5000, 5100)))
returns, alive = np.zeros(100), np.ones(100, bool)
while alive.any():
    step = ts.restart(tf.constant(observation, dtype=tf.float32), batch_size=100)
    action = policy.action(step).action.numpy()
    observation, reward, terminated, truncated, _ = envs.step(action)
    returns += reward * alive
    alive &= ~(terminated | truncated)
assert not any(m.startswith("dqn_cartpole") for m in sys.modules)
print(returns.mean(), returns.min())
"""


# ---------------------------------------------------------------------------- one process, tutorial settings


TUTORIAL_RUNS = (("tf_uniform", "py"), ("py_uniform", "py"), ("reverb", "py"), ("reverb", "compiled"))


def tutorial_rates(iterations: int, workdir: str) -> dict:
    """it/s of `train` at the tutorial's hyperparameters for each (backend, driver) of TUTORIAL_RUNS."""
    return {run: project_rate(run[0], iterations, workdir, [], driver=run[1]) for run in TUTORIAL_RUNS}


# ---------------------------------------------------------------------------- the learner alone


LEARNER_MODES = {"tf_uniform": "tf_uniform, in the process",
                 "learner": "replay on the learner, queue read over loopback",
                 "server": "replay on the server (shared table), sampled over loopback"}


def learner_rate(mode: str, steps: int) -> dict:
    """One `--learner-child` run in a fresh process: see `learner_child`."""
    result = run_stoppable([sys.executable, os.path.abspath(__file__), "--learner-child", mode, "--iterations",
                            str(steps)])
    if result.returncode != 0:
        raise SystemExit(f"learner benchmark ({LEARNER_MODES[mode]}) failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def start_server(config_path: str, overrides: list, stack) -> str:
    """A `replay-server` process for `config_path` + `overrides`; returns its address once it is ready."""
    from dqn_cartpole.distributed.launcher import free_port
    from dqn_cartpole.distributed.policy import replay_answers
    from dqn_cartpole.processes.commands import child_command, set_flags

    port = free_port()
    args = child_command(["replay-server", "--config", config_path, "--replay-address", f"localhost:{port}",
                          "--run-dir", tempfile.mkdtemp(prefix="dqn-bench-server-"), *set_flags(overrides)])
    server = subprocess.Popen(args, cwd=REPO, stderr=subprocess.DEVNULL)
    stack.callback(server.wait)
    stack.callback(server.terminate)
    while not replay_answers(f"localhost:{port}"):  # Reverb's ServerInfo call, as the topologies check it
        if server.poll() is not None:
            raise SystemExit("the replay server did not start")
        time.sleep(0.1)
    return f"localhost:{port}"


def learner_child(mode: str, steps: int) -> None:
    """The learner's compiled gradient step alone (default config), no collection, after a fill of random
    steps written beforehand by this process: train steps/s, and the items/s this process's writes took.

    tf_uniform: its in-graph buffer. learner: a replay-server process's queue (made deep enough to hold the
    whole fill), read into the learner-side buffer before each step at the default samples_per_insert (the batch), i.e.
    one new item per gradient step. server: the server's shared replay table, sampled (a batch per step)."""
    import contextlib

    sys.path.insert(0, REPO)
    from dqn_cartpole.console import quiet

    quiet.silence()
    import tensorflow as tf

    from dqn_cartpole.config import load_config
    from dqn_cartpole.core import build
    from dqn_cartpole.distributed.policy_lag import make_lagged_train_step
    from dqn_cartpole.training.loop import compile_iterations, make_train_step

    default = os.path.join(REPO, "configs", "default.yaml")
    fill_steps = 1000 + 300 + steps + 100  # the learner-side replay reads one item per step: the queue holds them all
    overrides = [f"replay.backend={'tf_uniform' if mode == 'tf_uniform' else 'reverb'}"]
    if mode != "tf_uniform":
        overrides += [f"distributed.replay={mode}", "distributed.samples_per_insert=null",  # the fill writes alone
                      f"distributed.samples_per_insert_tolerance={256 * 2 * fill_steps}"]  # padded windows too
    config = load_config(default, overrides)
    with contextlib.ExitStack() as stack:
        envs = build.make_envs(config, stack)
        agent = build.make_agent(config, envs.tf_env)
        spec, length = agent.collect_data_spec, agent.window_length
        if mode == "tf_uniform":
            replay = writer = build.make_replay_buffer(config.replay, spec, config.env.num_envs, length, stack)
        else:
            address = start_server(default, overrides, stack)
            writer = build.make_stream_writers(config, spec, address, stack)
            config = load_config(default, overrides[:2])  # the learner keeps the default samples per insert
            replay = build.make_learner_replay(config, spec, address, agent.train_step_counter, stack, 60_000) \
                if mode == "learner" else build.make_replay_client(config.replay, spec, 1, length, address, stack,
                                                                   rate_limiter_timeout_ms=60_000)
        fill = tf.function(build.make_random_driver(envs.tf_env, [writer.add_batch], fill_steps).run, autograph=False)
        started = time.perf_counter()
        fill(envs.tf_env.reset(), ())
        if mode != "tf_uniform":
            writer.flush()
        insert_rate = fill_steps / (time.perf_counter() - started)
        if mode == "learner":
            replay.fill(lambda: False)
        sample = replay.sampler(config.training.batch_size, length, with_tags=mode != "tf_uniform")
        make_step = make_train_step if mode == "tf_uniform" else make_lagged_train_step
        run = compile_iterations(make_step(agent, sample, 1, config.training.jit_compile))
        run((), (), tf.constant(300))  # traces and warms up
        started = time.perf_counter()
        run((), (), tf.constant(steps))
        rate = steps / (time.perf_counter() - started)
    print(json.dumps({"train_steps_per_s": rate, "inserts_per_s": insert_rate}))


# ---------------------------------------------------------------------------- the local topology


def timed_train(out: str, options: list, overrides: list) -> tuple[dict, float]:
    """`train OPTIONS` on the default config into `out`; returns (summary.json, the launch's Unix time)."""
    started = time.time()
    return run_train(None, out, ["video.enabled=false", *overrides], tuple(options)), started


def local_run(collectors: int, out: str, overrides: list) -> tuple[dict, float]:
    """`train --topology local` on the default config; returns (summary.json, the launch's Unix time)."""
    return timed_train(out, ["--topology", "local", "--collectors", str(collectors)], overrides)


def local_throughput(collectors: int, iterations: int, workdir: str, overrides: tuple = (), tag: str = "") -> dict:
    """The collectors' summed env steps/s (their CSVs' last rows) and the learner's train steps/s."""
    out = os.path.join(workdir, f"local-{collectors}{tag}")
    summary, _ = local_run(collectors, out, [f"training.num_iterations={iterations}",
                                              "evaluation.stop_when_solved=false", *overrides])
    env_rate = 0.0
    for i in range(collectors):
        with open(os.path.join(out, "roles", f"collector-{i}.csv"), encoding="utf-8") as handle:
            env_rate += float(handle.read().strip().splitlines()[-1].split(",")[3])  # env_steps_per_s
    return {"env_steps_per_s": env_rate, "train_steps_per_s": summary["iterations_per_s"]}


# ---------------------------------------------------------------------------- time to a solve-checked policy


def plain_tf_score(policy: str) -> tuple[float, float]:
    """(mean, min) return of `policy` over 100 fresh CartPole-v1 episodes, in plain TensorFlow."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    result = subprocess.run([sys.executable, "-I", "-c", PLAIN_TF_SCORE, policy], env=env, capture_output=True,
                            text=True, cwd=tempfile.gettempdir())
    if result.returncode != 0:
        raise SystemExit(f"plain TensorFlow could not play {policy}:\n{result.stderr[-2000:]}")
    mean, low = result.stdout.split()[-2:]
    return float(mean), float(low)


def solve_result(out: str, summary: dict, started: float) -> dict:
    """Seconds from the launch until the solve-checked policy/final was saved, env steps, plain-TF score."""
    final = os.path.join(out, "policy", "final")
    solved = summary.get("solved_at_iteration") is not None
    result = {"solved": solved, "env_steps": summary.get("solved_env_steps"),
              "time_s": os.path.getmtime(os.path.join(final, "policy_info.json")) - started if solved else None}
    result["score"] = plain_tf_score(final) if solved else (float("nan"), float("nan"))
    return result


def time_to_solve(seed: int, collector_counts: list, workdir: str, ray: bool) -> dict:
    """{"single": result, N: result for each number of collectors, ("ray", N) too with `ray`} for one seed."""
    out = os.path.join(workdir, f"solve-single-{seed}")
    results = {"single": solve_result(out, *timed_train(out, [], [f"training.seed={seed}"]))}
    for n in collector_counts:
        out = os.path.join(workdir, f"solve-local{n}-{seed}")
        results[n] = solve_result(out, *local_run(n, out, [f"training.seed={seed}"]))
    for n in collector_counts if ray else ():
        out = os.path.join(workdir, f"solve-ray{n}-{seed}")
        summary, started, ray_stats = benchmark_ray.ray_solve_run(n, out, [f"training.seed={seed}"])
        results[("ray", n)] = {**solve_result(out, summary, started), **ray_stats}
    return results


# ---------------------------------------------------------------------------- the report


def cell(result: dict) -> str:
    if not result["solved"]:
        return "**not solved**"
    mean, low = result["score"]
    ray = (f"; Ray's start-up {result['ray_startup_s']:.1f} s, peak RSS Ray {result['ray_rss_mb']:,.0f} MB, roles "
           f"{result['roles_rss_mb']:,.0f} MB (PSS {result['roles_pss_mb']:,.0f} MB)"
           ) if "ray_startup_s" in result else ""
    return f"{result['time_s']:.1f} s, {result['env_steps']:,} env steps; plain TF {mean:.1f} (min {low:.0f}){ray}"


def column(name) -> str:
    return f"ray, {name[1]} collector(s)" if isinstance(name, tuple) else f"local, {name} collector(s)"


def print_solve_table(seeds: list, collector_counts: list, workdir: str, ray: bool = False) -> None:
    names = ["single", *collector_counts, *([("ray", n) for n in collector_counts] if ray else [])]
    print("\n| default config, seed | one process | " + " | ".join(column(name) for name in names[1:])
          + " |\n|" + " --- |" * (len(names) + 1), flush=True)
    by_name: dict = {name: [] for name in names}
    for seed in seeds:
        results = time_to_solve(seed, collector_counts, workdir, ray)
        for name in names:
            by_name[name].append(results[name])
        print(f"| {seed} | " + " | ".join(cell(results[name]) for name in names) + " |", flush=True)
    medians = {name: statistics.median(r["time_s"] if r["solved"] else float("inf") for r in rows)
               for name, rows in by_name.items()}
    print("| **median** | " + " | ".join(
        f"**{medians[name]:.1f} s**" + ("" if name == "single" else f" (**x{medians[name] / medians['single']:.2f}**"
                                        + (f", **x{medians[name] / medians[name[1]]:.2f}** local"
                                           if isinstance(name, tuple) else "") + ")")
        for name in names) + " |", flush=True)
    for name in names:
        if isinstance(name, tuple):
            runs = by_name[name]
            print(f"\n{column(name)}: Ray's start-up (the command's `ray.init` of a local instance) median "
                  f"{statistics.median(r['ray_startup_s'] for r in runs):.1f} s; peak RSS of Ray's processes (GCS, "
                  f"raylet, agents, the actors' workers) median {statistics.median(r['ray_rss_mb'] for r in runs):,.0f}"
                  f" MB, of the roles' processes {statistics.median(r['roles_rss_mb'] for r in runs):,.0f} MB (PSS, "
                  f"shared pages once: {statistics.median(r['roles_pss_mb'] for r in runs):,.0f} MB)",
                  flush=True)


def scale_out_tables(collector_counts: list, iterations: int, seeds: list, reference: str, ray: bool = False,
                     ray_failures: bool = False, solve_only: bool = False) -> None:
    workdir = tempfile.mkdtemp(prefix="dqn-bench-")
    started = time.time()
    print(f"load average (1/5/15 min) at the start: {load_averages()}", flush=True)
    has_reference = os.path.isfile(reference)
    if not has_reference:
        print(f"no reference loop at {reference}: the ratios to it are skipped (give it with --reference PATH)",
              flush=True)
    before = reference_rate(reference, iterations) if has_reference else None

    if not solve_only:
        throughput_tables(collector_counts, iterations, workdir, before)
    print_solve_table(seeds, collector_counts, workdir, ray)
    if ray_failures:
        benchmark_ray.failure_table(workdir)
    after = reference_rate(reference, iterations) if has_reference else None
    if has_reference:
        print(f"\nreference loop (the tutorial's own): {before:.0f} it/s at the start, {after:.0f} at the end "
              f"(ratios above use the start)")
    print(f"load average at the end: {load_averages()}; the benchmark took {time.time() - started:.0f} s; runs in {workdir}")


def throughput_tables(collector_counts: list, iterations: int, workdir: str, before) -> None:
    """One process at the tutorial's settings, the learner alone, the local topology's throughput."""
    rates = tutorial_rates(iterations, workdir)
    print("\n| one process, tutorial hyperparameters | it/s | x the reference loop |\n| --- | --- | --- |")
    for (backend, driver), rate in rates.items():
        ratio = f"{rate / before:.1f}" if before else "-"
        print(f"| {backend}, `collection.driver: {driver}` | {rate:.0f} | **{ratio}** |", flush=True)

    print("\n| the learner alone (default config) | train steps/s | x tf_uniform | items/s this process "
          "inserted |\n| --- | --- | --- | --- |")
    learners = {mode: learner_rate(mode, iterations) for mode in LEARNER_MODES}
    for mode, name in LEARNER_MODES.items():
        r = learners[mode]
        ratio = r["train_steps_per_s"] / learners["tf_uniform"]["train_steps_per_s"]
        print(f"| {name} | {r['train_steps_per_s']:.0f} | **{ratio:.2f}** | {r['inserts_per_s']:,.0f} |", flush=True)

    print(f"\n| train --topology local, default config, {iterations} iterations | collectors' env steps/s | "
          "learner train steps/s |\n| --- | --- | --- |")
    for n in collector_counts:
        r = local_throughput(n, iterations, workdir)
        print(f"| {n} collector(s) | {r['env_steps_per_s']:.0f} | {r['train_steps_per_s']:.0f} |", flush=True)


# The server's shared table with no samples-per-insert ratio (the collectors write as fast as they go), uniform and
# prioritized (Ape-X: each collector computes its windows' priorities from the weights it pulled).
SHARED_TABLE = ("replay.backend=reverb", "distributed.replay=server", "distributed.samples_per_insert=null")
PRIORITY_VARIANTS = {"uniform": SHARED_TABLE, "prioritized": SHARED_TABLE + ("replay.prioritized=true",)}


def priorities_table(collector_counts: list, iterations: int, rounds: int, reference: str) -> None:
    """The collectors' env steps/s on the shared table, uniform against prioritized, `rounds` alternating pairs per
    number of collectors, between two runs of the reference loop."""
    workdir = tempfile.mkdtemp(prefix="dqn-bench-priorities-")
    print(f"load average (1/5/15 min) at the start: {load_averages()}", flush=True)
    before = reference_rate(reference, iterations) if os.path.isfile(reference) else None
    print(f"\n| train --topology local, default config, {iterations} iterations, `{', '.join(SHARED_TABLE)}` | "
          f"uniform: collectors' env steps/s (each pair) | prioritized | median ratio |\n| --- | --- | --- | --- |")
    for n in collector_counts:
        rates: dict = {name: [] for name in PRIORITY_VARIANTS}
        for round_ in range(rounds):
            for name, overrides in PRIORITY_VARIANTS.items():
                result = local_throughput(n, iterations, workdir, overrides, f"-{name}-{round_}")
                rates[name].append(result["env_steps_per_s"])
        ratio = statistics.median(p / u for u, p in zip(rates["uniform"], rates["prioritized"]))
        print(f"| {n} collector(s) | {', '.join(f'{v:.0f}' for v in rates['uniform'])} | "
              f"{', '.join(f'{v:.0f}' for v in rates['prioritized'])} | **{ratio:.2f}** |", flush=True)
    after = reference_rate(reference, iterations) if before else None
    if before:
        print(f"\nreference loop (the tutorial's own): {before:.0f} it/s at the start, {after:.0f} at the end")
    print(f"load average at the end: {load_averages()}; runs in {workdir}")


def main(argv: list) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale-out", default="1,2", metavar="N,N,...", help="numbers of collectors")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--iterations", type=int, default=6000, help="iterations per throughput run")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, metavar="PATH",
                        help="the tutorial's training loop, run for the ratios and as a gauge of the machine's load")
    parser.add_argument("--ray", action="store_true",
                        help="add `train --topology ray` (a local Ray instance per run) to the time-to-solve table")
    parser.add_argument("--ray-failures", action="store_true",
                        help="add one --topology ray run per failure of one role (scripts/benchmark_ray.py)")
    parser.add_argument("--solve-only", action="store_true",
                        help="only the time-to-solve table (and the failure runs): no throughput tables")
    parser.add_argument("--priorities", type=int, default=0, metavar="ROUNDS",
                        help="only the Ape-X table: each number of collectors on the server's shared table, uniform "
                             "and prioritized, ROUNDS alternating pairs (the collectors' env steps/s)")
    parser.add_argument("--learner-child", default=None, choices=list(LEARNER_MODES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.learner_child is not None:
        learner_child(args.learner_child, args.iterations)
        return
    if not re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*", args.scale_out):
        raise UserError(f"--scale-out {args.scale_out}: expected numbers of collectors like 1,2")
    if args.priorities < 0:
        raise UserError(f"--priorities {args.priorities}: expected a number of rounds, 1 or more")
    if args.priorities:
        priorities_table([int(v) for v in args.scale_out.split(",")], args.iterations, args.priorities, args.reference)
        return
    scale_out_tables([int(v) for v in args.scale_out.split(",")], args.iterations, parse_seeds(args.seeds),
                     args.reference, args.ray, args.ray_failures, args.solve_only)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
