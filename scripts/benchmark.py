"""Speed benchmark: the main job in seconds, throughput against the tutorial loop, evaluation time, memory.

Usage: python scripts/benchmark.py [--seeds 0,1,2,3,4] [--iterations 6000] [--reference PATH] [--set KEY=VALUE]
                                   [--markdown docs/benchmarks.md]
       python scripts/benchmark.py --scale-out 1,2 [--iterations 3000] [--seeds 1,2,3]

Prints markdown tables (and with --markdown writes them into that page between its benchmark.py
markers, naming the run: date, command, load average, the reference loop's rate):
  * the targets of issue 17, each measured here: the median over the seeds of the default run
    (`train` on configs/default.yaml, videos included, as `make train` runs it), from process
    start to a saved policy whose greedy average over 100 episodes is >= 475, and to the process's
    exit with both videos, the plots and report.html written; its peak RSS; the compiled tf_uniform
    ratio below. Absolute seconds hold on a quiet machine, where the reference loop runs at >= 160
    it/s: when it ran slower, the seconds are also shown scaled by its rate (x rate / 160);
  * each seed's run, and the median of each phase of the run (summary.json's `phases`, plus the
    summary, report and exit after them);
  * iterations per second at the tutorial's hyperparameters (one env step and one gradient
    step of batch 64 per iteration) for each replay backend with the compiled driver, and with
    `collection.driver: py` (the tutorial's PyDriver loop) on tf_uniform and Reverb, and the ratio against
    the tutorial's own loop (`--reference PATH`, by default shared/bench/reference_loop.py next to the
    repository or the folder above it), measured before and after the runs (steady state: both exclude
    evaluation and the first 1,000 iterations, which include tracing); without that file the ratios are skipped;
  * 10 greedy CartPole-v1 episodes of a solved policy (5,000 steps): seconds.
With `--scale-out 1,2 [--seeds 1,2,3]` it runs scripts/benchmark_scale_out.py instead (see there).
With `--capacity [1,2,4,8,16] [--seconds 8]` it runs scripts/benchmark_capacity.py instead (see there).
With `--sweep [--seeds 0-7]` it runs scripts/benchmark_sweep.py instead (sweep --ray against sweep --jobs 2).
With `--reuse [--seeds 0-3]`, scripts/benchmark_worker_reuse.py (a fresh process per run against one reused process).
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
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from dqn_cartpole.errors import UserError  # noqa: E402  (light: no TensorFlow)
from dqn_cartpole.experiments.grid import parse_seeds  # noqa: E402

# shared/bench/reference_loop.py next to the repository, or next to a folder above it (a git worktree)
DEFAULT_REFERENCE = next((os.path.join(folder, "shared", "bench", "reference_loop.py") for folder in
                          (os.path.dirname(REPO), os.path.dirname(os.path.dirname(REPO)))
                          if os.path.isfile(os.path.join(folder, "shared", "bench", "reference_loop.py"))),
                         os.path.join(os.path.dirname(REPO), "shared", "bench", "reference_loop.py"))
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


QUIET_REFERENCE = 160.0  # it/s of the reference loop on a quiet 2-core machine: the targets hold there
TARGETS = {"policy_s": 8.0, "exit_s": 12.0, "rss_mb": 700.0, "ratio": 10.0}
BEGIN, END = "<!-- benchmark.py: begin -->", "<!-- benchmark.py: end -->"


def default_run(seed: int, workdir: str, overrides: list[str]) -> dict:
    """`make train` with `--set training.seed=SEED`, videos and all: from process start to a saved, solve-checked
    policy (summary.json's `solved_wall_s`) and to the process's exit, its phases and its peak memory."""
    from dqn_cartpole.processes.start_time import process_start_time

    out = os.path.join(workdir, f"train-s{seed}")
    args = [sys.executable, "-m", "dqn_cartpole", "train", "--output-dir", out, "--quiet", "--overwrite",
            "--set", f"training.seed={seed}"]
    for item in overrides:
        args += ["--set", item]
    process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    created = process_start_time(process.pid)  # where `solved_wall_s` counts from
    stdout, stderr = process.communicate()
    exit_s = time.time() - created
    if process.returncode != 0:
        raise SystemExit(f"train failed ({' '.join(args)}):\n{stderr[-2000:]}")
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
            "env_steps": summary["solved_env_steps"], "solved_return": summary["solved_return"],
            "rss_mb": summary["peak_rss_mb"], "renderer_rss_mb": summary.get("renderer_peak_rss_mb"),
            "phases": phases, "encoder_s": summary.get("parallel", {}).get("video encoder (another process)"),
            "run": out}


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def scaled(seconds: float, reference: Optional[float]) -> str:
    """`seconds`, and what they come to on a quiet machine (the issue's rule: scale by the reference's rate)."""
    if reference is None or reference >= QUIET_REFERENCE:
        return f"{seconds:.1f} s"
    return f"{seconds:.1f} s (scaled to a quiet machine: {seconds * reference / QUIET_REFERENCE:.1f} s)"


def single_process_tables(runs: list[dict], rates: dict, reference: Optional[float], references: tuple,
                          eval_s: float) -> list[str]:
    """The markdown tables: the targets, the runs seed by seed, the phases, the throughput."""
    ok = [r for r in runs if r["solved"]]
    policy, exit_ = median(r["policy_s"] for r in ok), median(r["exit_s"] for r in runs)
    factor = 1.0 if reference is None or reference >= QUIET_REFERENCE else reference / QUIET_REFERENCE
    rss = max(r["rss_mb"] for r in runs)
    compiled = rates.get("tf_uniform")
    ratio = compiled / reference if compiled and reference else None

    def verdict(value: Optional[float], target: float) -> str:
        return "-" if value is None or value != value else ("yes" if value <= target else "**no**")

    lines = ["| target | measured (median of the seeds) | met? |", "| --- | --- | --- |",
             f"| process start to a saved, solve-checked policy ≤ {TARGETS['policy_s']:g} s | "
             f"{scaled(policy, reference)} ({len(ok)}/{len(runs)} seeds solved) | "
             f"{verdict(policy * factor, TARGETS['policy_s'])} |",
             f"| process start to exit, videos, plots and report.html written ≤ {TARGETS['exit_s']:g} s | "
             f"{scaled(exit_, reference)} | {verdict(exit_ * factor, TARGETS['exit_s'])} |",
             f"| peak RSS with video ≤ {TARGETS['rss_mb']:g} MB | {rss:.0f} MB (the trainer; the video renderer "
             f"process: {max((r['renderer_rss_mb'] or 0) for r in runs):.0f} MB) | {verdict(rss, TARGETS['rss_mb'])} |"]
    if ratio is not None:
        lines.append(f"| compiled tf_uniform at the tutorial's hyperparameters ≥ ×{TARGETS['ratio']:g} the reference "
                     f"loop | ×{ratio:.1f} ({compiled:,.0f} against {reference:.0f} it/s) | "
                     f"{'yes' if ratio >= TARGETS['ratio'] else '**no**'} |")
    lines += ["", "| seed | env steps to solve | policy saved | process exit | greedy return, 100 episodes | "
                  "peak RSS |", "| --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        solved = f"{r['env_steps']:,}" if r["solved"] else "not solved"
        lines.append(f"| {r['seed']} | {solved} | {r['policy_s'] or float('nan'):.1f} s | {r['exit_s']:.1f} s | "
                     f"{r['solved_return'] or float('nan'):.1f} | {r['rss_mb']:.0f} MB |")
    names = []
    for r in runs:
        names += [n for n in r["phases"] if n not in names]
    total = sum(median(r["phases"].get(n, 0.0) for r in runs) for n in names)
    lines += ["", "| phase (median over the seeds) | seconds | share |", "| --- | --- | --- |"]
    for name in names:
        seconds = median(r["phases"].get(name, 0.0) for r in runs)
        lines.append(f"| {name} | {seconds:.2f} | {100 * seconds / total:.0f}% |")
    lines.append(f"| video encoder (another process, in parallel with the plots) | "
                 f"{median(r['encoder_s'] for r in runs):.2f} | |")
    if reference is not None:
        lines += ["", f"| throughput, one env step and one gradient step of batch 64 per iteration | it/s | "
                      f"× the reference |", "| --- | --- | --- |",
                  f"| the reference loop (the tutorial's, Reverb, PyDriver) | {reference:.0f} (before "
                  f"{references[0]:.0f}, after {references[1]:.0f}) | 1 |"]
        lines += [f"| {name} | {rate:,.0f} | ×{rate / reference:.1f} |" for name, rate in rates.items()]
    lines.append(f"\n10 greedy episodes of CartPole-v1 (5,000 steps) with a saved policy: {eval_s:.2f} s.")
    return lines


def write_markdown(path: str, body: list[str], meta: dict) -> None:
    """Writes the tables between BEGIN and END in `path` (the rest of the page is kept), naming the run."""
    head = [BEGIN, f"Measured on {meta['date']} with `{meta['command']}` (took {meta['took_s'] / 60:.0f} min); "
                   f"load average (1 min) {meta['load'][0]:.2f} before and {meta['load'][1]:.2f} after; the "
                   f"tutorial's reference loop ran at {meta['reference']:.0f} it/s in the same run (≥ "
                   f"{QUIET_REFERENCE:.0f} on a quiet machine, where the absolute targets hold; on a loaded one "
                   f"seconds are also shown scaled by that rate). {meta['machine']}.", ""]
    text = "\n".join(head + body + ["", END])
    old = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
    if BEGIN in old and END in old:
        text = old.split(BEGIN)[0] + text + old.split(END, 1)[1]
    else:
        text = old + ("\n" if old else "") + text + "\n"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def single_process_benchmark(args: argparse.Namespace) -> None:
    """The main job in seconds (default runs with videos), throughput against the reference, evaluation."""
    folder = os.path.dirname(os.path.abspath(args.markdown)) if args.markdown else None
    if folder is not None and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        print(f"error: --markdown {args.markdown}: cannot write there (no such folder, or no permission)",
              file=sys.stderr)
        raise SystemExit(2)
    seeds = parse_seeds(args.seeds)
    workdir = tempfile.mkdtemp(prefix="dqn-bench-")
    started, load_before = time.time(), os.getloadavg()[0]
    has_reference = os.path.isfile(args.reference)
    if not has_reference:
        print(f"no reference loop at {args.reference}: the speed ratios are skipped (give the tutorial's loop "
              f"with --reference PATH)", file=sys.stderr)
    reference_before = reference_rate(args.reference, args.iterations) if has_reference else None
    print("the default run, videos included...", file=sys.stderr)
    runs = [default_run(seed, workdir, args.overrides) for seed in seeds]
    print("throughput (tutorial hyperparameters)...", file=sys.stderr)
    rates = {backend: project_rate(backend, args.iterations, workdir, []) for backend in args.backends.split(",")}
    for backend in ("tf_uniform", "reverb"):  # the tutorial's own loop shape: PyDriver, then a compiled train step
        rates[f"{backend}, collection.driver: py"] = project_rate(backend, args.iterations, workdir, [], driver="py")
    rates["tf_uniform, 8 envs x 8 steps"] = project_rate(
        "tf_uniform", args.iterations // 8, workdir,
        ["env.num_envs=8", "training.collect_steps_per_iteration=8", "training.train_steps_per_iteration=8",
         "evaluation.eval_interval=125", "training.log_interval=25"]) * 8
    reference_after = reference_rate(args.reference, args.iterations) if has_reference else None
    reference = (reference_before + reference_after) / 2 if has_reference else None
    solved_run = next((r["run"] for r in runs if r["solved"]), None)
    eval_s = evaluation_seconds(solved_run) if solved_run else float("nan")
    body = single_process_tables(runs, rates, reference, (reference_before, reference_after), eval_s)
    print("\n".join(body))
    took = time.time() - started
    print(f"\n(benchmark took {took:.0f} s; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"runs in {workdir})")
    if args.markdown:
        import platform

        command = "python scripts/benchmark.py " + " ".join(sys.argv[1:])
        write_markdown(args.markdown, body, {
            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "command": command.strip(), "took_s": took,
            "load": (load_before, os.getloadavg()[0]), "reference": reference or float("nan"),
            "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"})
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
    parser.add_argument("--scale-out", default="", metavar="N,N,...",
                        help="only the scale-out section (scripts/benchmark_scale_out.py, which takes the other "
                             "arguments too): train --topology local with each number of collectors, the learner "
                             "alone on each replay, time to solve local vs single-process (--seeds)")
    parser.add_argument("--capacity", nargs="?", const="1,2,4,8,16", metavar="N,N,...",
                        help="only the capacity benchmark (scripts/benchmark_capacity.py, see there for its options): "
                             "one replay server and one learner fed by N synthetic collectors")
    if any(a == "--capacity" or a.startswith("--capacity=") for a in sys.argv[1:]):
        import benchmark_capacity  # scripts/ is on the path when this file runs as a script

        benchmark_capacity.main(sys.argv[1:])
        return
    if "--scale-out" in sys.argv[1:] or any(a.startswith("--scale-out=") for a in sys.argv[1:]):
        import benchmark_scale_out  # scripts/ is on the path when this file runs as a script

        benchmark_scale_out.main(sys.argv[1:])
        return
    if "--sweep" in sys.argv[1:]:  # the sweep section: scripts/benchmark_sweep.py (sweep --ray against --jobs 2)
        import benchmark_sweep

        benchmark_sweep.main(sys.argv[1:])
        return
    if "--reuse" in sys.argv[1:]:  # a fresh process per run against one reused: scripts/benchmark_worker_reuse.py
        import benchmark_worker_reuse

        benchmark_worker_reuse.main(sys.argv[1:])
        return
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables, naming this run, into PATH "
                                                            "between its benchmark.py markers (e.g. docs/benchmarks.md)")
    args = parser.parse_args()
    single_process_benchmark(args)


if __name__ == "__main__":
    try:
        main()
    except UserError as exc:  # bad input (--seeds, --scale-out): one line, exit status 2
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
