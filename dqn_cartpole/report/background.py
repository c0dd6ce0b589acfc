"""Artifacts made by child processes that never import TensorFlow, while the trainer does something else.

`Background` runs `python -m MODULE ARGS` (fed `stdin_text`), hands each stdout line to a callback
as it comes, and keeps its stderr for a one-line reason if it fails. The videos (`report.video`)
and the plots (this module: `python -m dqn_cartpole.report.background plots RUN_DIR`) are drawn
this way after training: the trainer's memory does not grow by matplotlib's, and the two children
share the cores.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Callable, Optional, Sequence

PEAK_RSS_LINE = "peak_rss_mb "


class Background:
    """One child process of this package; `wait()` returns None on success, else why not (one line)."""

    def __init__(self, module: str, args: Sequence[str] = (), stdin_text: Optional[str] = None,
                 on_line: Callable[[str], None] = lambda line: None, what: str = "the child process"):
        self.what = what
        self.started = time.perf_counter()
        self.seconds: Optional[float] = None  # how long it ran, once it has ended
        self.peak_rss_mb: Optional[float] = None  # the child's own peak memory, if it reported it
        self.process = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if stdin_text is not None:
            self.process.stdin.write(stdin_text)
        self.process.stdin.close()
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
                on_line(line.rstrip("\n"))

    def wait(self) -> Optional[str]:
        """Waits for the child; passes its warnings on; returns None if it succeeded, else why not."""
        status = self.process.wait()
        for thread in self._threads:
            thread.join()
        self.seconds = time.perf_counter() - self.started
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
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    print(f"{PEAK_RSS_LINE}{int(line.split()[1]) / 1024:.1f}", flush=True)
    except OSError:  # no /proc: nothing to report
        pass


def start_plots(run_dir: str, on_line: Callable[[str], None] = lambda line: None) -> Background:
    """Draws `run_dir`'s plots in a child process (its `wrote PATH` lines go to `on_line`)."""
    return Background("dqn_cartpole.report.background", ["plots", run_dir], on_line=on_line, what="the plotter")


def main(argv: Sequence[str]) -> int:
    """`plots RUN_DIR`: draws the run's plots from its CSVs, printing `wrote PATH` for each."""
    if len(argv) != 2 or argv[0] != "plots":
        print("usage: python -m dqn_cartpole.report.background plots RUN_DIR", file=sys.stderr)
        return 2
    try:
        from dqn_cartpole.report import figures
        from dqn_cartpole.run_folder import RunLayout

        for path in figures.plot_run(RunLayout(argv[1])):
            print(f"wrote {path}", flush=True)
    except Exception as exc:  # pylint: disable=broad-except  # one line for the trainer to show
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        return 1
    report_peak_rss()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
