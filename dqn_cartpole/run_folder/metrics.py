"""The run's metrics CSVs: their columns (one row per train log and one per evaluation) and reading their cells.

Reading and writing the files is `csv_files`' job.
"""

from __future__ import annotations

from typing import Optional

# New columns go at the end: a run resumed from files with an older header gets them added (see CsvLog).
TRAIN_COLUMNS = ("train_step", "env_steps",
                 "loss",  # the mean over the log interval's iterations (each iteration's last gradient step)
                 "epsilon", "replay_size", "replay_inserts",
                 "replay_samples", "samples_per_insert", "wall_s",
                 "mean_max_q",  # the online network's mean max_a Q(s, a) over a fixed set of states
                 "train_steps_per_s",  # since the previous row of this process (empty in its first)
                 # A learner's: its train step minus the train step of the weights that collected the
                 # sampled items, mean and max over the log interval's batches (empty in one process).
                 "policy_lag", "policy_lag_max",
                 "loss_max",  # the largest loss of the interval
                 # The collect (epsilon-greedy) policy's episodes that ended in the interval: their mean return
                 # and how many (empty for a learner, whose collectors are other processes).
                 "collect_return", "collect_episodes",
                 # Prioritized replay (replay.prioritized; empty without): over the log interval's batches, the
                 # smallest importance weight (each batch's largest is 1), the mean and the largest priority written.
                 "importance_weight_min", "priority_mean", "priority_max")
EVAL_COLUMNS = ("train_step", "env_steps", "average_return", "average_episode_length", "num_episodes", "wall_s",
                "min_return", "max_return", "std_return",  # the spread across the evaluation's episodes
                "average_discounted_return",  # sum of gamma^t r_t from each episode's first state
                "average_max_q_at_reset")  # mean of max_a Q(s0, a) over those first states: its estimate


COLLECTOR_COLUMNS = ("wall_s", "env_steps", "episodes", "env_steps_per_s", "weights_train_step", "weights_age_s",
                     "unix_s")  # puts collectors (and a restarted one) on one time axis


def counted_before(rows: list[dict[str, str]]) -> tuple[int, int]:
    """(env steps, episodes) a collector's earlier processes counted: its CSV's last whole row (a row cut short by a
    SIGKILL is skipped), or (0, 0)."""
    for row in reversed(rows):
        try:
            return int(float(row["env_steps"])), int(float(row["episodes"]))
        except (KeyError, TypeError, ValueError):
            continue
    return 0, 0


def column(rows: list[dict[str, str]], name: str) -> list[float]:
    """One numeric column, skipping empty cells."""
    return [float(r[name]) for r in rows if r.get(name) not in (None, "")]


def number(text: Optional[str]) -> Optional[float]:
    """A CSV cell as a float, or None when empty."""
    return None if text in (None, "") else float(text)
