"""Population benchmark: `python scripts/benchmark.py --population [--seeds 0-15] [--single-seeds 0-4] [--fixed-budget]
[--markdown docs/benchmarks.md]` (or this file directly, with the same arguments).

Many seeds of the default config three ways, side by side in this one run: one seed at a time (`train`, a fresh
process each), all of them as one population (`train --population K`, and the same through `sweep --population`),
and a sweep of ordinary runs (`sweep --jobs 2`). It gives each command's wall seconds, the ratios of issue 51, each
seed's env steps to its first confirmed solve in the population and in single runs (both distributions, a two-sided
Mann-Whitney U test), the peak memory, and with --fixed-budget every seed's held final policy after 20,000
iterations with the early stop off. What each column means is in docs/benchmarks.md ("Populations: many seeds in one
graph").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Optional

from benchmark_common import (DEFAULT_REFERENCE, REPO, machine, measured_between, median, reference_rate, run_main,
                              run_timed, splice_between)
from dqn_cartpole.errors import UserError  # (light: no TensorFlow)
from dqn_cartpole.experiments.grid import parse_seeds

BEGIN, END = "<!-- benchmark_population.py: begin -->", "<!-- benchmark_population.py: end -->"
DEFAULT_CONFIG = os.path.join(REPO, "configs", "default.yaml")
# Issue 51's targets: the population's whole command against one seed's, a sweep of ordinary runs against the
# population, the Mann-Whitney p-value that must not tell them apart, the peak memory, the held final policies.
TARGETS = {"population_over_single": 4.0, "sweep_over_population": 3.0, "p_value": 0.05, "rss": 2.0,
           "final_misses": 1}
# Upper bounds on each command (seconds; a command still running then is stopped and the benchmark ends): generous,
# a loaded machine runs them 3x slower than a quiet one.
TIMEOUTS = {"reference": 900, "single": 600, "population": 1800, "sweep": 3600, "fixed": 3600}


def loadavg() -> float:
    """The machine's 1-minute load average, from /proc/loadavg."""
    with open("/proc/loadavg", encoding="ascii") as handle:
        return float(handle.read().split()[0])


def measure(label: str, run) -> dict:
    """`run()` (a dict) with the 1-minute load before and after it."""
    before = loadavg()
    print(f"{label} (load {before:.2f})...", file=sys.stderr, flush=True)
    result = run()
    result.update(load=(before, loadavg()), label=label)
    shown = f"{result['rate']:.0f} it/s" if "rate" in result else f"{result['wall_s']:.1f} s"
    print(f"  {label}: {shown} (load {result['load'][1]:.2f} after)", file=sys.stderr, flush=True)
    return result


def command(argv: list[str], timeout: float) -> float:
    """Runs a `python -m dqn_cartpole` command in a fresh process, bounded by `timeout` and stopped with the benchmark
    (Ctrl-C, SIGTERM); its wall seconds, from its process's start to its exit."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "OMP_NUM_THREADS",
                                                             "DQN_CARTPOLE_FRESH_RUNS")}
    env.update(PYTHONPATH=REPO, SDL_AUDIODRIVER="dummy")
    args = [sys.executable, "-m", "dqn_cartpole", *argv]
    result, created = run_timed(args, timeout, env=env)
    wall_s = time.time() - created
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit status {result.returncode}):\n{result.stdout[-1500:]}\n"
                         f"{result.stderr[-2000:]}")
    return wall_s


def summaries(folders: dict) -> dict:
    """{seed: summary.json} of each seed's run folder in `folders` ({seed: folder}); a missing one ends the run."""
    found = {}
    for seed, folder in folders.items():
        path = os.path.join(folder, "summary.json")
        if not os.path.isfile(path):
            raise SystemExit(f"no summary.json in {folder} (seed {seed})")
        with open(path, encoding="utf-8") as handle:
            found[seed] = json.load(handle)
    return found


def single_run(config: str, seed: int, root: str) -> dict:
    """`train` of `config` on `seed`, videos and all, as a user runs it."""
    out = os.path.join(root, "single", f"s{seed}")
    wall_s = command(["train", "--config", config, "--output-dir", out, "--quiet", "--set", f"training.seed={seed}"],
                     TIMEOUTS["single"])
    return {"wall_s": wall_s, "runs": summaries({seed: out})}


def population_run(config: str, seeds: list[int], root: str, name: str, overrides: tuple = ()) -> dict:
    """`train --population K` of `config` on `seeds` (contiguous: training.seed is the first)."""
    out = os.path.join(root, name)
    sets = [a for o in (f"training.seed={seeds[0]}", *overrides) for a in ("--set", o)]
    wall_s = command(["train", "--config", config, "--population", str(len(seeds)), "--output-dir", out, "--quiet",
                      *sets], TIMEOUTS["fixed" if overrides else "population"])
    return {"wall_s": wall_s, "runs": summaries({s: os.path.join(out, f"s{s}") for s in seeds})}


def sweep_run(config: str, seeds: list[int], root: str, name: str, how: list[str]) -> dict:
    """`sweep --seeds SEEDS` of `config` with `how` (`--population`, or `--jobs 2`)."""
    wall_s = command(["sweep", "--config", config, "--seeds", seeds_text(seeds), *how, "--name", name, "--set",
                      f"output.root={root}", "--quiet"], TIMEOUTS["sweep"])
    folder = os.path.join(root, "sweeps", name)
    return {"wall_s": wall_s, "runs": summaries({s: os.path.join(folder, f"base__s{s}") for s in seeds})}


def seeds_text(seeds: list[int]) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ",".join(map(str, seeds))


def measure_all(args: argparse.Namespace, seeds: list[int], single_seeds: list[int], root: str) -> dict:
    """Every measurement, in order: the reference loop, one seed at a time, the population (train, then sweep), the
    sweep of ordinary runs, the fixed budget, the reference loop again."""
    k, found = len(seeds), {}
    found["reference_before"] = measure("the reference loop", lambda: {
        "rate": reference_rate(args.reference, args.iterations, TIMEOUTS["reference"])})
    found["single"] = [measure(f"train, seed {s}", lambda s=s: single_run(args.config, s, root)) for s in single_seeds]
    found["population"] = measure(f"train --population {k}", lambda: population_run(args.config, seeds, root, "population"))
    found["sweep_population"] = measure(f"sweep --seeds {seeds_text(seeds)} --population",
                                        lambda: sweep_run(args.config, seeds, root, "population", ["--population"]))
    found["sweep"] = measure(f"sweep --seeds {seeds_text(seeds)} --jobs 2",
                             lambda: sweep_run(args.config, seeds, root, "single", ["--jobs", "2"]))
    if args.fixed_budget:
        fixed = ("evaluation.stop_when_solved=false", f"training.num_iterations={args.fixed_iterations}")
        found["fixed"] = measure(f"train --population {k}, fixed budget",
                                 lambda: population_run(args.config, seeds, root, "fixed", fixed))
    found["reference_after"] = measure("the reference loop", lambda: {
        "rate": reference_rate(args.reference, args.iterations, TIMEOUTS["reference"])})
    return found


# -- the tables

def verdict(ok: Optional[bool]) -> str:
    return "-" if ok is None else ("yes" if ok else "**no**")


def load_text(result: dict) -> str:
    return f"{result['load'][0]:.2f} → {result['load'][1]:.2f}"


def steps_of(summary: dict) -> float:
    """Env steps to the first confirmed solve; an unsolved seed ranks after every solved one (inf)."""
    steps = summary.get("solved_env_steps")
    return float(steps) if steps is not None else float("inf")


def peak_rss(result: dict, key: str = "peak_rss_mb") -> float:
    """The process's peak RSS: each member's summary reads it when that member ends, so the largest is the peak
    (`key` evaluator_peak_rss_mb: the population's evaluator process's, in the summaries written at its end)."""
    return max(s.get(key) or 0.0 for s in result["runs"].values())


def commands_table(found: dict, seeds: list[int], args: argparse.Namespace) -> list[str]:
    """Every command that ran, in order: its wall seconds (the reference loop: its rate) and the load around it."""
    k, text = len(seeds), seeds_text(seeds)
    rows = [("the tutorial's reference loop, at the start", f"`reference_loop.py {args.iterations}`",
             f"{found['reference_before']['rate']:.0f} it/s", found["reference_before"])]
    for result in found["single"]:
        seed = next(iter(result["runs"]))
        rows.append((f"one seed ({seed})", f"`train --set training.seed={seed}`", f"{result['wall_s']:.1f} s", result))
    rows += [(f"{k} seeds, one population", f"`train --population {k}`",
              f"{found['population']['wall_s']:.1f} s", found["population"]),
             (f"{k} seeds, one population, through a sweep", f"`sweep --seeds {text} --population`",
              f"{found['sweep_population']['wall_s']:.1f} s", found["sweep_population"]),
             (f"{k} seeds, ordinary runs, 2 at a time", f"`sweep --seeds {text} --jobs 2`",
              f"{found['sweep']['wall_s']:.1f} s", found["sweep"])]
    if "fixed" in found:
        rows.append((f"{k} seeds, one population, fixed budget", f"`train --population {k} --set "
                     f"evaluation.stop_when_solved=false --set training.num_iterations={args.fixed_iterations}`",
                     f"{found['fixed']['wall_s']:.1f} s", found["fixed"]))
    rows.append(("the tutorial's reference loop, at the end", f"`reference_loop.py {args.iterations}`",
                 f"{found['reference_after']['rate']:.0f} it/s", found["reference_after"]))
    lines = ["| what | command | wall time (process start to exit) | load (1 min) before → after |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {what} | {cmd} | {shown} | {load_text(result)} |" for what, cmd, shown, result in rows]
    walls = [r["wall_s"] for r in found["single"]]
    lines.append(f"| one seed, over {len(walls)} seeds | | median {median(walls):.1f} s (min {min(walls):.1f}, "
                 f"max {max(walls):.1f}) | |")
    return lines


def learning(found: dict, seeds: list[int]) -> dict:
    """Env steps to the first confirmed solve, population (train --population) against single runs (the sweep of
    ordinary runs): both lists, their medians, solved counts, and the two-sided Mann-Whitney U test's p-value."""
    from scipy.stats import mannwhitneyu

    population = [steps_of(found["population"]["runs"][s]) for s in seeds]
    single = [steps_of(found["sweep"]["runs"][s]) for s in seeds]
    test = mannwhitneyu(population, single, alternative="two-sided")
    solved = [sum(v != float("inf") for v in values) for values in (population, single)]
    return {"population": population, "single": single, "p": float(test.pvalue), "u": float(test.statistic),
            "solved": solved, "medians": [median(v for v in values if v != float("inf"))
                                          for values in (population, single)]}


def targets_table(found: dict, seeds: list[int], learned: dict) -> list[str]:
    """Issue 51's targets, each with what this run measured and whether it met it."""
    k, one = len(seeds), median(r["wall_s"] for r in found["single"])
    pop, pop_sweep, sweep = (found[n]["wall_s"] for n in ("population", "sweep_population", "sweep"))
    single_rss = median(s["peak_rss_mb"] for r in found["single"] for s in r["runs"].values())
    rss = peak_rss(found["population"])
    lines = ["| target (issue 51) | measured | met? |", "| --- | --- | --- |",
             f"| {k} seeds as one population ≤ ×{TARGETS['population_over_single']:g} one seed's whole command | "
             f"×{pop / one:.2f} ({pop:.1f} s against a median of {one:.1f} s); through `sweep --population`: "
             f"×{pop_sweep / one:.2f} ({pop_sweep:.1f} s) | {verdict(pop / one <= TARGETS['population_over_single'])} |",
             f"| `sweep --jobs 2` over the same {k} seeds ≥ ×{TARGETS['sweep_over_population']:g} the population's "
             f"time | ×{sweep / pop:.2f} ({sweep:.1f} s against {pop:.1f} s); against `sweep --population`: "
             f"×{sweep / pop_sweep:.2f} | {verdict(sweep / pop >= TARGETS['sweep_over_population'])} |",
             f"| the same learning: env steps to the first confirmed solve, two-sided Mann-Whitney U, p > "
             f"{TARGETS['p_value']:g} | p = {learned['p']:.3f} (U = {learned['u']:.1f}); medians "
             f"{learned['medians'][0]:,.0f} (population) and {learned['medians'][1]:,.0f} (single runs) | "
             f"{verdict(learned['p'] > TARGETS['p_value'])} |",
             f"| {k}/{k} seeds solve in both | population {learned['solved'][0]}/{k}, single runs "
             f"{learned['solved'][1]}/{k} | {verdict(min(learned['solved']) == k)} |",
             f"| peak RSS of the population ≤ ×{TARGETS['rss']:g} one seed's | ×{rss / single_rss:.2f} ({rss:.0f} MB "
             f"against a median of {single_rss:.0f} MB: each the training process's own) | "
             f"{verdict(rss / single_rss <= TARGETS['rss'])} |"]
    if "fixed" in found:
        runs = found["fixed"]["runs"].values()
        holds = sum(holds_final(s) for s in runs)
        lines.append(f"| the held final policy: ≥ {k - TARGETS['final_misses']}/{k} seeds ≥ the solve target over "
                     f"100 fresh episodes | {holds}/{k} | {verdict(holds >= k - TARGETS['final_misses'])} |")
    return lines


def holds_final(summary: dict) -> bool:
    target, final = summary.get("solve_return_target"), summary.get("final_policy_return")
    return target is not None and final is not None and final >= target


def steps_cell(summary: Optional[dict]) -> str:
    if summary is None:
        return "-"
    steps = summary.get("solved_env_steps")
    return f"{steps:,}" if steps is not None else f"not solved ({summary.get('env_steps', 0):,} steps)"


def seeds_table(found: dict, seeds: list[int]) -> list[str]:
    """Each seed: its env steps to solve in every command that trained it, when the population saw it solved, and
    (with --fixed-budget) its held final policy's return."""
    single = {seed: run for r in found["single"] for seed, run in r["runs"].items()}
    head = ("| seed | env steps to solve: `train --population` | `sweep --population` | single run (`sweep --jobs 2`) | "
            "single run (`train`) | population: seconds to its solve |")
    fixed = found.get("fixed")
    if fixed:
        head += " fixed budget: final policy, 100 episodes |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for seed in seeds:
        member = found["population"]["runs"][seed]
        solved_s = member.get("solved_wall_s")
        line = (f"| {seed} | {steps_cell(member)} | {steps_cell(found['sweep_population']['runs'][seed])} | "
                f"{steps_cell(found['sweep']['runs'][seed])} | {steps_cell(single.get(seed))} | "
                f"{f'{solved_s:.1f} s' if solved_s is not None else '-'} |")
        if fixed:
            run = fixed["runs"][seed]
            final = run.get("final_policy_return")
            line += f" {final:.1f}{'' if holds_final(run) else ' (**< target**)'} |" if final is not None else " - |"
        lines.append(line)
    return lines


def memory_table(found: dict) -> list[str]:
    """Peak RSS of each kind of process (the training process's own; a single run's evaluator and video renderer
    are processes of their own, and so is a population's evaluator)."""
    runs = [s for r in found["single"] for s in r["runs"].values()]

    def spread(key: str) -> str:
        values = [r.get(key) for r in runs if r.get(key) is not None]
        return f"{median(values):.0f} MB ({min(values):.0f}-{max(values):.0f})" if values else "-"

    lines = ["| process | peak RSS |", "| --- | --- |",
             f"| one seed's `train` (median over its runs, min-max) | {spread('peak_rss_mb')} |",
             f"| its evaluator process, beside it | {spread('evaluator_peak_rss_mb')} |",
             f"| its video renderer process, beside it | {spread('renderer_peak_rss_mb')} |",
             f"| `train --population` | {peak_rss(found['population']):.0f} MB |",
             f"| its evaluator process, beside it | {peak_rss(found['population'], 'evaluator_peak_rss_mb'):.0f} MB |",
             f"| `sweep --population`'s population process | {peak_rss(found['sweep_population']):.0f} MB |"]
    if "fixed" in found:
        lines.append(f"| `train --population`, fixed budget | {peak_rss(found['fixed']):.0f} MB |")
    return lines


def distributions(learned: dict, seeds: list[int]) -> list[str]:
    def listed(values: list) -> str:
        return ", ".join("never" if v == float("inf") else f"{v:,.0f}" for v in sorted(values))

    return [f"Env steps to the first confirmed solve, sorted: population ({len(seeds)} seeds) {listed(learned['population'])}; "
            f"single runs {listed(learned['single'])}."]


def tables(found: dict, seeds: list[int], args: argparse.Namespace) -> list[str]:
    learned = learning(found, seeds)
    return [*targets_table(found, seeds, learned), "", *commands_table(found, seeds, args), "",
            *seeds_table(found, seeds), "", *distributions(learned, seeds), "", *memory_table(found)]


# -- the command

def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", action="store_true", help=argparse.SUPPRESS)  # benchmark.py's switch
    parser.add_argument("--seeds", default="0-15", help="the population's seeds, consecutive (default %(default)s)")
    parser.add_argument("--single-seeds", default="0-4",
                        help="the seeds of one seed's whole command, each a fresh `train` (default %(default)s)")
    parser.add_argument("--fixed-budget", action="store_true",
                        help="also the held final policy: the population with the early stop off for "
                             "--fixed-iterations iterations, each seed's policy/final over 100 fresh episodes")
    parser.add_argument("--fixed-iterations", type=int, default=20000, help=argparse.SUPPRESS)
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=argparse.SUPPRESS)  # (a quick check: smoke.yaml)
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, metavar="PATH",
                        help="the tutorial's training loop, run first and last as a gauge of the machine's load")
    parser.add_argument("--iterations", type=int, default=6000, help="iterations of the reference loop")
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables into PATH between its "
                                                            "benchmark_population.py markers (docs/benchmarks.md)")
    return parser.parse_args(argv)


def checked_seeds(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """--seeds (consecutive: `train --population K` trains training.seed and the K-1 after it) and --single-seeds;
    bad input is a UserError before anything runs."""
    seeds = parse_seeds(args.seeds)
    try:
        single = parse_seeds(args.single_seeds)
    except UserError as exc:  # parse_seeds names --seeds
        raise UserError(str(exc).replace("--seeds", "--single-seeds", 1)) from None
    if len(seeds) < 2 or seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        raise UserError(f"--seeds {args.seeds}: a population needs at least 2 consecutive seeds, e.g. 0-15")
    if not os.path.isfile(args.config):
        raise UserError(f"--config {args.config}: no such file")
    if not os.path.isfile(args.reference):
        raise UserError(f"--reference {args.reference}: no such file (the tutorial's loop is the yardstick)")
    if args.fixed_iterations <= 0 or args.iterations <= 0:
        raise UserError("--fixed-iterations and --iterations: must be positive")
    folder = os.path.dirname(os.path.abspath(args.markdown)) if args.markdown else None
    if folder is not None and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        raise UserError(f"--markdown {args.markdown}: cannot write there (no such folder, or no permission)")
    return seeds, single


def main(argv: list[str]) -> None:
    args = parse(argv)
    seeds, single_seeds = checked_seeds(args)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="dqn-population-bench-") as root:
        found = measure_all(args, seeds, single_seeds, root)
        body = tables(found, seeds, args)
    took = time.time() - started
    print("\n".join(body))
    loads = (found["reference_before"]["load"][0], found["reference_after"]["load"][1])
    print(f"\n(benchmark took {took:.0f} s; load average (1 min) {loads[0]:.2f} at the start, {loads[1]:.2f} at "
          f"the end)")
    if args.markdown:
        rate = (found["reference_before"]["rate"] + found["reference_after"]["rate"]) / 2
        head = (f"Measured on {measured_between(started)} with `python scripts/benchmark.py "
                f"{' '.join(['--population', *(a for a in argv if a != '--population')])}` (took {took / 60:.0f} min) on {machine()}; load average (1 min) "
                f"{loads[0]:.2f} at the start and {loads[1]:.2f} at the end; the tutorial's reference loop ran at "
                f"{rate:.0f} it/s in the same run ({found['reference_before']['rate']:.0f} at the start, "
                f"{found['reference_after']['rate']:.0f} at the end; a quiet machine's is 160).")
        splice_between(args.markdown, BEGIN, END, head, body)
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
