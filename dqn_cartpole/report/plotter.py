"""The plotter: a child process (`processes.child`) that draws a run's plots without TensorFlow while the trainer
does something else.

It is started with the run, so it has imported matplotlib (~1 s) by the time its work comes: the run folder, once its
metrics are complete. It answers `("wrote", PATH)` for each plot. The trainer's memory does not grow by
matplotlib's, and the plotter and the video renderer share the cores at a lower priority than the trainer (a child
started with the run imports while the trainer imports, builds and trains: niced, the children take what the trainer
leaves, which by the time their work comes, the trainer waiting for them, is everything).
"""

from __future__ import annotations

from typing import Callable, Optional

from dqn_cartpole.processes.child import WorkerChild, serve

NICENESS = 10  # the plotter's and the renderer's CPU priority below the trainer's


def start_plotter(run_dir: Optional[str] = None, on_wrote: Callable[[str], None] = lambda path: None) -> WorkerChild:
    """A child process that draws a run's plots (each path it writes goes to `on_wrote`): `run_dir`'s now, or the
    one `send(run_dir, end=True)` gives it later."""
    plotter = WorkerChild(__name__, on_message=lambda message: on_wrote(message[1]), what="the plotter",
                    niceness=NICENESS)
    if run_dir is not None:
        plotter.send(run_dir, end=True)
    return plotter


def serve_child() -> int:
    """The plotter's process: imports matplotlib, then draws the plots of each run folder it is sent."""
    def prepare() -> None:
        from dqn_cartpole.report import figures  # noqa: F401  # matplotlib: while the trainer still trains

    def draw(run_dir: str, reply: Callable) -> None:
        from dqn_cartpole.report import figures
        from dqn_cartpole.run_folder import RunLayout

        for path in figures.plot_run(RunLayout(run_dir)):
            reply(("wrote", path))

    return serve(draw, prepare)
