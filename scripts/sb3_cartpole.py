"""Stable-Baselines3's DQN with RL-Zoo's tuned CartPole-v1 hyperparameters, stopped as dqn_cartpole stops.

Usage (with an interpreter that has stable-baselines3 and rl_zoo3; it never imports dqn_cartpole):
    /path/to/sb3-venv/bin/python scripts/sb3_cartpole.py --seed 1 --out /tmp/sb3-s1

The hyperparameters are read from the installed rl_zoo3's own hyperparams/dqn.yml (its CartPole-v1 entry, its
`policy_kwargs` string evaluated as RL-Zoo evaluates it), and the run trains for its `n_timesteps` at most, in
RL-Zoo's env (`make_vec_env`, one env, seeded). The stopping protocol is dqn_cartpole's default:
  * every --eval-interval env steps (default: the zoo's train_freq, so each evaluation sees new weights), 10 greedy
    episodes side by side in a seeded gymnasium vector env of their own;
  * an evaluation averaging >= 475 (CartPole-v1's reward threshold) is followed by the solve check: 100 fresh
    greedy episodes, side by side, given up as soon as their average can no longer reach 475; it confirms a solve
    when their average is at least 475 + --solve-margin (2) standard errors;
  * a confirmed solve saves the model (`model.save`, OUT/policy.zip) and stops the training.
The greedy episodes run the Q-network on whole batches, as dqn_cartpole's do.

Prints one JSON line: seed, solved, solved_env_steps, solved_return, saved_unix_s (time.time() once the policy
was saved: the caller subtracts this process's start), evaluations, hyperparameters, versions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SOLVE_RETURN = 475.0
EVAL_EPISODES, CHECK_EPISODES = 10, 100
EVAL_SEED_OFFSET, CHECK_SEED_OFFSET = 10_000, 20_000  # as dqn_cartpole's (its build.py)


def zoo_hyperparameters(env_id: str) -> dict:
    """RL-Zoo's tuned hyperparameters for `env_id`, from the installed rl_zoo3's hyperparams/dqn.yml."""
    import rl_zoo3
    import yaml

    path = os.path.join(os.path.dirname(rl_zoo3.__file__), "hyperparams", "dqn.yml")
    with open(path, encoding="utf-8") as handle:
        params = dict(yaml.safe_load(handle)[env_id])
    if isinstance(params.get("policy_kwargs"), str):  # RL-Zoo evaluates this string (exp_manager.py)
        params["policy_kwargs"] = eval(params["policy_kwargs"], {"dict": dict})  # noqa: S307 (the zoo's own file)
    return params


def greedy_episodes(model, env, give_up_below=None):
    """One greedy episode in each of the vector env's copies, side by side; returns their returns (cut short,
    with give_up_below, once their average can no longer reach it). The greedy action is the argmax of the
    model's Q-network on the whole batch (what `model.predict(deterministic=True)` computes, without its
    per-call conversions)."""
    import numpy as np
    import torch

    n = env.num_envs
    observations, _ = env.reset()
    returns, done = np.zeros(n), np.zeros(n, bool)
    while not done.all():
        if give_up_below is not None and np.where(done, returns, 500.0).sum() < give_up_below * n:
            break
        with torch.no_grad():
            q_values = model.q_net(torch.as_tensor(observations, dtype=torch.float32, device=model.device))
        actions = q_values.argmax(dim=1).cpu().numpy()
        observations, rewards, terminated, truncated, _ = env.step(actions)
        returns += np.where(done, 0.0, rewards)
        done |= terminated | truncated
    return returns


def stop_callback(model_path: str, seed: int, interval: int, margin: float, record: dict):
    """A callback that evaluates every `interval` env steps and stops the training on a confirmed, saved solve."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    evaluation = gym.make_vec("CartPole-v1", num_envs=EVAL_EPISODES, vectorization_mode="vector_entry_point")
    evaluation.reset(seed=seed + EVAL_SEED_OFFSET)
    check = {}

    class StopWhenSolved(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % interval:
                return True
            returns = greedy_episodes(self.model, evaluation)
            record["evaluations"].append([self.num_timesteps, float(returns.mean())])
            if returns.mean() < SOLVE_RETURN:
                return True
            if "env" not in check:  # seeded at the first check, as dqn_cartpole's solve check
                check["env"] = gym.make_vec("CartPole-v1", num_envs=CHECK_EPISODES,
                                            vectorization_mode="vector_entry_point")
                check["env"].reset(seed=seed + CHECK_SEED_OFFSET + self.num_timesteps)
            confirmed = greedy_episodes(self.model, check["env"], give_up_below=SOLVE_RETURN)
            standard_error = confirmed.std(ddof=1) / np.sqrt(len(confirmed))
            if confirmed.mean() < SOLVE_RETURN + margin * standard_error:
                return True
            self.model.save(model_path)
            record.update(solved=True, solved_env_steps=self.num_timesteps, solved_return=float(confirmed.mean()),
                          saved_unix_s=time.time())
            return False

    return StopWhenSolved()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", required=True, help="folder for the saved policy (policy.zip)")
    parser.add_argument("--eval-interval", type=int, default=None,
                        help="env steps between evaluations (default: the zoo's train_freq)")
    parser.add_argument("--solve-margin", type=float, default=2.0)
    args = parser.parse_args()
    import stable_baselines3
    import torch
    from rl_zoo3 import __version__ as zoo_version
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    params = zoo_hyperparameters("CartPole-v1")
    budget = int(params.pop("n_timesteps"))
    interval = args.eval_interval or int(params.get("train_freq", 250))
    os.makedirs(args.out, exist_ok=True)
    record = {"seed": args.seed, "solved": False, "solved_env_steps": None, "solved_return": None,
              "saved_unix_s": None, "evaluations": [], "hyperparameters": {**params, "n_timesteps": budget},
              "eval_interval": interval, "versions": {"stable_baselines3": stable_baselines3.__version__,
                                                      "rl_zoo3": zoo_version, "torch": torch.__version__}}
    env = make_vec_env("CartPole-v1", n_envs=1, seed=args.seed)
    model = DQN(env=env, seed=args.seed, verbose=0, **params)
    model.learn(total_timesteps=budget, callback=stop_callback(os.path.join(args.out, "policy.zip"), args.seed,
                                                                interval, args.solve_margin, record))
    record["env_steps"] = int(model.num_timesteps)
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
