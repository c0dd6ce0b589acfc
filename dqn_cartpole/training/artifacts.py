"""The run's artifact phase: the plots and the videos, made by child processes that start with the run.

Both children (`report.background`: no TensorFlow) start when the session starts, so their imports
(matplotlib, imageio, pygame: ~1 s) overlap the training instead of following it. Once the policy
is final, this process plays the video episodes (a compiled loop, ~0.3 s), hands them to the
renderer, closes the logs, hands the run folder to the plotter, and waits for both: the plots and
the two videos are drawn side by side. A run that never gets there (an error) ends both children
through the end of their stdin.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from dqn_cartpole.config import Config
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core import build
from dqn_cartpole.core.policies import random_act_fn
from dqn_cartpole.report import background, video
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training import phases as phase
from dqn_cartpole.training.phases import Phases

FULL_EPISODES = 1  # episodes of each video shown whole; the later ones are clips (see report.video)


class ArtifactWorkers:
    """The plotter and (with `video.enabled`) the video renderer, started now, given their work at the end."""

    def __init__(self, config: Config, layout: RunLayout, progress: Progress, phases: Phases):
        self.config, self.layout, self.progress, self.phases = config, layout, progress, phases
        self.plotter = background.start_plotter()
        self.renderer = video.VideoProcess() if config.video.enabled else None
        self.peak_rss_mb: dict[str, Optional[float]] = {"renderer_peak_rss_mb": None, "plotter_peak_rss_mb": None}

    def close(self) -> None:
        """Ends the children (those given no work exit at once)."""
        for child in (self.plotter, self.renderer):
            if child is not None:
                child.close()

    def make(self, policy: Any, tf_env: Any, with_videos: bool, close_logs: Callable[[], None],
             with_plots: bool = True) -> dict[str, str]:
        """Plays and renders the videos (if `with_videos`) and draws the plots (if `with_plots`); returns the
        artifacts written."""
        renderer = self.renderer if with_videos else None
        if renderer is not None:
            with self.phases(phase.VIDEOS):
                self.start_videos(renderer, policy, tf_env)
        with self.phases(phase.CLOSING):
            close_logs()  # the logs are complete before they are plotted
        artifacts: dict[str, str] = {}
        if not with_plots:
            return artifacts
        with self.phases(phase.PLOTS):
            self.progress.stage("Drawing the plots" + (" while the videos render" if renderer else ""))
            artifacts.update(self.plots())
        if renderer is not None:
            with self.phases(phase.VIDEOS):
                self.progress.stage("Rendering the videos")
                artifacts.update(self.videos(renderer))
        return artifacts

    def start_videos(self, renderer: video.VideoProcess, policy: Any, tf_env: Any) -> None:
        """Plays the trained agent's episodes (side by side, compiled) and the random agent's, then renders them."""
        self.progress.stage("Playing the episodes for the videos")
        cfg, layout = self.config, self.layout
        seed, env_id, steps = cfg.training.seed + build.VIDEO_SEED_OFFSET, cfg.env.id, cfg.env.max_episode_steps
        trained = video.play_side_by_side(policy, env_id, cfg.video.num_episodes, seed, steps)
        random_act = random_act_fn(tf_env.time_step_spec(), tf_env.action_spec(), seed=seed)
        random = video.play(random_act, env_id, cfg.video.random_episodes, seed, steps)
        renderer.send_job(video.VideoJob(env_id, steps, cfg.video.fps, (
            video.VideoSpec(layout.trained_video, "trained agent", trained, FULL_EPISODES),
            video.VideoSpec(layout.random_video, "random agent", random, FULL_EPISODES)), video.env_fps(env_id)),
            self.progress.artifact_progress)

    def plots(self) -> dict[str, str]:
        """The plotter draws the run's plots; returns them by file name (none, with a warning, if it failed)."""
        written: list[str] = []
        self.plotter.on_line = lambda line: written.append(line.split(" ", 1)[1]) if line.startswith("wrote ") else None
        self.plotter.send(self.layout.root)
        problem = self.plotter.wait()
        self.peak_rss_mb["plotter_peak_rss_mb"] = self.plotter.peak_rss_mb
        if problem is not None:
            self.progress.message(f"warning: the plots were not drawn: {problem}")
        return {os.path.basename(path): path for path in written}

    def videos(self, renderer: video.VideoProcess) -> dict[str, str]:
        """The videos once the renderer has ended (none, with a warning, if it failed)."""
        problem = renderer.wait()
        self.phases.add_parallel(phase.VIDEO_ENCODER, renderer.seconds)
        self.peak_rss_mb["renderer_peak_rss_mb"] = renderer.peak_rss_mb
        if problem is not None:
            self.progress.message(f"warning: the videos were not written: {problem}")
            return {}
        return {"trained video": self.layout.trained_video, "random video": self.layout.random_video}
