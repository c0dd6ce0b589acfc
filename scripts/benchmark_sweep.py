"""Sweep benchmark: `python scripts/benchmark.py --sweep [--seeds 0-7] [--repeats 1] [--markdown docs/benchmarks.md]`
(or this file directly, with the same arguments).

The same sweep of default runs three ways, side by side in this one run (`sweep --jobs 2` with a fresh process per
run, `sweep --ray`, `sweep --jobs 2`): what it runs and prints is in docs/benchmarks.md ("Sweep records").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time

from benchmark_common import (DEFAULT_REFERENCE, REPO, measured_between, median, reference_rate, run_main,
                              run_stoppable, splice_between)
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments.grid import parse_seeds

BEGIN, END = "<!-- benchmark_sweep.py: begin -->", "<!-- benchmark_sweep.py: end -->"
STARTUP = "start-up and imports"
RAY_LINE = re.compile(r"ray: started a local Ray instance in ([\d.]+) s.*?; (\d+) run folders back \(([\d.]+) MB; "
                      r"packed in ([\d.]+) s on the workers, fetched in ([\d.]+) s, unpacked in ([\d.]+) s\)")


# The sweeps compared: a label, whether it runs on Ray, and what it adds to the environment.
BASE = "--jobs 2, a fresh process per run"
VARIANTS = ((BASE, False, {"DQN_CARTPOLE_FRESH_RUNS": "1"}), ("--ray", True, {}), ("--jobs 2", False, {}))


def run_sweep(root: str, name: str, seeds: str, ray: bool, extra_env: dict) -> dict:
    """One `sweep` command of default runs; its wall seconds, its runs' summaries and (with Ray) its `ray:` line."""
    argv = [sys.executable, "-m", "dqn_cartpole", "sweep", "--config", os.path.join(REPO, "configs", "default.yaml"),
            "--seeds", seeds, "--name", name, "--set", f"output.root={root}", "--quiet",
            *(["--ray"] if ray else ["--jobs", "2"])]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "OMP_NUM_THREADS", "DQN_CARTPOLE_FRESH_RUNS")}  # --ray: local
    env.update(PYTHONPATH=REPO, **extra_env)
    start = time.time()
    proc = run_stoppable(argv, env=env)  # a stopped benchmark stops the sweep, which stops its runs
    wall_s = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed ({' '.join(argv)}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    folder = os.path.join(root, "sweeps", name)
    runs = {}
    for member in sorted(os.listdir(folder)):
        path = os.path.join(folder, member, "summary.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                runs[member] = json.load(handle)
    result = {"wall_s": wall_s, "runs": runs}
    if ray:
        match = RAY_LINE.search(proc.stdout)
        if not match:
            raise SystemExit(f"no `ray:` line in the sweep's output:\n{proc.stdout[-2000:]}")
        result["ray"] = dict(zip(("start_s", "folders", "mb", "pack_s", "get_s", "unpack_s"),
                                 (float(v) for v in match.groups())))
    print(f"  sweep {name}: {wall_s:.1f} s (load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    return result


def run_seconds(summary: dict) -> float:
    """A run's seconds from its process start to its summary (its phases; plots and videos included)."""
    return sum(summary.get("phases", {}).values())


def variant_rows(label: str, results: list, base_wall: float) -> list[str]:
    runs = [s for r in results for s in r["runs"].values()]
    wall = median(r["wall_s"] for r in results)
    per_run, startup = median(run_seconds(s) for s in runs), median(s["phases"][STARTUP] for s in runs)
    loop = median(s["phases"].get("loop", 0.0) + s["phases"].get("tracing and XLA", 0.0) for s in runs)
    packed = median(sum(run_seconds(s) for s in r["runs"].values()) / 2 for r in results)
    idle = median(r["wall_s"] - sum(run_seconds(s) for s in r["runs"].values()) / 2 for r in results)
    each = ", ".join(f"{r['wall_s']:.0f}" for r in results)
    return [f"| `sweep {label}` | {wall:.1f} s ({each}) | "
            f"{base_wall / wall:.2f} | {per_run:.1f} s | {startup:.1f} s ({100 * startup / per_run:.0f}%) | "
            f"{loop:.1f} s | {packed:.1f} s | {idle:.1f} s |"]


def tables(results: dict, references: tuple, loads: tuple, seeds: list) -> list[str]:
    base = median(r["wall_s"] for r in results[BASE])
    lines = [f"{len(seeds)} default runs (configs/default.yaml, videos included), seeds {seeds[0]}-{seeds[-1]}, "
             f"2 at a time; medians over the repeats (each repeat's wall time in brackets):", "",
             "| sweep | wall time | speed-up over `--jobs 2` with a fresh process per run (as before reused workers) | one run, process start to summary (median) | its "
             "start-up and imports | its loop (tracing included) | the runs' seconds / 2 | the rest: wall time - "
             "the runs' seconds / 2 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, _, _ in VARIANTS:
        lines += variant_rows(label, results[label], base)
    ray = results["--ray"]
    transfer = median(r["ray"]["pack_s"] + r["ray"]["get_s"] + r["ray"]["unpack_s"] for r in ray)
    lines += ["", "| what Ray adds | seconds |", "| --- | --- |",
              f"| its start-up (`ray.init` of a local instance, 2 CPUs) | "
              f"{median(r['ray']['start_s'] for r in ray):.1f} |",
              f"| the run folders' way back, packed + fetched + unpacked ({median(r['ray']['mb'] for r in ray):.1f} "
              f"MB for {len(seeds)} runs) | {transfer:.2f} |",
              "", f"The tutorial's reference loop: {sum(references) / 2:.0f} it/s (before {references[0]:.0f}, after "
              f"{references[1]:.0f}); load average (1 min) {loads[0]:.2f} before, {loads[1]:.2f} after.", "",
              "| seed | " + " | ".join(f"env steps to solve, `{label}`" for label, _, _ in VARIANTS) + " | same |",
              "| --- |" + " --- |" * (len(VARIANTS) + 1)]
    for seed in seeds:
        name = f"base__s{seed}"
        steps = [r["runs"][name].get("solved_env_steps") or f"not solved ({r['runs'][name]['env_steps']})"
                 for label, _, _ in VARIANTS for r in results[label]]
        shown = [results[label][0]["runs"][name].get("solved_env_steps") for label, _, _ in VARIANTS]
        lines.append(f"| {seed} | " + " | ".join(str(v) for v in shown) +
                     f" | {'yes' if len(set(map(str, steps))) == 1 else '**no**'} |")
    return lines


def main(argv: list) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help=argparse.SUPPRESS)  # benchmark.py's switch
    parser.add_argument("--seeds", default="0-7")
    parser.add_argument("--repeats", type=int, default=1, help="sweeps of each kind, alternating (default 1)")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, metavar="PATH",
                        help="the tutorial's training loop, run first and last as a gauge of the machine's load")
    parser.add_argument("--iterations", type=int, default=6000, help="iterations of the reference loop")
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables into PATH between its "
                                                            "benchmark_sweep.py markers (e.g. docs/benchmarks.md)")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if args.repeats <= 0:
        raise UserError(f"--repeats: must be positive, got {args.repeats}")
    if not os.path.isfile(args.reference):
        raise UserError(f"--reference {args.reference}: no such file (the tutorial's loop is the yardstick)")
    seeds_text = ",".join(str(s) for s in seeds)
    started, load_before = time.time(), os.getloadavg()[0]
    reference_before = reference_rate(args.reference, args.iterations)
    results: dict = {label: [] for label, _, _ in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="dqn-sweep-bench-") as root:
        for repeat in range(args.repeats):
            order = VARIANTS[repeat % len(VARIANTS):] + VARIANTS[:repeat % len(VARIANTS)]  # rotated: load drifts
            for index, (label, on_ray, extra_env) in enumerate(order):
                name = f"r{repeat}-{VARIANTS.index((label, on_ray, extra_env))}"
                results[label].append(run_sweep(root, name, seeds_text, on_ray, extra_env))
        reference_after = reference_rate(args.reference, args.iterations)
        loads = (load_before, os.getloadavg()[0])
        body = tables(results, (reference_before, reference_after), loads, seeds)
    print("\n".join(body))
    took = time.time() - started
    print(f"\n(benchmark took {took:.0f} s)")
    if args.markdown:
        command = "python scripts/benchmark.py --sweep " + " ".join(a for a in argv if a != "--sweep")
        write_section(args.markdown, body, command.strip(), (started, took), loads,
                      (reference_before + reference_after) / 2)
        print(f"wrote {args.markdown}")


def write_section(path: str, body: list[str], command: str, timing: tuple, loads: tuple, reference: float) -> None:
    """Writes the tables between BEGIN and END in `path` (the rest of the page is kept), naming the run (`timing`:
    its start, time.time(), and the seconds it took)."""
    import platform

    started, took_s = timing
    head = (f"Measured on {measured_between(started)} with `{command}` (took {took_s / 60:.0f} min) "
            f"on {os.cpu_count()} cores (Python {platform.python_version()}); load average (1 min) "
            f"{loads[0]:.2f} before and {loads[1]:.2f} after; the tutorial's reference loop ran at "
            f"{reference:.0f} it/s in the same run.")
    splice_between(path, BEGIN, END, head, body)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
