"""Artifacts made by child processes that never import TensorFlow, while the trainer does something else.

`Background` runs `python -m MODULE ARGS`, hands each stdout line to a callback as it comes, and
keeps its stderr for a one-line reason if it fails. Its work arrives on stdin: given at once, or
`send` later, so a child started early has done its imports (matplotlib, imageio: ~1 s) by the
time the work comes, and a child whose work never comes exits at the end of its stdin. The
videos (`report.video`) and the plots (this module: `python -m dqn_cartpole.report.background
plots`, fed RUN_DIR) are drawn this way: the trainer's memory does not grow by matplotlib's, and
the two children share the cores. They run in a session of their own, so a Ctrl-C at the terminal
reaches only the trainer, which then still sends them their work.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Callable, Optional, Sequence

from dqn_cartpole.console.exit_status import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from dqn_cartpole.processes.peak_memory import peak_rss_mb

PEAK_RSS_LINE = "peak_rss_mb "


# A child's CPU priority below the trainer's: a child started with the run imports its libraries (~1 s of CPU)
# while the trainer imports, builds and trains on the other core, and three busy processes on two cores would
# take a third of the trainer's core; niced, the children take what the trainer leaves, which by the time their
# work comes (the trainer waits for them) is everything.
NICENESS = 10


def lower_priority(pid: int) -> None:
    """Makes `pid` (a child just started) yield the CPU to the trainer (see NICENESS)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, os.getpid()) + NICENESS)
    except OSError:  # it has already ended, or the system refuses: it runs at the trainer's priority
        pass


class Background:
    """One child process of this package; `wait()` returns None on success, else why not (one line)."""

    def __init__(self, module: str, args: Sequence[str] = (), stdin_text: Optional[str] = None,
                 on_line: Callable[[str], None] = lambda line: None, what: str = "the child process"):
        """Starts the child; `stdin_text` is its work (None: `send` it later)."""
        self.what = what
        self.started = time.perf_counter()
        self.sent: Optional[float] = None  # when the work went out
        self.seconds: Optional[float] = None  # from the work sent to the child's end, once it has ended
        self.peak_rss_mb: Optional[float] = None  # the child's own peak memory, if it reported it
        self.process = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        lower_priority(self.process.pid)
        self.on_line = on_line
        if stdin_text is not None:
            self.send(stdin_text)
        self._stderr: list[str] = []
        self._threads = [threading.Thread(target=self._follow, args=(on_line,), daemon=True),
                         threading.Thread(target=lambda: self._stderr.extend(self.process.stderr), daemon=True)]
        for thread in self._threads:
            thread.start()

    def _follow(self, on_line: Callable[[str], None]) -> None:
        for line in self.process.stdout:
            if line.startswith(PEAK_RSS_LINE):
                self.peak_rss_mb = float(line.split()[1])
            else:
                self.on_line(line.rstrip("\n"))

    def send(self, text: str, end: bool = True) -> None:
        """Gives the child its work (and, unless `end` is False, ends its stdin: no more work comes)."""
        self.sent = time.perf_counter()
        try:
            self.process.stdin.write(text)
            if end:
                self.process.stdin.close()
            else:
                self.process.stdin.flush()
        except BrokenPipeError:  # it has died: `wait` says why
            pass

    def close(self, timeout_s: float = 10.0) -> None:
        """Ends a child whose work never came (the end of its stdin), or that outlives `timeout_s`."""
        if not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def wait(self) -> Optional[str]:
        """Waits for the child; passes its warnings on; returns None if it succeeded, else why not."""
        status = self.process.wait()
        for thread in self._threads:
            thread.join()
        self.seconds = time.perf_counter() - (self.sent or self.started)
        for line in self._stderr:
            if line.startswith("warning:"):
                print(line.rstrip(), file=sys.stderr)
        if status == 0:
            return None
        errors = [line.strip() for line in self._stderr if line.strip() and not line.startswith("warning:")]
        return errors[-1] if errors else f"{self.what} exited with status {status}"


def report_peak_rss() -> None:
    """Prints this process's peak resident memory since its exec (VmHWM; getrusage would count the parent's
    pages the fork copied), for the `Background` that started it."""
    peak = peak_rss_mb()
    if peak is not None:  # None: no /proc, nothing to report
        print(f"{PEAK_RSS_LINE}{peak:.1f}", flush=True)


def start_plotter(run_dir: Optional[str] = None, on_line: Callable[[str], None] = lambda line: None) -> Background:
    """A child process that draws a run's plots (its `wrote PATH` lines go to `on_line`): `run_dir`'s now, or
    the one `send(run_dir)` gives it later."""
    return Background("dqn_cartpole.report.background", ["plots"], stdin_text=run_dir, on_line=on_line,
                      what="the plotter")


def main(argv: Sequence[str]) -> int:
    """`plots`: imports matplotlib, then draws the plots of the run folder given on stdin (printing
    `wrote PATH` for each); nothing on stdin: exits."""
    if list(argv) != ["plots"]:
        print("usage: python -m dqn_cartpole.report.background plots  (RUN_DIR on stdin)", file=sys.stderr)
        return EXIT_USAGE
    from dqn_cartpole.report import figures  # matplotlib: while the trainer still trains
    from dqn_cartpole.run_folder import RunLayout

    run_dir = sys.stdin.read().strip()
    if not run_dir:
        return EXIT_OK
    try:
        for path in figures.plot_run(RunLayout(run_dir)):
            print(f"wrote {path}", flush=True)
    except Exception as exc:  # pylint: disable=broad-except  # one line for the trainer to show
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        return EXIT_FAILED
    report_peak_rss()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
