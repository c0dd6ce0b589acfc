"""Speed benchmark: the main job in seconds, throughput against the tutorial loop, evaluation time, memory.

Usage: python scripts/benchmark.py [--seeds 0,1,2,3,4] [--iterations 6000] [--reference PATH] [--set KEY=VALUE]
                                   [--markdown docs/benchmarks.md]
       python scripts/benchmark.py --scale-out 1,2,4 [--iterations 6000] [--seeds 0]

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
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


QUIET_REFERENCE = 160.0  # it/s of the reference loop on a quiet 2-core machine: the targets hold there
TARGETS = {"policy_s": 8.0, "exit_s": 12.0, "rss_mb": 700.0, "ratio": 10.0}
BEGIN, END = "<!-- benchmark.py: begin -->", "<!-- benchmark.py: end -->"


def default_run(seed: int, workdir: str, overrides: list[str]) -> dict:
    """`make train` with `--set training.seed=SEED`, videos and all: from process start to a saved, solve-checked
    policy (summary.json's `solved_wall_s`) and to the process's exit, its phases and its peak memory."""
    import psutil

    out = os.path.join(workdir, f"train-s{seed}")
    args = [sys.executable, "-m", "dqn_cartpole", "train", "--output-dir", out, "--quiet", "--overwrite",
            "--set", f"training.seed={seed}"]
    for item in overrides:
        args += ["--set", item]
    process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    created = psutil.Process(process.pid).create_time()  # where `solved_wall_s` counts from
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
    seeds = [int(s) for s in args.seeds.split(",")]
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
                        help="only the scale-out section: train --topology local with each number of collectors, "
                             "the learner alone on each replay, time to solve local vs single-process (--seeds)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables, naming this run, into PATH "
                                                            "between its benchmark.py markers (e.g. docs/benchmarks.md)")
    parser.add_argument("--learner-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.learner_child is not None:
        learner_child(args.learner_child, args.iterations)
        return
    if args.scale_out:
        scale_out_tables([int(v) for v in args.scale_out.split(",")], args.iterations,
                         [int(s) for s in args.seeds.split(",")], args.reference)
        return
    single_process_benchmark(args)


if __name__ == "__main__":
    main()
