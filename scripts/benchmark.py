"""Speed benchmark: the main job in seconds (beside Stable-Baselines3's, optionally), throughput against the tutorial
loop, evaluation time, memory.

Usage: python scripts/benchmark.py [--seeds 0,1,2,3,4] [--sb3-python PATH [--sb3-seeds 5,6,7]] [--iterations 6000]
                                   [--reference PATH] [--set KEY=VALUE] [--compare-overlap] [--compare-tracking]
                                   [--markdown docs/benchmarks.md]
       python scripts/benchmark.py --tracking [--seeds 0,1]
       python scripts/benchmark.py --scale-out 1,2 [--iterations 3000] [--seeds 1,2,3]
       python scripts/benchmark.py --sweep [--seeds 0-7]
       python scripts/benchmark.py --population [--seeds 0-15] [--single-seeds 0-4] [--fixed-budget]
       python scripts/benchmark.py --fixed-budget N [--seeds 100-109] [--topology local --collectors 2] [--jobs 2]

Prints markdown tables (and with --markdown writes them into that page between its benchmark.py markers, naming the
run): what each measures, and each option, are at the top of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

from benchmark_common import (DEFAULT_REFERENCE, REPO, machine, measured_between, median,  # noqa: E402
                              project_rate, reference_rate, run_main, run_stoppable, run_timed,
                              splice_between)
from dqn_cartpole.experiments.grid import parse_seeds  # noqa: E402

BACKENDS = ("tf_uniform", "py_uniform", "reverb")


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
    result = run_stoppable([sys.executable, "-c", code])
    if result.returncode != 0:
        raise SystemExit(result.stderr[-2000:])
    seconds, steps = result.stdout.split()[-2:]
    print(f"  evaluation: {steps} env steps", file=sys.stderr)
    return float(seconds)


QUIET_REFERENCE = 160.0  # it/s of the reference loop on a quiet 2-core machine: the targets hold there
TARGETS = {"policy_s": 8.0, "exit_s": 12.0, "rss_mb": 700.0, "ratio": 10.0, "sb3": 10.0, "exit_over_policy": 1.2}
SB3_RUNNER = os.path.join(REPO, "scripts", "sb3_cartpole.py")
BEGIN, END = "<!-- benchmark.py: begin -->", "<!-- benchmark.py: end -->"


def default_run(seed: int, workdir: str, overrides: list[str]) -> dict:
    """`make train` with `--set training.seed=SEED`, videos and all: from process start to a saved, solve-checked
    policy (summary.json's `solved_wall_s`) and to the process's exit, its phases and its peak memory."""
    from dqn_cartpole.processes.commands import set_flags

    out = os.path.join(workdir, f"train-s{seed}")
    args = [sys.executable, "-m", "dqn_cartpole", "train", "--output-dir", out, "--quiet", "--overwrite",
            "--set", f"training.seed={seed}", *set_flags(overrides)]
    result, created = run_timed(args)  # `created`: where `solved_wall_s` counts from
    exit_s = time.time() - created
    if result.returncode != 0:
        raise SystemExit(f"train failed ({' '.join(args)}):\n{result.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    artifacts = [os.path.join(out, name) for name in ("report.html", "videos/trained-agent.mp4",
                                                      "videos/random-agent.mp4", "plots/returns.png")]
    missing = [path for path in artifacts if not os.path.isfile(path)]
    if missing:
        raise SystemExit(f"train (seed {seed}) ended without {', '.join(missing)}")
    solved = summary["solved_at_iteration"] is not None
    phases = dict(summary.get("phases", {}))
    phases["summary, report and exit"] = max(0.0, exit_s - sum(phases.values()))  # after summary.json's clock
    print(f"  seed {seed}: {'solved' if solved else 'NOT solved'}, policy {summary['solved_wall_s'] or 0:.1f} s, "
          f"exit {exit_s:.1f} s", file=sys.stderr, flush=True)
    return {"seed": seed, "solved": solved, "policy_s": summary["solved_wall_s"], "exit_s": exit_s,
            "exit_over_policy": exit_s / summary["solved_wall_s"] if solved else None,
            "evaluator_rss_mb": summary.get("evaluator_peak_rss_mb"),
            "env_steps": summary["solved_env_steps"], "solved_return": summary["solved_return"],
            "rss_mb": summary["peak_rss_mb"], "renderer_rss_mb": summary.get("renderer_peak_rss_mb"),
            "phases": phases, "parallel": summary.get("parallel", {}), "iterations": summary["iterations"],
            "run": out}


def sb3_missing(python: Optional[str]) -> Optional[str]:
    """Why the Stable-Baselines3 anchor cannot run with `python` (None: it can)."""
    if not python:
        return "no --sb3-python given"
    try:
        found = subprocess.run([python, "-c", "import stable_baselines3, rl_zoo3"], capture_output=True, text=True,
                               timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"--sb3-python {python}: cannot run it ({exc})"
    if found.returncode != 0:
        return f"--sb3-python {python}: no stable_baselines3 or rl_zoo3 there"
    return None


def sb3_run(seed: int, workdir: str, python: str) -> dict:
    """scripts/sb3_cartpole.py for `seed` with `python`: from its process's start to its saved, solve-checked
    policy (as `default_run` times this project's), and to its exit."""
    out = os.path.join(workdir, f"sb3-s{seed}")
    result, created = run_timed([python, SB3_RUNNER, "--seed", str(seed), "--out", out])
    exit_s = time.time() - created
    if result.returncode != 0:
        raise SystemExit(f"the SB3 run (seed {seed}) failed:\n{result.stderr[-2000:]}")
    record = json.loads(result.stdout.strip().splitlines()[-1])
    policy_s = record["saved_unix_s"] - created if record["solved"] else None
    print(f"  SB3 seed {seed}: {'solved' if record['solved'] else 'NOT solved'}, policy {policy_s or 0:.1f} s, "
          f"exit {exit_s:.1f} s", file=sys.stderr, flush=True)
    return {"seed": seed, "solved": record["solved"], "policy_s": policy_s, "exit_s": exit_s,
            "env_steps": record["solved_env_steps"], "solved_return": record["solved_return"],
            "hyperparameters": record["hyperparameters"], "eval_interval": record["eval_interval"],
            "versions": record["versions"]}


def overlap_comparison(seeds: list[int], workdir: str, overrides: list[str]) -> list[str]:
    """The default (videos off) with each `evaluation.overlap` on each seed, interleaved: time to the policy and
    the trainer's wait for its evaluations; the medians."""
    modes, found = ("process", "thread", "inline"), {}
    for seed in seeds:
        for mode in modes:
            run = default_run(seed, os.path.join(workdir, f"overlap-{mode}"),
                              [*overrides, f"evaluation.overlap={mode}", "video.enabled=false"])
            found.setdefault(mode, []).append(run)
    lines = ["| `evaluation.overlap` | policy saved (median) | per seed | the trainer in evaluations and the solve "
             "check (median) | iterations to the stop (median) |", "| --- | --- | --- | --- | --- |"]
    for mode in modes:
        runs = found[mode]
        waits = [r["phases"].get("evaluations", 0.0) + r["phases"].get("solve check", 0.0) +
                 r["phases"].get("first evaluation", 0.0) for r in runs]
        per_seed = ", ".join(f"{r['policy_s'] or float('nan'):.1f}" for r in runs)
        lines.append(f"| {mode} | {median(r['policy_s'] for r in runs):.1f} s | {per_seed} | {median(waits):.2f} s | "
                     f"{median(r['iterations'] for r in runs):,.0f} |")
    return lines


TRACKERS = ("mlflow", "wandb")
TRACKED_TARGET = 1.03  # issue 50: a tracked run (MLflow's metrics streamed as it goes) reaches its policy <= 3% later


def tracking_comparison(seeds: list[int], workdir: str, overrides: list[str]) -> list[str]:
    """The default run (videos and all) without tracking and with `--track mlflow` (its metrics streamed to the
    SQLite store as the run goes) / `--track wandb` on each seed, interleaved: the time to the policy and to the
    process's exit, and each tracker's ratio to the untracked run's (the median over the seeds of the per-seed
    ratios), against the target of at most x1.03 to the policy. The stores (MLflow's SQLite store and artifacts,
    W&B's offline runs and its cache) are in `workdir`; a tracker whose extra is not installed is left out."""
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        os.environ.setdefault(name, os.path.join(workdir, name.lower()))
    modes = ("none", *(t for t in TRACKERS if importlib.util.find_spec(t) is not None))
    found: dict = {}
    for seed in seeds:
        for mode in modes:
            tracked = [] if mode == "none" else [f"tracking.backend={mode}",
                                                 f"output.root={os.path.join(workdir, 'stores')}"]
            found.setdefault(mode, []).append(default_run(seed, os.path.join(workdir, f"track-{mode}"),
                                                          [*overrides, *tracked]))
    lines = ["| `--track` | policy saved (median) | exit (median) | policy / untracked (median over seeds) | "
             f"<= x{TRACKED_TARGET}? | exit / untracked | per seed: policy, exit |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    base = {r["seed"]: r for r in found["none"]}
    for mode in modes:
        runs = found[mode]
        policy = median(r["policy_s"] / base[r["seed"]]["policy_s"] for r in runs if r["solved"] and
                        base[r["seed"]]["solved"])
        exit_ratio = median(r["exit_s"] / base[r["seed"]]["exit_s"] for r in runs)
        per_seed = ", ".join(f"s{r['seed']} {r['policy_s'] or float('nan'):.1f} / {r['exit_s']:.1f}" for r in runs)
        lines.append(f"| {mode} | {median(r['policy_s'] for r in runs):.1f} s | {median(r['exit_s'] for r in runs):.1f} "
                     f"s | x{policy:.3f} | {verdict(policy, TRACKED_TARGET) if mode != 'none' else '-'} | x{exit_ratio:.3f} | {per_seed} |")
    return lines


def tracking_benchmark(args: argparse.Namespace) -> None:
    """Only the tracking section (`--tracking`): the reference loop's rate before and after, then
    `tracking_comparison` on --seeds."""
    workdir = tempfile.mkdtemp(prefix="dqn-bench-tracking-")
    started, load_before = time.time(), os.getloadavg()[0]
    has_reference = os.path.isfile(args.reference)
    before = reference_rate(args.reference, args.iterations) if has_reference else None
    lines = tracking_comparison(parse_seeds(args.seeds), workdir, args.overrides)
    after = reference_rate(args.reference, args.iterations) if has_reference else None
    print("\n".join(lines))
    rates = f"reference loop {before:.0f} it/s before, {after:.0f} after; " if has_reference else ""
    print(f"\n({rates}took {time.time() - started:.0f} s; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; runs in {workdir})")


def scaled(seconds: float, reference: Optional[float]) -> str:
    """`seconds`, and what they come to on a quiet machine (the issue's rule: scale by the reference's rate)."""
    if reference is None or reference >= QUIET_REFERENCE:
        return f"{seconds:.1f} s"
    return f"{seconds:.1f} s (scaled to a quiet machine: {seconds * reference / QUIET_REFERENCE:.1f} s)"


def verdict(value: Optional[float], target: float, at_least: bool = False) -> str:
    if value is None or value != value:
        return "-"
    return "yes" if (value >= target if at_least else value <= target) else "**no**"


def targets_table(runs: list[dict], sb3_runs: list[dict], rates: dict, reference: Optional[float]) -> list[str]:
    """The targets, each with its measured median and whether it was met."""
    ok = [r for r in runs if r["solved"]]
    policy, exit_ = median(r["policy_s"] for r in ok), median(r["exit_s"] for r in runs)
    factor = 1.0 if reference is None or reference >= QUIET_REFERENCE else reference / QUIET_REFERENCE
    rss = max(r["rss_mb"] for r in runs)
    over = [r["exit_over_policy"] for r in ok]
    lines = ["| target | measured (median of the seeds) | met? |", "| --- | --- | --- |",
             f"| process start to a saved, solve-checked policy ≤ {TARGETS['policy_s']:g} s | "
             f"{scaled(policy, reference)} ({len(ok)}/{len(runs)} seeds solved) | "
             f"{verdict(policy * factor, TARGETS['policy_s'])} |"]
    if sb3_runs:
        common = [s["seed"] for s in sb3_runs if s["solved"]]
        ours = median(r["policy_s"] for r in ok if r["seed"] in common)
        theirs = median(s["policy_s"] for s in sb3_runs if s["solved"])
        lines.append(f"| the same, ≥ ×{TARGETS['sb3']:g} faster than Stable-Baselines3 + RL-Zoo (same seeds, same "
                     f"protocol, this run) | ×{theirs / ours:.1f} ({theirs:.1f} s against {ours:.1f} s, "
                     f"{len(common)}/{len(sb3_runs)} SB3 seeds solved) | {verdict(theirs / ours, TARGETS['sb3'], True)} |")
    lines += [f"| process start to exit, videos, plots and report.html written ≤ {TARGETS['exit_s']:g} s | "
              f"{scaled(exit_, reference)} | {verdict(exit_ * factor, TARGETS['exit_s'])} |",
              f"| the whole command within ×{TARGETS['exit_over_policy']:g} the time to the policy | "
              f"×{median(over):.2f} (every seed within ×{max(over or [float('nan')]):.2f}) | "
              f"{verdict(median(over), TARGETS['exit_over_policy'])} |",
              f"| peak RSS with video ≤ {TARGETS['rss_mb']:g} MB | {rss:.0f} MB (the trainer; the video renderer "
              f"process: {max((r['renderer_rss_mb'] or 0) for r in runs):.0f} MB, the evaluator process: "
              f"{max((r['evaluator_rss_mb'] or 0) for r in runs):.0f} MB) | {verdict(rss, TARGETS['rss_mb'])} |"]
    compiled = rates.get("tf_uniform")
    if compiled and reference:
        ratio = compiled / reference
        lines.append(f"| compiled tf_uniform at the tutorial's hyperparameters ≥ ×{TARGETS['ratio']:g} the reference "
                     f"loop | ×{ratio:.1f} ({compiled:,.0f} against {reference:.0f} it/s) | "
                     f"{verdict(ratio, TARGETS['ratio'], True)} |")
    return lines


def seeds_table(runs: list[dict], sb3_runs: list[dict]) -> list[str]:
    """Each seed's run (and Stable-Baselines3's, if it ran)."""
    sb3 = {s["seed"]: s for s in sb3_runs}
    head = "| seed | env steps to solve | policy saved | process exit | exit / policy | greedy return, 100 episodes | "\
           "peak RSS |"
    if sb3:
        head += " SB3: env steps | SB3: policy saved | × SB3 |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in runs:
        solved = f"{r['env_steps']:,}" if r["solved"] else "not solved"
        over = f"×{r['exit_over_policy']:.2f}" if r["exit_over_policy"] else "-"
        line = (f"| {r['seed']} | {solved} | {r['policy_s'] or float('nan'):.1f} s | {r['exit_s']:.1f} s | {over} | "
                f"{r['solved_return'] or float('nan'):.1f} | {r['rss_mb']:.0f} MB |")
        s = sb3.get(r["seed"])
        if sb3:
            if s is None:
                line += " - | - | - |"
            elif not s["solved"]:
                line += " not solved | - | - |"
            else:
                times = f"×{s['policy_s'] / r['policy_s']:.1f}" if r["policy_s"] else "-"
                line += f" {s['env_steps']:,} | {s['policy_s']:.1f} s | {times} |"
        lines.append(line)
    return lines


def phases_table(runs: list[dict]) -> list[str]:
    names = list(dict.fromkeys(n for r in runs for n in r["phases"]))
    total = sum(median(r["phases"].get(n, 0.0) for r in runs) for n in names)
    lines = ["| phase (median over the seeds) | seconds | share |", "| --- | --- | --- |"]
    for name in names:
        seconds = median(r["phases"].get(name, 0.0) for r in runs)
        lines.append(f"| {name} | {seconds:.2f} | {100 * seconds / total:.0f}% |")
    parallel = list(dict.fromkeys(n for r in runs for n in r["parallel"]))
    lines += [f"| {name}, in parallel | {median(r['parallel'].get(name) for r in runs):.2f} | |" for name in parallel]
    return lines


def single_process_tables(runs: list[dict], sb3_runs: list[dict], rates: dict, reference: Optional[float],
                          references: tuple, eval_s: float) -> list[str]:
    """The markdown tables: the targets, the runs seed by seed, the phases, the throughput."""
    lines = targets_table(runs, sb3_runs, rates, reference) + [""] + seeds_table(runs, sb3_runs) + [""] + \
        phases_table(runs)
    if sb3_runs:
        first = sb3_runs[0]
        lines.append(f"\nStable-Baselines3 {first['versions']['stable_baselines3']} (torch {first['versions']['torch']}) "
                     f"with rl_zoo3 {first['versions']['rl_zoo3']}'s CartPole-v1 hyperparameters "
                     f"(`{json.dumps(first['hyperparameters'], sort_keys=True)}`), evaluated every "
                     f"{first['eval_interval']} env steps, scripts/sb3_cartpole.py.")
    if reference is not None:
        lines += ["", "| throughput, one env step and one gradient step of batch 64 per iteration | it/s | "
                      "× the reference |", "| --- | --- | --- |",
                  f"| the reference loop (the tutorial's, Reverb, PyDriver) | {reference:.0f} (before "
                  f"{references[0]:.0f}, after {references[1]:.0f}) | 1 |"]
        lines += [f"| {name} | {rate:,.0f} | ×{rate / reference:.1f} |" for name, rate in rates.items()]
    lines.append(f"\n10 greedy episodes of CartPole-v1 (5,000 steps) with a saved policy: {eval_s:.2f} s.")
    return lines


def write_markdown(path: str, body: list[str], meta: dict) -> None:
    """Writes the tables between BEGIN and END in `path` (the rest of the page is kept), naming the run."""
    head = (f"Measured on {meta['date']} with `{meta['command']}` (took {meta['took_s'] / 60:.0f} min); "
            f"load average (1 min) {meta['load'][0]:.2f} before and {meta['load'][1]:.2f} after; the "
            f"tutorial's reference loop ran at {meta['reference']:.0f} it/s in the same run (≥ "
            f"{QUIET_REFERENCE:.0f} on a quiet machine, where the absolute targets hold; on a loaded one "
            f"seconds are also shown scaled by that rate). {meta['machine']}.")
    splice_between(path, BEGIN, END, head, body)


def throughput(args: argparse.Namespace, workdir: str) -> dict:
    """Steady-state it/s at the tutorial's hyperparameters: each backend compiled, the PyDriver loop, 8 envs."""
    rates = {backend: project_rate(backend, args.iterations, workdir, []) for backend in args.backends.split(",")}
    for backend in ("tf_uniform", "reverb"):  # the tutorial's own loop shape: PyDriver, then a compiled train step
        rates[f"{backend}, collection.driver: py"] = project_rate(backend, args.iterations, workdir, [], driver="py")
    for backend in ("reverb", "py_uniform"):  # issue 38: at most 1.5x (Reverb) and 2x (py_uniform) uniform's cost
        rates[f"{backend}, replay.prioritized"] = project_rate(backend, args.iterations, workdir,
                                                              ["replay.prioritized=true"], tag="-prioritized")
    rates["tf_uniform, 8 envs x 8 steps"] = project_rate(
        "tf_uniform", args.iterations // 8, workdir,
        ["env.num_envs=8", "training.collect_steps_per_iteration=8", "training.train_steps_per_iteration=8",
         "evaluation.eval_interval=125", "training.log_interval=25"]) * 8
    return rates


def time_to_solve(args: argparse.Namespace, seeds: list[int], workdir: str) -> tuple[list[dict], list[dict]]:
    """The default run on each seed, each followed by Stable-Baselines3's on it (if it runs here: `sb3_missing`)."""
    sb3_seeds = set(parse_seeds(args.sb3_seeds)) if args.sb3_seeds else set(seeds)
    missing = sb3_missing(args.sb3_python)
    if missing:
        print(f"the Stable-Baselines3 anchor is skipped: {missing}", file=sys.stderr)
    print("the default run, videos included" + ("" if missing else ", each seed then SB3's") + "...", file=sys.stderr)
    runs, sb3_runs = [], []
    for seed in seeds:
        runs.append(default_run(seed, workdir, args.overrides))
        if not missing and seed in sb3_seeds:
            sb3_runs.append(sb3_run(seed, workdir, args.sb3_python))
    return runs, sb3_runs


def single_process_benchmark(args: argparse.Namespace) -> None:
    """The main job in seconds (default runs with videos, SB3's beside), throughput against the reference,
    evaluation."""
    folder = os.path.dirname(os.path.abspath(args.markdown)) if args.markdown else None
    if folder is not None and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        print(f"error: --markdown {args.markdown}: cannot write there (no such folder, or no permission)",
              file=sys.stderr)
        raise SystemExit(2)
    seeds = parse_seeds(args.seeds)
    if args.sb3_seeds:
        parse_seeds(args.sb3_seeds)  # bad input before anything runs
    workdir = tempfile.mkdtemp(prefix="dqn-bench-")
    started, load_before = time.time(), os.getloadavg()[0]
    has_reference = os.path.isfile(args.reference)
    if not has_reference:
        print(f"no reference loop at {args.reference}: the speed ratios are skipped (give the tutorial's loop "
              f"with --reference PATH)", file=sys.stderr)
    reference_before = reference_rate(args.reference, args.iterations) if has_reference else None
    runs, sb3_runs = time_to_solve(args, seeds, workdir)
    overlap = overlap_comparison(seeds, workdir, args.overrides) if args.compare_overlap else []
    tracking = tracking_comparison(seeds, workdir, args.overrides) if args.compare_tracking else []
    print("throughput (tutorial hyperparameters)...", file=sys.stderr)
    rates = throughput(args, workdir)
    reference_after = reference_rate(args.reference, args.iterations) if has_reference else None
    reference = (reference_before + reference_after) / 2 if has_reference else None
    solved_run = next((r["run"] for r in runs if r["solved"]), None)
    eval_s = evaluation_seconds(solved_run) if solved_run else float("nan")
    body = single_process_tables(runs, sb3_runs, rates, reference, (reference_before, reference_after), eval_s)
    if overlap:
        body += ["", *overlap]
    if tracking:
        body += ["", *tracking]
    print("\n".join(body))
    took = time.time() - started
    print(f"\n(benchmark took {took:.0f} s; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"runs in {workdir})")
    if args.markdown:
        command = "python scripts/benchmark.py " + " ".join(sys.argv[1:])
        write_markdown(args.markdown, body, {
            "date": measured_between(started), "command": command.strip(), "took_s": took,
            "load": (load_before, os.getloadavg()[0]), "reference": reference or float("nan"),
            "machine": machine()})
        print(f"wrote {args.markdown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--iterations", type=int, default=6000, help="iterations per throughput run")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, metavar="PATH",
                        help="the tutorial's training loop, run for the speed ratios (default: %(default)s)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="override a key of the time-to-solve runs, e.g. replay.backend=reverb (repeatable)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--sb3-python", metavar="PATH", default=None,
                        help="an interpreter with stable-baselines3 and rl_zoo3 (e.g. a venv's bin/python): the same "
                             "seeds trained by SB3 + RL-Zoo's CartPole-v1 DQN under the same stopping protocol, as "
                             "the anchor of the speed ratio (default: skipped)")
    parser.add_argument("--sb3-seeds", metavar="SEEDS", default=None,
                        help="train only these of --seeds with SB3 (each takes ~2 min; default: all of them)")
    parser.add_argument("--compare-overlap", action="store_true",
                        help="also run the default with evaluation.overlap process, thread and inline on each seed "
                             "(videos off)")
    parser.add_argument("--compare-tracking", action="store_true",
                        help="also run the default without tracking and with --track mlflow and --track wandb (those "
                             "installed) on each seed: the time to the policy and to the exit, and their ratios")
    parser.add_argument("--tracking", action="store_true",
                        help="only the tracking comparison (--compare-tracking) on --seeds, with the reference loop's "
                             "rate before and after")
    parser.add_argument("--scale-out", default="", metavar="N,N,...",
                        help="only the scale-out section (scripts/benchmark_scale_out.py, which takes the other "
                             "arguments too): train --topology local with each number of collectors, the learner "
                             "alone on each replay, time to solve local vs single-process (--seeds)")
    parser.add_argument("--fixed-budget", metavar="N", type=int,
                        help="only the fixed-budget protocol (scripts/benchmark_fixed_budget.py, see there for its "
                             "options): N iterations with the early stop off on each seed, each final policy scored "
                             "over 100 fresh episodes")
    parser.add_argument("--sweep", action="store_true",
                        help="only the sweep section (scripts/benchmark_sweep.py): sweep --ray against --jobs 2")
    parser.add_argument("--population", action="store_true",
                        help="only the population section (scripts/benchmark_population.py): train --population 16 "
                             "against one seed's train and sweep --jobs 2 over the same seeds")
    # The sections of their own, imported only when asked for (scripts/ is on the path when this file runs).
    if "--scale-out" in sys.argv[1:] or any(a.startswith("--scale-out=") for a in sys.argv[1:]):
        import benchmark_scale_out

        benchmark_scale_out.main(sys.argv[1:])
        return
    if "--sweep" in sys.argv[1:]:
        import benchmark_sweep

        benchmark_sweep.main(sys.argv[1:])
        return
    if "--population" in sys.argv[1:]:  # before --fixed-budget, which it takes as a switch of its own
        import benchmark_population

        benchmark_population.main(sys.argv[1:])
        return
    if any(a == "--fixed-budget" or a.startswith("--fixed-budget=") for a in sys.argv[1:]):
        import benchmark_fixed_budget

        benchmark_fixed_budget.main(sys.argv[1:])
        return
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables, naming this run, into PATH "
                                                            "between its benchmark.py markers (e.g. docs/benchmarks.md)")
    args = parser.parse_args()
    if args.tracking:
        tracking_benchmark(args)
        return
    single_process_benchmark(args)


if __name__ == "__main__":
    run_main(main)  # bad input (--seeds, --scale-out): one line, exit status 2
