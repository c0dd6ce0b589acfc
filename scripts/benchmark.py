"""Speed benchmark: time to solve, throughput against the tutorial loop, evaluation time, memory.

Usage: python scripts/benchmark.py [--seeds 0,1,2,3,4] [--iterations 6000] [--reference PATH] [--set KEY=VALUE]
       python scripts/benchmark.py --scale-out 1,2,4 [--iterations 6000] [--seeds 0]

Prints one table:
  * time to solve CartPole-v1 on configs/default.yaml for each seed: wall seconds from process
    start until a policy is saved whose greedy average return over 100 episodes is >= 475, and
    the env steps it took; with the median;
  * iterations per second at the tutorial's hyperparameters (one env step and one gradient
    step of batch 64 per iteration) for each replay backend with the compiled driver, and with
    `collection.driver: py` (the tutorial's PyDriver loop) on tf_uniform and Reverb, and the ratio against
    the tutorial's own loop (`--reference PATH`, by default ../shared/bench/reference_loop.py
    next to the repository) run in the same benchmark (steady state: both exclude evaluation and
    the first 1,000 iterations, which include tracing); without that file the ratios are skipped;
  * 10 greedy CartPole-v1 episodes of a solved policy (5,000 steps): seconds;
  * peak RSS of the default run.
With `--scale-out 1,2,4 [--seeds 0]` it prints only the scale-out section instead:
  * `train --topology local` with each number of collectors on the default config (no ratio): the
    collectors' summed env steps/s and the learner's train steps/s;
  * the learner's compiled gradient step alone on a pre-filled replay: tf_uniform and Reverb in the
    same process, and a `replay-server` process over loopback (train steps/s, sampled items/s), with
    the items/s one process inserts while a random policy steps its envs;
  * time to solve CartPole-v1 on the default config, single-process against the local topology with
    2 collectors, for each seed.
Absolute times drift on shared machines; the ratios are measured side by side.
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_REFERENCE = os.path.join(os.path.dirname(REPO), "shared", "bench", "reference_loop.py")
BACKENDS = ("tf_uniform", "py_uniform", "reverb")


def run_train(config: str, out: str, overrides: list[str]) -> dict:
    """Runs `train` in a fresh process; returns its summary.json."""
    args = [sys.executable, "-m", "dqn_cartpole", "train", "--config", os.path.join(REPO, "configs", config),
            "--output-dir", out, "--quiet", "--overwrite"]
    for item in overrides:
        args += ["--set", item]
    result = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"train failed ({' '.join(args)}):\n{result.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def time_to_solve(seeds: list[int], workdir: str, overrides: list[str]) -> list[dict]:
    results = []
    for seed in seeds:
        out = os.path.join(workdir, f"default-s{seed}")
        summary = run_train("default.yaml", out, ["video.enabled=false", f"training.seed={seed}", *overrides])
        solved = summary["solved_at_iteration"] is not None
        results.append({"seed": seed, "solved": solved, "time_s": summary["solved_wall_s"],
                        "env_steps": summary["solved_env_steps"],
                        "peak_rss_mb": summary["peak_rss_mb"], "run": out})
        print(f"  seed {seed}: {'solved' if solved else 'NOT solved'} "
              f"{summary['solved_wall_s'] or summary['wall_s']:.1f} s", file=sys.stderr, flush=True)
    return results


def reference_rate(reference: str, iterations: int) -> float:
    """Steady-state iterations/s of the tutorial loop (after its first 1,000 iterations)."""
    result = subprocess.run([sys.executable, reference, str(iterations)], cwd=REPO, capture_output=True, text=True)
    lines = re.findall(r"iter (\d+) return \S+ loss \S+ wall_s (\S+) eval_s (\S+)", result.stdout)
    if len(lines) < 2:
        raise SystemExit(f"reference loop failed:\n{result.stdout[-1000:]}\n{result.stderr[-2000:]}")
    (first_it, first_wall, _), rest = lines[0], lines[1:]
    span = float(rest[-1][1]) - float(first_wall) - sum(float(e) for _, _, e in rest)
    return (int(rest[-1][0]) - int(first_it)) / span


def project_rate(backend: str, iterations: int, workdir: str, extra: list[str], driver: str = "compiled") -> float:
    """Steady-state it/s of `train` at the tutorial's hyperparameters, with `collection.driver: driver`."""
    sampling = "dataset" if backend == "reverb" else "direct"
    out = os.path.join(workdir, f"tutorial-{backend}-{driver}")
    summary = run_train("tutorial.yaml", out, [f"training.num_iterations={iterations}", "video.enabled=false",
                                               f"replay.backend={backend}", f"replay.sampling={sampling}",
                                               f"collection.driver={driver}",
                                               "evaluation.eval_interval=1000", *extra])
    return summary["iterations_per_s"]


def scale_out(collectors: int, iterations: int, workdir: str) -> dict:
    """`train --topology local` with `collectors` collectors on the default config (no early stop, no
    samples-per-insert ratio):
    the collectors' summed env steps/s (their CSVs' last rows) and the learner's train steps/s."""
    out = os.path.join(workdir, f"local-{collectors}")
    args = [sys.executable, "-m", "dqn_cartpole", "train", "--topology", "local", "--collectors", str(collectors),
            "--output-dir", out, "--quiet", "--overwrite", "--set", f"training.num_iterations={iterations}",
            "--set", "evaluation.stop_when_solved=false", "--set", "video.enabled=false",
            "--set", "distributed.samples_per_insert=null"]  # unthrottled: what each side can do
    result = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"local topology failed:\n{result.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    env_rate = 0.0
    for i in range(collectors):
        with open(os.path.join(out, "roles", f"collector-{i}.csv"), encoding="utf-8") as handle:
            last = handle.read().strip().splitlines()[-1].split(",")
        env_rate += float(last[3])  # env_steps_per_s
    return {"collectors": collectors, "env_steps_per_s": env_rate, "train_steps_per_s": summary["iterations_per_s"]}


LEARNER_MODES = ("tf_uniform (embedded)", "reverb (embedded)", "reverb (server process, loopback)")


def learner_rate(mode: int, steps: int) -> dict:
    """One `--learner-child` run in a fresh process: see `learner_child`."""
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--learner-child", str(mode),
                             "--iterations", str(steps)], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"learner benchmark ({LEARNER_MODES[mode]}) failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def learner_child(mode: int, steps: int) -> None:
    """The learner's compiled gradient step alone (default config: batch 64, 3-step windows), on a replay
    filled with 5,000 random steps beforehand, no collection: train steps/s, and the items/s one process
    writes into the replay (the fill). Mode 2 starts a `replay-server` process and reads it over loopback."""
    import contextlib

    sys.path.insert(0, REPO)
    from dqn_cartpole.console import quiet

    quiet.silence()
    import tensorflow as tf

    from dqn_cartpole.config import load_config
    from dqn_cartpole.core import build
    from dqn_cartpole.distributed.launcher import READY_LINE, free_port
    from dqn_cartpole.replay.base import sequence_length_for
    from dqn_cartpole.training.loop import compile_iterations, make_train_step

    backend = "tf_uniform" if mode == 0 else "reverb"
    config = load_config(os.path.join(REPO, "configs", "default.yaml"), [f"replay.backend={backend}"])
    cfg_replay, n_step = config.replay, config.agent.n_step
    with contextlib.ExitStack() as stack:
        envs = build.make_envs(config, stack)
        agent = build.make_agent(config, envs.tf_env)
        if mode < 2:
            replay = build.make_replay_buffer(cfg_replay, agent.collect_data_spec, config.env.num_envs, n_step, stack)
        else:
            port = free_port()
            server = subprocess.Popen([sys.executable, "-m", "dqn_cartpole", "replay-server", "--config",
                                       os.path.join(REPO, "configs", "default.yaml"), "--set", "replay.backend=reverb",
                                       "--set", "distributed.samples_per_insert=null",  # the fill writes alone
                                       "--replay-address", f"localhost:{port}", "--run-dir",
                                       tempfile.mkdtemp(prefix="dqn-bench-server-")],
                                      cwd=REPO, stderr=subprocess.PIPE, text=True)
            stack.callback(server.wait)
            stack.callback(server.terminate)
            while READY_LINE not in server.stderr.readline():
                if server.poll() is not None:
                    raise SystemExit("the replay server did not start")
            replay = build.make_replay_client(cfg_replay, agent.collect_data_spec, config.env.num_envs, n_step,
                                              f"localhost:{port}", stack, rate_limiter_timeout_ms=60_000)
        fill = build.make_random_driver(envs.tf_env, [replay.add_batch], 5000)
        run_fill = tf.function(fill.run, autograph=False)
        run_fill(envs.tf_env.reset(), ())
        started, before = time.perf_counter(), replay.inserts()
        run_fill(envs.tf_env.current_time_step(), ())
        insert_rate = (replay.inserts() - before) / (time.perf_counter() - started)
        sample = replay.sampler(config.training.batch_size, sequence_length_for(n_step))
        run = compile_iterations(make_train_step(agent, sample, 1, config.training.jit_compile))
        run((), (), tf.constant(200))  # traces and warms up
        started = time.perf_counter()
        run((), (), tf.constant(steps))
        rate = steps / (time.perf_counter() - started)
    print(json.dumps({"train_steps_per_s": rate, "inserts_per_s": insert_rate}))


def local_time_to_solve(seed: int, workdir: str) -> dict:
    """`train --topology local --collectors 2` on the default config until the evaluator's solve check passes."""
    out = os.path.join(workdir, f"local-solve-{seed}")
    args = [sys.executable, "-m", "dqn_cartpole", "train", "--topology", "local", "--collectors", "2",
            "--output-dir", out, "--quiet", "--overwrite", "--set", f"training.seed={seed}",
            "--set", "video.enabled=false"]
    started = time.time()
    result = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"local topology failed:\n{result.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    # From launch until the evaluator saved the policy its solve check confirmed (as `solved_wall_s` counts
    # from process start in a single-process run).
    final_info = os.path.join(out, "policy", "final", "policy_info.json")
    return {"seed": seed, "solved": summary.get("solved_at_iteration") is not None,
            "time_s": os.path.getmtime(final_info) - started, "env_steps": summary.get("solved_env_steps")}


def scale_out_tables(collector_counts: list[int], iterations: int, seeds: list[int], reference: str) -> None:
    """The scale-out section: collectors' throughput, the learner's, and time to solve, each measured here;
    the tutorial's reference loop first, as a gauge of how loaded the machine was."""
    workdir = tempfile.mkdtemp(prefix="dqn-bench-")
    if os.path.isfile(reference):
        print(f"reference loop (tutorial) in this run: {reference_rate(reference, iterations):.0f} it/s\n", flush=True)
    print("| collectors | env steps/s (all collectors) | learner train steps/s |\n| --- | --- | --- |")
    for n in collector_counts:
        r = scale_out(n, iterations, workdir)
        print(f"| {n} | {r['env_steps_per_s']:.0f} | {r['train_steps_per_s']:.0f} |", flush=True)
    print("\n| learner reads | train steps/s (batch 64) | sampled items/s | items/s one process inserts |\n"
          "| --- | --- | --- | --- |")
    for mode, name in enumerate(LEARNER_MODES):
        r = learner_rate(mode, iterations)
        print(f"| {name} | {r['train_steps_per_s']:.0f} | {64 * r['train_steps_per_s']:,.0f} | "
              f"{r['inserts_per_s']:,.0f} |", flush=True)
    print("\n| default config, seed | single process | local topology, 2 collectors |\n| --- | --- | --- |")
    for seed in seeds:
        single = time_to_solve([seed], workdir, [])[0]
        local = local_time_to_solve(seed, workdir)
        cells = [f"{r['time_s']:.1f} s, {r['env_steps']} env steps" if r["solved"] else "not solved"
                 for r in (single, local)]
        print(f"| {seed} | {cells[0]} | {cells[1]} |", flush=True)


def evaluation_seconds(policy_run: str) -> float:
    """Seconds for 10 greedy CartPole-v1 episodes of a saved policy (best of three)."""
    code = f"""
import time
from dqn_cartpole.console import quiet; quiet.silence()
from dqn_cartpole.run_folder.resolve import resolve_policy
from dqn_cartpole.run_folder.export import load_policy
from dqn_cartpole.core.envs import make_batched_env
from dqn_cartpole.core.evaluation import make_episode_runner
env = make_batched_env("CartPole-v1", 10, seed=123)
run = make_episode_runner(load_policy(resolve_policy({policy_run!r})[0]), env)
run()  # compiles
best, steps = 1e9, 0
for _ in range(3):
    t = time.perf_counter(); r = run(); best = min(best, time.perf_counter() - t)
    steps = int(r.lengths.sum())
print(best, steps)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-2000:])
    seconds, steps = result.stdout.split()[-2:]
    print(f"  evaluation: {steps} env steps", file=sys.stderr)
    return float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--iterations", type=int, default=6000, help="iterations per throughput run")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, metavar="PATH",
                        help="the tutorial's training loop, run for the speed ratios (default: %(default)s)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="override a key of the time-to-solve runs, e.g. replay.backend=reverb (repeatable)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--scale-out", default="", metavar="N,N,...",
                        help="only the scale-out section: train --topology local with each number of collectors, "
                             "the learner alone on each replay, time to solve local vs single-process (--seeds)")
    parser.add_argument("--learner-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.learner_child is not None:
        learner_child(args.learner_child, args.iterations)
        return
    if args.scale_out:
        scale_out_tables([int(v) for v in args.scale_out.split(",")], args.iterations,
                         [int(s) for s in args.seeds.split(",")], args.reference)
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    workdir = tempfile.mkdtemp(prefix="dqn-bench-")
    started = time.time()

    print("time to solve (default config)...", file=sys.stderr)
    solves = time_to_solve(seeds, workdir, args.overrides)
    print("throughput (tutorial hyperparameters)...", file=sys.stderr)
    rates = {}
    has_reference = os.path.isfile(args.reference)
    if not has_reference:
        print(f"no reference loop at {args.reference}: the speed ratios are skipped (give the tutorial's loop "
              f"with --reference PATH)", file=sys.stderr)
    reference_before = reference_rate(args.reference, args.iterations) if has_reference else None
    for backend in args.backends.split(","):
        rates[backend] = project_rate(backend, args.iterations, workdir, [])
    for backend in ("tf_uniform", "reverb"):  # the tutorial's own loop shape: PyDriver, then a compiled train step
        rates[f"{backend}, collection.driver: py"] = project_rate(backend, args.iterations, workdir, [], driver="py")
    rates["tf_uniform, 8 envs x 8 steps"] = project_rate(
        "tf_uniform", args.iterations // 8, workdir,
        ["env.num_envs=8", "training.collect_steps_per_iteration=8", "training.train_steps_per_iteration=8",
         "evaluation.eval_interval=125", "training.log_interval=25"]) * 8
    reference_after = reference_rate(args.reference, args.iterations) if has_reference else None
    solved_run = next((s["run"] for s in solves if s["solved"]), None)
    eval_s = evaluation_seconds(solved_run) if solved_run else float("nan")

    print(f"\n| measure | value |\n| --- | --- |")
    for s in solves:
        value = f"{s['time_s']:.1f} s, {s['env_steps']} env steps" if s["solved"] else "not solved in budget"
        print(f"| time to solve, seed {s['seed']} | {value} |")
    ok = [s for s in solves if s["solved"]]
    if ok:
        print(f"| **time to solve, median** | **{statistics.median(s['time_s'] for s in ok):.1f} s, "
              f"{statistics.median(s['env_steps'] for s in ok):.0f} env steps** "
              f"({len(ok)}/{len(solves)} seeds solved) |")
    if has_reference:
        reference = (reference_before + reference_after) / 2
        print(f"| reference loop (tutorial), it/s | {reference:.0f} (before {reference_before:.0f}, "
              f"after {reference_after:.0f}) |")
    for name, rate in rates.items():
        ratio = f" (**{rate / reference:.1f}x** the reference)" if has_reference else ""
        print(f"| {name}, it/s | {rate:.0f}{ratio} |")
    print(f"| 10 greedy episodes of CartPole-v1 (5,000 steps) | {eval_s:.2f} s |")
    print(f"| peak RSS of a default run | {max(s['peak_rss_mb'] for s in solves):.0f} MB |")
    print(f"\n(benchmark took {time.time() - started:.0f} s; runs in {workdir})")


if __name__ == "__main__":
    main()
