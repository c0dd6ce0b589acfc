"""The fixed-budget protocol: `python scripts/benchmark.py --fixed-budget 20000 [--seeds 100-109] [--config default]
[--topology local --collectors 2] [--jobs 2] [--set KEY=VALUE] [--markdown PATH]` (or this file directly).

The peers publish the return after a fixed budget (CleanRL: 488.7 ± 16.1 at 500k steps; RL-Zoo evaluates the final
model), not the time to a first solve. So: each seed trains `--fixed-budget` iterations with the early stop off
(`evaluation.stop_when_solved=false`, videos off), and its policy/final, the weights at the last step, is scored by
the run itself over `evaluation.final_episodes` (100) fresh greedy episodes (summary.json's `final_policy_return`).
It prints each seed's row (its first confirmed solve, its best periodic evaluation, its final score), the final
scores' interquartile mean with its 95% bootstrap interval (as `compare` computes it), and the share of seeds whose
final policy reaches the solve target. Each run is a fresh `train` process; `--jobs` runs that many at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

from benchmark_common import REPO, exit_on_sigterm, measured_between, run_main, splice_between, stop_runs
from dqn_cartpole.errors import UserError  # (light: no TensorFlow)
from dqn_cartpole.experiments import stats
from dqn_cartpole.experiments.grid import parse_seeds
from dqn_cartpole.processes.commands import set_flags

BEGIN, END = "<!-- benchmark.py fixed budget: begin -->", "<!-- benchmark.py fixed budget: end -->"


def train_args(args: argparse.Namespace, seed: int, out: str) -> list[str]:
    command = [sys.executable, "-m", "dqn_cartpole", "train", "--config", args.config, "--output-dir", out,
               "--quiet", "--overwrite", "--seed", str(seed), "-n", str(args.fixed_budget),
               "--set", "evaluation.stop_when_solved=false", "--set", "video.enabled=false"]
    if args.topology != "single":
        command += ["--topology", args.topology, "--collectors", str(args.collectors)]
    return command + set_flags(args.overrides)


def read_result(seed: int, out: str, process: subprocess.CompletedProcess) -> dict:
    """One seed's row from its summary.json (or its failure)."""
    if process.returncode != 0:
        raise SystemExit(f"train (seed {seed}) failed with exit status {process.returncode}:\n{process.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    target = summary.get("solve_return_target")
    final = summary.get("final_policy_return")
    if final is None:
        raise SystemExit(f"train (seed {seed}): summary.json has no final_policy_return (policy/final was not scored)")
    return {"seed": seed, "final": final, "episodes": summary.get("final_policy_episodes"), "target": target,
            "holds": target is not None and final >= target, "best": summary.get("best_return"),
            "solved_env_steps": summary.get("solved_env_steps"), "solve_checked": summary.get("solve_checked", True),
            "wall_s": summary.get("wall_s"), "run": out}


def run_seeds(args: argparse.Namespace, seeds: list[int], workdir: str) -> list[dict]:
    """Every seed's run, `--jobs` at a time, in seed order. Stopped (Ctrl-C, SIGTERM), it stops the runs in flight
    as Ctrl-C stops a run (each saves a checkpoint) and waits for them: no train process outlives it."""
    pending, running, results = list(seeds), [], {}
    exit_on_sigterm()
    try:
        _run(args, workdir, pending, running, results)
    finally:
        stop_runs([process for _, _, process in running])
    return [results[seed] for seed in seeds]


def _run(args: argparse.Namespace, workdir: str, pending: list, running: list, results: dict) -> None:
    while pending or running:
        while pending and len(running) < args.jobs:
            seed = pending.pop(0)
            out = os.path.join(workdir, f"s{seed}")
            running.append((seed, out, subprocess.Popen(train_args(args, seed, out), cwd=REPO, text=True,
                                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        time.sleep(0.5)
        for entry in [e for e in running if e[2].poll() is not None]:
            seed, out, process = entry
            running.remove(entry)
            stderr = process.stderr.read()
            results[seed] = read_result(seed, out, subprocess.CompletedProcess(process.args, process.returncode,
                                                                               "", stderr))
            row = results[seed]
            print(f"  seed {seed}: final {row['final']:.1f} over {row['episodes']} episodes "
                  f"({'holds' if row['holds'] else 'does NOT hold'}), best {row['best']}", file=sys.stderr, flush=True)


def table(rows: list[dict]) -> list[str]:
    """Each seed, then the IQM with its 95% CI and the share of seeds whose final policy solves."""
    lines = ["| seed | first confirmed solve (env steps) | best periodic evaluation | policy/final, 100 fresh "
             "episodes | solves |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        # a run with agent.solved_target_update_* null and the early stop off never looks for its solve
        solve = (f"{row['solved_env_steps']:,}" if row["solved_env_steps"] is not None
                 else "never" if row["solve_checked"] else "not checked")
        best = f"{row['best']:.1f}" if row["best"] is not None else "-"
        lines.append(f"| {row['seed']} | {solve} | {best} | {row['final']:.1f} | {'yes' if row['holds'] else '**no**'} |")
    finals = stats.estimate([row["final"] for row in rows], "iqm")
    held = sum(row["holds"] for row in rows)
    lines += ["", f"policy/final over 100 fresh episodes: IQM {finals.format(1)} (95% bootstrap CI); "
                  f"{held}/{len(rows)} seeds' final policies solve (≥ {rows[0]['target']:g})."]
    return lines


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed-budget", type=int, required=True, metavar="N", help="iterations of every run")
    parser.add_argument("--seeds", default="100-109")
    parser.add_argument("--config", default="default", help="a config file or a shipped config's name")
    parser.add_argument("--topology", choices=("single", "local"), default="single")
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table into PATH between its markers")
    args, _ = parser.parse_known_args(argv)
    if args.fixed_budget <= 0 or args.jobs <= 0 or args.collectors <= 0:
        raise UserError("--fixed-budget, --jobs and --collectors must be positive")
    seeds = parse_seeds(args.seeds)
    workdir = tempfile.mkdtemp(prefix="dqn-fixed-budget-")
    started, load_before = time.time(), os.getloadavg()[0]
    rows = run_seeds(args, seeds, workdir)
    body = table(rows)
    took = time.time() - started
    command = "python scripts/benchmark.py " + " ".join(argv if argv is not None else sys.argv[1:])
    head = (f"Measured on {measured_between(started)} with `{command.strip()}` (took {took / 60:.0f} min); "
            f"load average (1 min) {load_before:.2f} before and {os.getloadavg()[0]:.2f} after; runs in {workdir}.")
    print("\n".join([head, ""] + body))
    if args.markdown:
        splice_between(args.markdown, BEGIN, END, head, body)
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    run_main(main)
