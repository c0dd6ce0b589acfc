"""Sweep benchmark: `python scripts/benchmark.py --sweep [--seeds 0-7] [--repeats 1] [--markdown docs/experiments.md]`
(or this file directly, with the same arguments).

The same sweep of default runs (configs/default.yaml, videos included, as `make train` runs it; one run per seed)
two ways, side by side in this one run, next to the tutorial's reference loop (`--reference PATH`, run first and
last as a gauge of the machine's load) and the load average:
  * `sweep --jobs 2`: today's local sweep, two child processes at a time;
  * `sweep --ray` on a local Ray instance the command starts itself (one run per CPU).
It prints each one's wall time (the command's start to its exit) and the ratio; the env steps to solve of every
seed in both (a run is reproducible by seed: they must be equal); the start-up of one run process (summary.json's
`start-up and imports`, the median over the runs) and its share of a run's seconds, which is what a worker that
imports TensorFlow once and trains run after run in-process could save; and what Ray adds: the seconds to start
it, the run folders' way back (packed on the workers, fetched, unpacked: the sweep's `ray:` line) and the rest of
the difference between the two sweeps (worker processes, scheduling). With --repeats N the two alternate.
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

from benchmark import DEFAULT_REFERENCE, REPO, reference_rate
from dqn_cartpole.errors import UserError
from dqn_cartpole.experiments.grid import parse_seeds

BEGIN, END = "<!-- benchmark_sweep.py: begin -->", "<!-- benchmark_sweep.py: end -->"
STARTUP = "start-up and imports"
RAY_LINE = re.compile(r"ray: started a local Ray instance in ([\d.]+) s.*?; (\d+) run folders back \(([\d.]+) MB; "
                      r"packed in ([\d.]+) s on the workers, fetched in ([\d.]+) s, unpacked in ([\d.]+) s\)")


def run_sweep(root: str, name: str, seeds: str, ray: bool) -> dict:
    """One `sweep` command of default runs; its wall seconds, its runs' summaries and (with Ray) its `ray:` line."""
    argv = [sys.executable, "-m", "dqn_cartpole", "sweep", "--config", os.path.join(REPO, "configs", "default.yaml"),
            "--seeds", seeds, "--name", name, "--set", f"output.root={root}", "--quiet",
            *(["--ray"] if ray else ["--jobs", "2"])]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # --ray: a local instance
    env["PYTHONPATH"] = REPO
    start = time.time()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
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
    result = {"wall_s": wall_s, "runs": runs, "stdout": proc.stdout}
    if ray:
        match = RAY_LINE.search(proc.stdout)
        if not match:
            raise SystemExit(f"no `ray:` line in the sweep's output:\n{proc.stdout[-2000:]}")
        result["ray"] = dict(zip(("start_s", "folders", "mb", "pack_s", "get_s", "unpack_s"),
                                 (float(v) for v in match.groups())))
    print(f"  sweep {'--ray' if ray else '--jobs 2'}: {wall_s:.1f} s (load average {os.getloadavg()[0]:.1f})",
          file=sys.stderr, flush=True)
    return result


def run_seconds(summary: dict) -> float:
    """A run's seconds from its process start to its summary (its phases; plots and videos included)."""
    return sum(summary.get("phases", {}).values())


def tables(local: list, ray: list, references: tuple, loads: tuple, seeds: list) -> list[str]:
    wall_local = statistics.median(r["wall_s"] for r in local)
    wall_ray = statistics.median(r["wall_s"] for r in ray)
    runs = [s for r in local + ray for s in r["runs"].values()]
    startup = statistics.median(s["phases"][STARTUP] for s in runs)
    per_run = statistics.median(run_seconds(s) for s in runs)
    ray_start = statistics.median(r["ray"]["start_s"] for r in ray)
    transfer = statistics.median(r["ray"]["pack_s"] + r["ray"]["get_s"] + r["ray"]["unpack_s"] for r in ray)
    megabytes = statistics.median(r["ray"]["mb"] for r in ray)
    reference = sum(references) / 2
    lines = ["| measure | value |", "| --- | --- |",
             f"| `sweep --jobs 2`, {len(seeds)} default runs (seeds {seeds[0]}-{seeds[-1]}) | {wall_local:.1f} s |",
             f"| `sweep --ray`, local Ray instance (2 CPUs) | {wall_ray:.1f} s |",
             f"| ratio: `--jobs 2` time / `--ray` time (target ≥ 1.3) | **{wall_local / wall_ray:.2f}** |",
             f"| Ray's start-up (`ray.init` of a local instance) | {ray_start:.1f} s |",
             f"| the run folders' way back: packed, fetched, unpacked ({megabytes:.1f} MB for {len(seeds)} runs) | "
             f"{transfer:.2f} s |",
             f"| the rest of the difference (Ray's worker processes, scheduling) | "
             f"{wall_ray - wall_local - ray_start - transfer:+.1f} s |",
             f"| one run, process start to summary (median of {len(runs)}) | {per_run:.1f} s |",
             f"| of which start-up and imports (median) | {startup:.1f} s ({100 * startup / per_run:.0f}%) |",
             f"| the tutorial's reference loop | {reference:.0f} it/s (before {references[0]:.0f}, after "
             f"{references[1]:.0f}) |",
             f"| load average (1 min), before / after | {loads[0]:.2f} / {loads[1]:.2f} |",
             "", "| seed | env steps to solve, `--jobs 2` | env steps to solve, `--ray` | same |", "| --- | --- | --- | --- |"]
    for seed in seeds:
        name = f"base__s{seed}"
        steps = [r["runs"][name].get("solved_env_steps") or f"not solved ({r['runs'][name]['env_steps']})"
                 for r in (local[0], ray[0])]
        lines.append(f"| {seed} | {steps[0]} | {steps[1]} | {'yes' if steps[0] == steps[1] else '**no**'} |")
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
                                                            "benchmark_sweep.py markers (e.g. docs/experiments.md)")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if args.repeats <= 0:
        raise UserError(f"--repeats: must be positive, got {args.repeats}")
    if not os.path.isfile(args.reference):
        raise UserError(f"--reference {args.reference}: no such file (the tutorial's loop is the yardstick)")
    seeds_text = ",".join(str(s) for s in seeds)
    started, load_before = time.time(), os.getloadavg()[0]
    reference_before = reference_rate(args.reference, args.iterations)
    local, ray = [], []
    with tempfile.TemporaryDirectory(prefix="dqn-sweep-bench-") as root:
        for repeat in range(args.repeats):
            for on_ray in ((True, False) if repeat % 2 else (False, True)):  # alternate the order: load drifts
                result = run_sweep(root, f"{'ray' if on_ray else 'jobs2'}-{repeat}", seeds_text, on_ray)
                (ray if on_ray else local).append(result)
        reference_after = reference_rate(args.reference, args.iterations)
        loads = (load_before, os.getloadavg()[0])
        body = tables(local, ray, (reference_before, reference_after), loads, seeds)
    print("\n".join(body))
    took = time.time() - started
    print(f"\n(benchmark took {took:.0f} s; load average {loads[0]:.2f} before, {loads[1]:.2f} after)")
    if args.markdown:
        command = "python scripts/benchmark.py --sweep " + " ".join(a for a in argv if a != "--sweep")
        write_section(args.markdown, body, command.strip(), took, loads, (reference_before + reference_after) / 2)
        print(f"wrote {args.markdown}")


def write_section(path: str, body: list[str], command: str, took_s: float, loads: tuple, reference: float) -> None:
    """Writes the tables between BEGIN and END in `path` (the rest of the page is kept), naming the run."""
    import platform

    head = [BEGIN, f"Measured on {time.strftime('%Y-%m-%d %H:%M %Z')} with `{command}` (took {took_s / 60:.0f} min) "
                   f"on {os.cpu_count()} cores (Python {platform.python_version()}); load average (1 min) "
                   f"{loads[0]:.2f} before and {loads[1]:.2f} after; the tutorial's reference loop ran at "
                   f"{reference:.0f} it/s in the same run.", ""]
    text = "\n".join(head + body + ["", END])
    old = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
    if BEGIN in old and END in old:
        text = old.split(BEGIN)[0] + text + old.split(END, 1)[1]
    else:
        text = old + ("\n" if old else "") + text + "\n"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UserError as exc:  # bad input: one line, exit status 2
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
