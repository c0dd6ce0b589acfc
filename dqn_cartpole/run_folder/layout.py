"""The fixed layout of a run folder. Every file and folder name lives here."""

from __future__ import annotations

import os
from dataclasses import dataclass

CONFIG_FILE = "config.yaml"
WRITTEN_CONFIG_FILE = "config.written.yaml"  # the keys the user wrote, as written (`auto` stays auto): what changed
TRAIN_METRICS_FILE = "train_metrics.csv"
EVAL_METRICS_FILE = "eval_metrics.csv"
PLOTS_DIR = "plots"
RETURNS_PLOT = "returns.png"
LOSS_PLOT = "loss.png"
EPSILON_PLOT = "epsilon.png"
Q_VALUES_PLOT = "q_values.png"
COLLECTORS_PLOT = "collectors.png"  # a distributed run: the collectors' speed and weights, the policy lag
PRIORITIES_PLOT = "priorities.png"  # prioritized replay: the importance weights' range and the priorities
ATOMS_PLOT = "atoms.png"  # a distributional agent (C51): its return distribution at a few fixed states
ATOMS_FILE = "atoms.json"  # the numbers that plot draws (run_folder.atoms)
REPORT_FILE = "report.html"
VIDEOS_DIR = "videos"
TRAINED_VIDEO = "trained-agent.mp4"
RANDOM_VIDEO = "random-agent.mp4"
POLICY_DIR = "policy"
BEST_POLICY = "best"  # policy/best: the highest evaluation return so far
FINAL_POLICY = "final"  # policy/final: the policy at the end of the run
CHECKPOINTS_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
SUMMARY_FILE = "summary.json"
TRACKING_FILE = "tracking.json"  # the tracked run (MLflow or W&B) this run folder was sent to, and how far
LOCK_FILE = "run.lock"  # held by the process that owns the run, and passed to the roles it starts (run_folder.lock)
ROLES_LOCK_FILE = "roles.lock"  # held shared by every role of a distributed run (run_folder.lock)
ROLES_DIR = "roles"  # a distributed run: each role's log, and each collector's metrics CSV
COLLECTOR_METRICS = "collector-{id}.csv"
PLACEMENT_FILE = "placement.json"  # a distributed run: where each role runs now (node, pid), and its restarts


@dataclass(frozen=True)
class RunLayout:
    """Paths inside one run folder."""

    root: str

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def config(self) -> str:
        return self.path(CONFIG_FILE)

    @property
    def written_config(self) -> str:
        return self.path(WRITTEN_CONFIG_FILE)

    @property
    def train_metrics(self) -> str:
        return self.path(TRAIN_METRICS_FILE)

    @property
    def eval_metrics(self) -> str:
        return self.path(EVAL_METRICS_FILE)

    @property
    def plots(self) -> str:
        return self.path(PLOTS_DIR)

    @property
    def returns_plot(self) -> str:
        return self.path(PLOTS_DIR, RETURNS_PLOT)

    @property
    def loss_plot(self) -> str:
        return self.path(PLOTS_DIR, LOSS_PLOT)

    @property
    def epsilon_plot(self) -> str:
        return self.path(PLOTS_DIR, EPSILON_PLOT)

    @property
    def q_values_plot(self) -> str:
        return self.path(PLOTS_DIR, Q_VALUES_PLOT)

    @property
    def collectors_plot(self) -> str:
        return self.path(PLOTS_DIR, COLLECTORS_PLOT)

    @property
    def priorities_plot(self) -> str:
        return self.path(PLOTS_DIR, PRIORITIES_PLOT)

    @property
    def atoms_plot(self) -> str:
        return self.path(PLOTS_DIR, ATOMS_PLOT)

    @property
    def atoms(self) -> str:
        return self.path(ATOMS_FILE)

    @property
    def report(self) -> str:
        return self.path(REPORT_FILE)

    @property
    def videos(self) -> str:
        return self.path(VIDEOS_DIR)

    @property
    def trained_video(self) -> str:
        return self.path(VIDEOS_DIR, TRAINED_VIDEO)

    @property
    def random_video(self) -> str:
        return self.path(VIDEOS_DIR, RANDOM_VIDEO)

    @property
    def policy(self) -> str:
        return self.path(POLICY_DIR)

    @property
    def best_policy(self) -> str:
        return self.path(POLICY_DIR, BEST_POLICY)

    @property
    def final_policy(self) -> str:
        return self.path(POLICY_DIR, FINAL_POLICY)

    @property
    def checkpoints(self) -> str:
        return self.path(CHECKPOINTS_DIR)

    @property
    def tensorboard(self) -> str:
        return self.path(TENSORBOARD_DIR)

    @property
    def tracking(self) -> str:
        return self.path(TRACKING_FILE)

    @property
    def summary(self) -> str:
        return self.path(SUMMARY_FILE)

    @property
    def roles(self) -> str:
        return self.path(ROLES_DIR)

    def collector_metrics(self, collector_id: int) -> str:
        return self.path(ROLES_DIR, COLLECTOR_METRICS.format(id=collector_id))

    @property
    def placement(self) -> str:
        return self.path(ROLES_DIR, PLACEMENT_FILE)
