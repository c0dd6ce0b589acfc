"""Worker-reuse benchmark (issue 26, point 4): `python scripts/benchmark.py --reuse [--seeds 0-3] [--repeats 1]`
(or this file directly, with the same arguments).

The same default runs (configs/default.yaml, videos included; one run per seed), one at a time, two ways, side by
side in this one run, next to the tutorial's reference loop (run first and last as a gauge of the machine's load):
  * fresh: each run its own `python -m dqn_cartpole train --quiet` process, as a local sweep's child or a Ray task
    runs it today: TensorFlow imported again for every run;
  * reused: one process that trains the runs one after another in-process (`training.run.run_here`, through
    `dqn_cartpole.train`), as a long-lived worker would: TensorFlow imported once, its ops on one thread set once at
    the process's start (as a fresh default run sets them for itself).
It prints each run's wall seconds (fresh: the process's start to its exit; reused: the call, and the process's
start-up before its first run apart), each run's env steps to solve (a seed must solve in the same env steps both
ways) and the reused process's peak memory after each run (a run must not leave the next ones a bigger process).
With --repeats N the two ways alternate N times, in a rotated order.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmark import DEFAULT_REFERENCE, REPO, reference_rate
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments.grid import parse_seeds

DEFAULT_CONFIG = os.path.join(REPO, "configs", "default.yaml")

# The reused process: imports the package, sets TensorFlow's threads once (a worker's start), then trains each seed
# in turn and prints one JSON line per run.
REUSED = """
import json, resource, sys, time
started = float(sys.argv[1])
import dqn_cartpole as dq
from dqn_cartpole.console.imports import import_tensorflow
import_tensorflow()
from dqn_cartpole.training.loop import run_ops_on_one_thread
run_ops_on_one_thread()
print(json.dumps({"startup_s": time.time() - started}), flush=True)
for seed in json.loads(sys.argv[3]):
    t = time.time()
    run = dq.train(sys.argv[2], f"{sys.argv[4]}/s{seed}", overrides={"training.seed": seed}, progress=False)
    print(json.dumps({"seed": seed, "wall_s": time.time() - t,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)
"""


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
    env.update(PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy")
    return env


def summary(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def fresh_runs(root: str, seeds: list, config: str) -> dict:
    """Each seed in its own `train` process: {seed: (wall seconds, env steps to solve)}."""
    runs = {}
    for seed in seeds:
        run_dir = os.path.join(root, f"s{seed}")
        argv = [sys.executable, "-m", "dqn_cartpole", "train", "--config", config, "--output-dir", run_dir,
                "--quiet", "--set", f"training.seed={seed}"]
        start = time.time()
        proc = subprocess.run(argv, cwd=REPO, env=child_env(), capture_output=True, text=True)
        wall_s = time.time() - start
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({' '.join(argv)}):\n{proc.stderr[-2000:]}")
        runs[seed] = {"wall_s": wall_s, "solved": summary(run_dir).get("solved_env_steps")}
        print(f"  fresh s{seed}: {wall_s:.1f} s", file=sys.stderr, flush=True)
    return {"total_s": sum(r["wall_s"] for r in runs.values()), "runs": runs}


def reused_runs(root: str, seeds: list, config: str) -> dict:
    """Every seed in one process, one after another: its start-up, and per seed (wall seconds, env steps to solve,
    the process's peak memory after the run)."""
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", REUSED, str(start), config, json.dumps(seeds), root], cwd=REPO,
                          env=child_env(), capture_output=True, text=True)
    total_s = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"the reused process failed:\n{proc.stderr[-3000:]}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    runs = {}
    for line in lines[1:]:
        runs[line["seed"]] = {"wall_s": line["wall_s"], "rss_mb": line["rss_mb"],
                              "solved": summary(os.path.join(root, f"s{line['seed']}")).get("solved_env_steps")}
        print(f"  reused s{line['seed']}: {line['wall_s']:.1f} s", file=sys.stderr, flush=True)
    return {"total_s": total_s, "startup_s": lines[0]["startup_s"], "runs": runs}


def tables(config: str, fresh: list, reused: list, seeds: list, references: tuple, loads: tuple) -> list[str]:
    med = statistics.median
    lines = [f"{len(seeds)} runs of {os.path.basename(config)}, seeds {','.join(map(str, seeds))}, one "
             f"at a time; medians over the repeats (each repeat in brackets):", "",
             "| way | all runs, wall time | speed-up | start-up before the first run | " +
             " | ".join(f"s{s}" for s in seeds) + " |", "| --- |" + " --- |" * (3 + len(seeds))]
    base = med(r["total_s"] for r in fresh)
    for label, results in (("fresh process per run", fresh), ("one reused process", reused)):
        total = med(r["total_s"] for r in results)
        startup = f"{med(r['startup_s'] for r in results):.1f} s" if "startup_s" in results[0] else "in each run"
        per_seed = [f"{med(r['runs'][s]['wall_s'] for r in results):.1f} s" for s in seeds]
        each = ", ".join(f"{r['total_s']:.0f}" for r in results)
        lines.append(f"| {label} | {total:.1f} s ({each}) | "
                     f"{base / total:.2f} | {startup} | " + " | ".join(per_seed) + " |")
    lines += ["", "| seed | env steps to solve, fresh | env steps to solve, reused | same | reused process's peak "
                  "RSS after the run |", "| --- | --- | --- | --- | --- |"]
    for s in seeds:
        steps = [r["runs"][s]["solved"] for r in fresh + reused]
        rss = ", ".join(f"{r['runs'][s]['rss_mb']:.0f}" for r in reused)
        lines.append(f"| {s} | {fresh[0]['runs'][s]['solved']} | {reused[0]['runs'][s]['solved']} | "
                     f"{'yes' if len(set(map(str, steps))) == 1 else '**no**'} | {rss} MB |")
    lines += ["", f"The tutorial's reference loop: {sum(references) / 2:.0f} it/s (before {references[0]:.0f}, after "
                  f"{references[1]:.0f}); load average (1 min) {loads[0]:.2f} before, {loads[1]:.2f} after."]
    return lines


def main(argv: list) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse", action="store_true", help=argparse.SUPPRESS)  # benchmark.py's switch
    parser.add_argument("--seeds", default="0-3")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the runs' config (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, metavar="PATH")
    parser.add_argument("--iterations", type=int, default=6000, help="iterations of the reference loop")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if args.repeats <= 0:
        raise UserError(f"--repeats: must be positive, got {args.repeats}")
    if not os.path.isfile(args.reference):
        raise UserError(f"--reference {args.reference}: no such file (the tutorial's loop is the yardstick)")
    started, load_before = time.time(), os.getloadavg()[0]
    reference_before = reference_rate(args.reference, args.iterations)
    fresh, reused = [], []
    with tempfile.TemporaryDirectory(prefix="dqn-reuse-bench-") as root:
        for repeat in range(args.repeats):
            order = [("fresh", fresh_runs, fresh), ("reused", reused_runs, reused)]
            for label, way, results in (order if repeat % 2 == 0 else order[::-1]):
                results.append(way(os.path.join(root, f"{label}-{repeat}"), seeds, args.config))
        reference_after = reference_rate(args.reference, args.iterations)
    loads = (load_before, os.getloadavg()[0])
    print("\n".join(tables(args.config, fresh, reused, seeds, (reference_before, reference_after), loads)))
    print(f"\n(benchmark took {time.time() - started:.0f} s)")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UserError as exc:  # bad input: one line, exit status 2
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
