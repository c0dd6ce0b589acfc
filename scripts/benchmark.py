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
With `--scale-out 1,2,4 [--seeds 0]` it runs scripts/benchmark_scale_out.py instead (see there).
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
                        help="only the scale-out section (scripts/benchmark_scale_out.py, which takes the other "
                             "arguments too): train --topology local with each number of collectors, the learner "
                             "alone on each replay, time to solve local vs single-process (--seeds)")
    if "--scale-out" in sys.argv[1:] or any(a.startswith("--scale-out=") for a in sys.argv[1:]):
        import benchmark_scale_out  # scripts/ is on the path when this file runs as a script

        benchmark_scale_out.main(sys.argv[1:])
        return
    args = parser.parse_args()
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
