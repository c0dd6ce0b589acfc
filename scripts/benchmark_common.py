"""What every part of the benchmark shares (scripts/benchmark.py and the benchmark_*.py parts it runs): the
repository, the tutorial's reference loop and its rate, a `train` run and its rate, the page splice, the machine.

The parts import this module, never scripts/benchmark.py, so the benchmark has no import cycle.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# shared/bench/reference_loop.py next to the repository, or next to a folder above it (a git worktree)
DEFAULT_REFERENCE = next((os.path.join(folder, "shared", "bench", "reference_loop.py") for folder in
                          (os.path.dirname(REPO), os.path.dirname(os.path.dirname(REPO)))
                          if os.path.isfile(os.path.join(folder, "shared", "bench", "reference_loop.py"))),
                         os.path.join(os.path.dirname(REPO), "shared", "bench", "reference_loop.py"))


def exit_on_sigterm() -> None:
    """SIGTERM ends the benchmark as Ctrl-C does, through its `finally` blocks, so the runs it started are stopped
    (`stop_runs`) instead of going on alone. Call it from the main thread."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def stop_runs(processes: list) -> None:
    """Stops the processes still running as Ctrl-C stops a run (a train run saves a checkpoint), and waits for them."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGINT)
    for process in running:
        process.communicate()  # reads its pipes while it stops


@contextlib.contextmanager
def stopped_with_benchmark(process: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Inside, `process` (a run, the reference loop, a sweep) is stopped and waited for if the benchmark stops:
    Ctrl-C, or SIGTERM (`exit_on_sigterm`)."""
    exit_on_sigterm()
    try:
        yield process
    finally:
        stop_runs([process])


def run_timed(args: list[str], timeout: Optional[float] = None,
              **popen: Any) -> tuple[subprocess.CompletedProcess, float]:
    """`subprocess.run(args, capture_output=True, text=True)` in the repository (or `popen`'s cwd), whose process a
    stopped benchmark stops and waits for (`stopped_with_benchmark`); also when that process started (Unix time,
    where a run's `solved_wall_s` counts from). Still running after `timeout` seconds, it is stopped the same way
    and the benchmark ends with one line saying so."""
    from dqn_cartpole.processes.start_time import process_start_time

    process = subprocess.Popen(args, **{"cwd": REPO, **popen}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    with stopped_with_benchmark(process):
        created = process_start_time(process.pid)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{' '.join(args[:4])} ...: still running after {timeout:.0f} s; stopped") from None
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr), created


def run_stoppable(args: list[str], timeout: Optional[float] = None, **popen: Any) -> subprocess.CompletedProcess:
    """`run_timed` without the start time."""
    return run_timed(args, timeout, **popen)[0]


def run_train(config: Optional[str], out: str, overrides: list[str], options: tuple = ()) -> dict:
    """Runs `train OPTIONS` in a fresh process on configs/`config` (None: no --config); returns its summary.json."""
    given = ("--config", os.path.join(REPO, "configs", config)) if config else ()
    from dqn_cartpole.processes.commands import set_flags

    args = [sys.executable, "-m", "dqn_cartpole", "train", *options, *given, "--output-dir", out, "--quiet",
            "--overwrite", *set_flags(overrides)]
    result = run_stoppable(args)
    if result.returncode != 0:
        raise SystemExit(f"train failed ({' '.join(args)}):\n{result.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def reference_rate(reference: str, iterations: int, timeout: Optional[float] = None) -> float:
    """Steady-state iterations/s of the tutorial loop (after its first 1,000 iterations); `timeout`: run_timed's."""
    result = run_stoppable([sys.executable, reference, str(iterations)], timeout)
    lines = re.findall(r"iter (\d+) return \S+ loss \S+ wall_s (\S+) eval_s (\S+)", result.stdout)
    if len(lines) < 2:
        raise SystemExit(f"reference loop failed:\n{result.stdout[-1000:]}\n{result.stderr[-2000:]}")
    (first_it, first_wall, _), rest = lines[0], lines[1:]
    span = float(rest[-1][1]) - float(first_wall) - sum(float(e) for _, _, e in rest)
    return (int(rest[-1][0]) - int(first_it)) / span


def project_rate(backend: str, iterations: int, workdir: str, extra: list[str], driver: str = "compiled",
                 tag: str = "") -> float:
    """Steady-state it/s of `train` at the tutorial's hyperparameters, with `collection.driver: driver`."""
    sampling = "dataset" if backend == "reverb" else "direct"
    out = os.path.join(workdir, f"tutorial-{backend}-{driver}{tag}")
    summary = run_train("tutorial.yaml", out, [f"training.num_iterations={iterations}", "video.enabled=false",
                                               f"replay.backend={backend}", f"replay.sampling={sampling}",
                                               f"collection.driver={driver}",
                                               "evaluation.eval_interval=1000", *extra])
    return summary["iterations_per_s"]


def splice_between(path: str, begin: str, end: str, head: str, body: list[str]) -> None:
    """Writes `head` (the sentence naming the run) and `body` between the markers `begin` and `end` in `path`, over
    what lay between them, keeping the rest of the page; appends them, marked, to a page without them."""
    text = "\n".join([begin, head, "", *body, "", end])
    old = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
    if begin in old and end in old:
        text = old.split(begin)[0] + text + old.split(end, 1)[1]
    else:
        text = old + ("\n" if old else "") + text + "\n"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def machine() -> str:
    """The machine the run was measured on: cores, processor model, Python, system."""
    import platform

    from dqn_cartpole.run_folder.provenance import cpu_model  # the one reader of the CPU's model name

    return f"{os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, {platform.system()}"


def median(values) -> float:
    """The median of the values that are numbers (None and nan left out); nan if none is."""
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else float("nan")


def measured_between(started: float) -> str:
    """When a measurement ran, from its start to now: '2026-11-28 12:15-12:40 UTC' (a date more if it spans one)."""
    begin, end = time.localtime(started), time.localtime()
    last = "%H:%M %Z" if begin[:3] == end[:3] else "%Y-%m-%d %H:%M %Z"
    return f"{time.strftime('%Y-%m-%d %H:%M', begin)}-{time.strftime(last, end)}"


def load_averages() -> str:
    """The machine's 1, 5 and 15 min load averages, e.g. '1.2/0.9/0.7'."""
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


def run_main(main: Callable, *args) -> None:
    """Runs a script's `main(*args)` and exits with what it returns; bad input (a UserError) is one `error:` line
    and exit status 2, not a traceback."""
    from dqn_cartpole.errors import UserError  # light: no TensorFlow

    try:
        raise SystemExit(main(*args))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
