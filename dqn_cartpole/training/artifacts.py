"""The run's artifact phase: the plots and the videos, made by child processes that start with the run.

Both children (`report.plotter` and the renderer of `report.video`, each a `processes.child.WorkerChild`: no
TensorFlow) start when the session starts, so their imports
(matplotlib, imageio, pygame: ~1 s) and the plotter's first drawing (fonts, layout: ~0.5 s) overlap
the training instead of following it. The random agent's video needs no training: its episodes
are played at the start and the renderer renders it while the agent trains. The trained agent's
episodes are played (NumPy, ~0.05 s) as soon as the final policy is known, which with the
evaluation beside the training is the moment its solve is taken in (`start_final`), before the
final checkpoint: the renderer renders them and the plotter draws the plots (the metrics are
complete then) while this process finishes. A run that ends otherwise has them started at its end,
once its logs are closed. Then this process waits for both. A run that never gets there (an error) ends both
children through the end of their input.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from dqn_cartpole.config import Config
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.core import build
from dqn_cartpole.core.envs import make_env
from dqn_cartpole.core.policies import random_act_fn
from dqn_cartpole.report import plotter, video
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.training import phases as phase
from dqn_cartpole.training.phases import Phases

FULL_EPISODES = 1  # episodes of each video shown whole; the later ones are clips (see report.video)


class ArtifactWorkers:
    """The plotter and (with `video.enabled`) the video renderer, started now; the random agent's video is rendered
    at once, the trained agent's once its policy is final (`start_trained_video`), the plots at the end."""

    def __init__(self, config: Config, layout: RunLayout, progress: Progress, phases: Phases):
        self.config, self.layout, self.progress, self.phases = config, layout, progress, phases
        self.plots_written: list[str] = []
        self.plotter = plotter.start_plotter(on_wrote=self.plots_written.append)
        self.renderer = video.VideoProcess() if config.video.enabled else None
        self.trained_video_sent = False
        self.plots_sent = False
        self.peak_rss_mb: dict[str, Optional[float]] = {"renderer_peak_rss_mb": None, "plotter_peak_rss_mb": None}
        if self.renderer is not None:
            with self.phases(phase.VIDEOS):
                self.start_random_video(self.renderer)

    def close(self) -> None:
        """Ends the children (those given no more work exit at once)."""
        for child in (self.plotter, self.renderer):
            if child is not None:
                child.close()

    def start_random_video(self, renderer: video.VideoProcess) -> None:
        """Plays the random agent's episodes (seeded: the same every run) and has them rendered now."""
        cfg, layout = self.config, self.layout
        seed, env_id, steps = cfg.training.seed + build.VIDEO_SEED_OFFSET, cfg.env.id, cfg.env.max_episode_steps
        env = make_env(env_id, max_episode_steps=steps)
        try:
            from tf_agents.specs import tensor_spec

            random_act = random_act_fn(tensor_spec.from_spec(env.time_step_spec()),
                                       tensor_spec.from_spec(env.action_spec()), seed=seed)
        finally:
            env.close()
        random = video.play(random_act, env_id, cfg.video.random_episodes, seed, steps)
        renderer.send_job(self.job(video.VideoSpec(layout.random_video, "random agent", random, FULL_EPISODES)),
                          more=True)

    def start_trained_video(self, policy: Any) -> None:
        """Plays the trained agent's episodes (side by side) with `policy` and has them rendered (once)."""
        if self.renderer is None or self.trained_video_sent:
            return
        with self.phases(phase.VIDEOS):
            self.progress.stage("Playing the episodes for the videos")
            cfg, layout = self.config, self.layout
            seed = cfg.training.seed + build.VIDEO_SEED_OFFSET
            trained = video.play_side_by_side(policy, cfg.env.id, cfg.video.num_episodes, seed,
                                              cfg.env.max_episode_steps)
            self.renderer.send_job(self.job(video.VideoSpec(layout.trained_video, "trained agent", trained,
                                                            FULL_EPISODES)), self.progress.artifact_progress)
            self.trained_video_sent = True

    def start_plots(self) -> None:
        """Hands the run folder to the plotter (once): its metrics must be complete (flushed, no row to come)."""
        if not self.plots_sent:
            self.plotter.send(self.layout.root, end=True)
            self.plots_sent = True

    def start_final(self, policy: Any) -> None:
        """The policy is final and no metrics row is to come (a solve taken in): the trained agent's video and the
        plots start now, while this process writes its final checkpoint and closes."""
        self.start_trained_video(policy)
        self.start_plots()

    def job(self, spec: video.VideoSpec) -> video.VideoJob:
        cfg = self.config
        return video.VideoJob(cfg.env.id, cfg.env.max_episode_steps, cfg.video.fps, (spec,), video.env_fps(cfg.env.id))

    def make(self, policy: Any, with_videos: bool, close_logs: Callable[[], None],
             with_plots: bool = True) -> dict[str, str]:
        """Has the trained agent's video rendered (if `with_videos` and not yet), draws the plots (if `with_plots`);
        returns the artifacts written once both are done."""
        if with_videos:
            self.start_trained_video(policy)
        renderer = self.renderer if with_videos else None
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

    def plots(self) -> dict[str, str]:
        """The plotter draws the run's plots; returns them by file name (none, with a warning, if it failed)."""
        self.start_plots()
        problem = self.plotter.wait()
        self.peak_rss_mb["plotter_peak_rss_mb"] = self.plotter.peak_rss_mb
        if problem is not None:
            self.progress.message(f"warning: the plots were not drawn: {problem}")
        return {os.path.basename(path): path for path in self.plots_written}

    def videos(self, renderer: video.VideoProcess) -> dict[str, str]:
        """The videos once the renderer has ended (none, with a warning, if it failed)."""
        problem = renderer.wait()
        self.phases.add_parallel(phase.VIDEO_ENCODER, renderer.seconds)
        self.peak_rss_mb["renderer_peak_rss_mb"] = renderer.peak_rss_mb
        if problem is not None:
            self.progress.message(f"warning: the videos were not written: {problem}")
            return {}
        return {"trained video": self.layout.trained_video, "random video": self.layout.random_video}
