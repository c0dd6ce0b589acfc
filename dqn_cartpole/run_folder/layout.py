"""The fixed layout of a run folder. Every file and folder name lives here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

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


class _Inside:
    """A path inside the run folder, as `RunLayout`'s attribute: `RunLayout(root).NAME` joins root and the parts."""

    def __init__(self, *parts: str):
        self.parts = parts

    def __get__(self, layout: Optional["RunLayout"], owner: type) -> Any:
        return self if layout is None else os.path.join(layout.root, *self.parts)


@dataclass(frozen=True)
class RunLayout:
    """Paths inside one run folder."""

    root: str
    config = _Inside(CONFIG_FILE)
    written_config = _Inside(WRITTEN_CONFIG_FILE)
    train_metrics = _Inside(TRAIN_METRICS_FILE)
    eval_metrics = _Inside(EVAL_METRICS_FILE)
    plots = _Inside(PLOTS_DIR)
    returns_plot = _Inside(PLOTS_DIR, RETURNS_PLOT)
    loss_plot = _Inside(PLOTS_DIR, LOSS_PLOT)
    epsilon_plot = _Inside(PLOTS_DIR, EPSILON_PLOT)
    q_values_plot = _Inside(PLOTS_DIR, Q_VALUES_PLOT)
    collectors_plot = _Inside(PLOTS_DIR, COLLECTORS_PLOT)
    priorities_plot = _Inside(PLOTS_DIR, PRIORITIES_PLOT)
    atoms_plot = _Inside(PLOTS_DIR, ATOMS_PLOT)
    atoms = _Inside(ATOMS_FILE)
    report = _Inside(REPORT_FILE)
    videos = _Inside(VIDEOS_DIR)
    trained_video = _Inside(VIDEOS_DIR, TRAINED_VIDEO)
    random_video = _Inside(VIDEOS_DIR, RANDOM_VIDEO)
    policy = _Inside(POLICY_DIR)
    best_policy = _Inside(POLICY_DIR, BEST_POLICY)
    final_policy = _Inside(POLICY_DIR, FINAL_POLICY)
    checkpoints = _Inside(CHECKPOINTS_DIR)
    tensorboard = _Inside(TENSORBOARD_DIR)
    tracking = _Inside(TRACKING_FILE)
    summary = _Inside(SUMMARY_FILE)
    roles = _Inside(ROLES_DIR)
    placement = _Inside(ROLES_DIR, PLACEMENT_FILE)

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def collector_metrics(self, collector_id: int) -> str:
        return self.path(ROLES_DIR, COLLECTOR_METRICS.format(id=collector_id))
