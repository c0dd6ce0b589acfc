"""Scale-out benchmark: `python scripts/benchmark.py --scale-out 1,2,4 [--iterations 6000] [--seeds 0]`
(or this file directly, with the same arguments).

It prints:
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
import subprocess
import sys
import tempfile
import time

from benchmark import DEFAULT_REFERENCE, REPO, reference_rate, time_to_solve


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


def main(argv: list) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale-out", default="1,2", metavar="N,N,...", help="numbers of collectors")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--iterations", type=int, default=6000, help="iterations per throughput run")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, metavar="PATH",
                        help="the tutorial's training loop, run as a gauge of the machine's load")
    parser.add_argument("--learner-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.learner_child is not None:
        learner_child(args.learner_child, args.iterations)
        return
    scale_out_tables([int(v) for v in args.scale_out.split(",")], args.iterations,
                     [int(s) for s in args.seeds.split(",")], args.reference)


if __name__ == "__main__":
    main(sys.argv[1:])
