"""Robustness of the default config: every seed solves, and its policy/final holds up in plain TensorFlow.

Usage: python scripts/check_robustness.py [--seeds 0-9] [--episodes 100] [--set KEY=VALUE ...]

For each seed it trains `configs/default.yaml` (videos off) in a fresh process, then loads the run's
policy/final with `tf.saved_model.load` alone, in another fresh process that never imports this
project (as docs/resume.md shows), and plays `--episodes` greedy CartPole-v1 episodes, episode i
from `env.reset(seed=1_000_000 + i)`: seeds no training or solve check used. Prints a markdown
table and exits 1 unless every seed solved with a plain-TF average of at least 475.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
THRESHOLD = 475.0
FRESH_SEEDS = 1_000_000

# Runs in a clean interpreter (python -I): only gymnasium, numpy, TensorFlow and TF-Agents' time_step.
PLAIN_TF = """
import json, sys
import gymnasium as gym
import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

policy = tf.saved_model.load(sys.argv[1])
episodes, first_seed = int(sys.argv[2]), int(sys.argv[3])
envs = [gym.make("CartPole-v1") for _ in range(episodes)]
observations = np.stack([env.reset(seed=first_seed + i)[0] for i, env in enumerate(envs)]).astype(np.float32)
returns, done = np.zeros(episodes), np.zeros(episodes, bool)
while not done.all():  # all episodes side by side: one policy call per step for the batch
    active = np.flatnonzero(~done)
    step = ts.restart(tf.constant(observations[active]), batch_size=len(active))
    actions = policy.action(step).action.numpy()
    for i, action in zip(active, actions):
        observation, reward, terminated, truncated, _ = envs[i].step(int(action))
        observations[i], returns[i] = observation, returns[i] + reward
        done[i] = terminated or truncated
print(json.dumps({"mean": float(returns.mean()), "min": float(returns.min()), "episodes": episodes}))
"""


def train(seed: int, workdir: str, overrides: list[str]) -> dict:
    """The default config on `seed`, videos off (benchmark.py's `run_train`): its summary, and where it ran."""
    from benchmark_common import run_train  # scripts/ is on the path when this file runs as a script

    out = os.path.join(workdir, f"s{seed}")
    return {**run_train("default.yaml", out, [f"training.seed={seed}", "video.enabled=false", *overrides]), "run": out}


def plain_tf_return(policy_dir: str, episodes: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    result = subprocess.run([sys.executable, "-I", "-c", PLAIN_TF, policy_dir, str(episodes), str(FRESH_SEEDS)],
                            cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"plain-TF evaluation of {policy_dir} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    from dqn_cartpole.experiments.grid import parse_seeds

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="dqn-robust-")
    rows, ok = [], True
    for seed in parse_seeds(args.seeds):
        summary = train(seed, workdir, args.overrides)
        solved = summary["solved_at_iteration"] is not None
        plain = plain_tf_return(os.path.join(summary["run"], "policy", "final"), args.episodes) if solved else None
        good = solved and plain["mean"] >= THRESHOLD
        ok &= good
        rows.append((seed, summary, plain, good))
        print(f"  seed {seed}: {'solved' if solved else 'NOT solved'}"
              + (f", plain TF {plain['mean']:.1f}" if plain else ""), file=sys.stderr, flush=True)
    print(f"| seed | env steps to solve | policy saved after | solve check (100 episodes) | plain TF, "
          f"{args.episodes} fresh episodes: mean (min) | ≥ {THRESHOLD:g} |\n| --- | --- | --- | --- | --- | --- |")
    for seed, s, plain, good in rows:
        if s["solved_at_iteration"] is None:
            print(f"| {seed} | not solved | - | - | - | **no** |")
            continue
        print(f"| {seed} | {s['solved_env_steps']:,} | {s['solved_wall_s']:.1f} s | {s['solved_return']:.1f} | "
              f"{plain['mean']:.1f} ({plain['min']:.0f}) | {'yes' if good else '**no**'} |")
    solved = [s for _, s, _, _ in rows if s["solved_at_iteration"] is not None]
    if solved:
        print(f"\n{len(solved)}/{len(rows)} seeds solved; median {statistics.median(s['solved_env_steps'] for s in solved):,.0f} "
              f"env steps, {statistics.median(s['solved_wall_s'] for s in solved):.1f} s to the policy. Runs in {workdir}.")
    return 0 if ok else 1


if __name__ == "__main__":
    from benchmark_common import run_main  # scripts/ is on the path when this file runs as a script

    run_main(main)  # bad input (--seeds): one line, exit status 2
