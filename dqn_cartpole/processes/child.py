"""One way to start and talk to a worker-like child of this package: the plotter, the video renderer, the snapshot
evaluator, the local topology's reaper and the reused train process (`experiments/train_worker.py`).

The parent starts `python -m dqn_cartpole.processes.child MODULE` (`WorkerChild`), which imports MODULE and runs its
`serve_child()`, with this checkout first on the path (`supervisor.child_env`). The child runs in a session of its
own, so a Ctrl-C at the terminal reaches only the parent, which still hands the children their work; and, if asked,
at a lower CPU priority than the parent. (`supervisor.Child` is the other kind: a command that is supervised,
stopped and restarted, such as a role or a sweep's run.)

Messages go both ways as pickles. The parent's go on the child's stdin: a thread writes them, so `send` never waits,
even while the child still imports or a message is larger than the pipe holds. The child's come back on its stdout:
a thread reads them and hands each to `on_message`, or keeps it for `receive`. The child (`serve`) answers each
message as it comes, with as many messages as it likes, until the end of its stdin; its last message is its own peak
memory. Its prints go to stderr: its warnings (`warning: ...`) are passed on, and its last other line is why it
failed, in one line. `answer` returning an exit status ends the child with it.

Options for a child with a life of its own (the train process): `tied`, it gets SIGTERM when the parent dies, with no
signal blocked and SIGINT at its default (`supervisor.die_with_parent`); `log_path`, its stderr appended to that
file rather than kept for `reason`; `extra_env`, variables added to its environment. `receive(block=False)` never
waits, for a parent that polls.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dqn_cartpole.console.exit_status import EXIT_FAILED, EXIT_OK, EXIT_USAGE, for_signal
from dqn_cartpole.processes.peak_memory import peak_rss_mb
from dqn_cartpole.processes.supervisor import child_env, die_with_parent

RUNNER = "dqn_cartpole.processes.child"
ENTRY = "serve_child"  # what a child's module defines: it calls `serve`
_ENDED = object()  # the child's stdout has ended: no message is to come


@dataclass(frozen=True)
class PeakMemory:
    """A child's last message: its peak resident memory since its exec (a fork's copied pages not counted)."""

    mb: float


class ChildFailed(RuntimeError):
    """The child ended before the message asked for: one line saying why."""


class WorkerChild:
    """A child running `module.serve_child()` (see the module docstring). `wait()` returns None if it succeeded,
    else why not (one line)."""

    def __init__(self, module: str, on_message: Optional[Callable[[Any], None]] = None,
                 what: str = "the child process", niceness: int = 0, label: Optional[str] = None,
                 tied: bool = False, log_path: Optional[str] = None, extra_env: Optional[dict] = None):
        """Starts the child; `label` (a run folder) is shown in its command line, so `ps` says what it serves."""
        self.what = what
        self.started = time.perf_counter()
        self.sent: Optional[float] = None  # when the last message went out
        self.seconds: Optional[float] = None  # from the last message sent to the child's end, once it has ended
        self.peak_rss_mb: Optional[float] = None  # the child's own peak memory, once it reported it
        self._stderr: list[bytes] = []
        if log_path:
            os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        with open(log_path, "ab") if log_path else contextlib.nullcontext(subprocess.PIPE) as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", RUNNER, module, *([label] if label else [])],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                            env={**child_env(), **(extra_env or {})}, start_new_session=True,
                                            preexec_fn=die_with_parent if tied else None)
        if niceness:  # it yields the CPU to this process (0: the calling one) by `niceness` steps
            with contextlib.suppress(OSError):  # it has already ended, or the system refuses: it runs at our priority
                os.setpriority(os.PRIO_PROCESS, self.process.pid, os.getpriority(os.PRIO_PROCESS, 0) + niceness)
        self.on_message = on_message
        self._outbox: queue.Queue = queue.Queue()
        self._inbox: queue.Queue = queue.Queue()
        self._input_ended = False
        self._warned = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._threads = [threading.Thread(target=self._write, daemon=True), self._reader]
        if not log_path:
            self._threads.append(threading.Thread(target=lambda: self._stderr.extend(self.process.stderr),
                                                  daemon=True))
        for thread in self._threads:
            thread.start()

    def _write(self) -> None:
        while (data := self._outbox.get()) is not None:
            try:
                self.process.stdin.write(data)
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError):  # it has died: `wait` says why
                return
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()

    def _read(self) -> None:
        while True:
            try:
                message = pickle.load(self.process.stdout)
            except (EOFError, pickle.UnpicklingError):
                break
            if isinstance(message, PeakMemory):
                self.peak_rss_mb = message.mb
            elif self.on_message is not None:
                self.on_message(message)
            else:
                self._inbox.put(message)
        self._inbox.put(_ENDED)

    def send(self, message: Any, end: bool = False) -> None:
        """Hands `message` to the child (and, with `end`, ends its stdin: no more messages come)."""
        self.sent = time.perf_counter()
        self._outbox.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        if end:
            self.end_input()

    def end_input(self) -> None:
        """No more messages come: the child ends once it has answered those sent."""
        if not self._input_ended:
            self._input_ended = True
            self._outbox.put(None)

    def receive(self, block: bool = True) -> Any:
        """The child's next message, waiting for it (without `block`: None if none has come); `ChildFailed` if the
        child ends first."""
        if not block and self._inbox.empty() and self.process.poll() is not None:
            self._reader.join()  # it has ended: its last messages are taken in
        try:
            message = self._inbox.get(block)
        except queue.Empty:
            return None
        if message is _ENDED:
            self._inbox.put(_ENDED)  # for a later `receive`
            status = self.process.wait() if block else self.process.poll()
            if status is None:  # its output has ended, it has not yet
                return None
            raise ChildFailed(self.reason(status) or f"{self.what} ended before its answer")
        return message

    def wait(self) -> Optional[str]:
        """Ends the child's input and waits for its end; passes its warnings on; None if it succeeded, else why
        not."""
        self.end_input()
        status = self.process.wait()
        for thread in self._threads:
            thread.join()
        self.seconds = time.perf_counter() - (self.sent or self.started)
        self._pass_warnings()
        return self.reason(status)

    def close(self, timeout_s: float = 10.0) -> None:
        """Ends a child whose work never came or is no longer wanted (the end of its input); kills it if it
        outlives `timeout_s`."""
        self.end_input()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout_s)  # its last messages (its peak memory) are taken in

    def reason(self, status: int) -> Optional[str]:
        """None for a child that exited 0, else its last line on stderr that is not a warning."""
        if status == 0:
            return None
        lines = [line.decode(errors="replace").strip() for line in self._stderr]
        errors = [line for line in lines if line and not line.startswith("warning:")]
        return errors[-1] if errors else f"{self.what} exited with status {status}"

    def _pass_warnings(self) -> None:
        if not self._warned:
            self._warned = True
            for line in self._stderr:
                if line.startswith(b"warning:"):
                    print(line.decode(errors="replace").rstrip(), file=sys.stderr)


def serve(answer: Callable[[Any, Callable[[Any], None]], Optional[int]], prepare: Callable[[], None] = lambda: None,
          failure: str = "", at_end: Callable[[], None] = lambda: None) -> int:
    """The child's side: `prepare()` (imports, while the parent still works), then `answer(message, reply)` for each
    message until the end of stdin or until an answer returns an exit status, then `at_end()`, then its peak memory;
    returns the exit status (0, or the answer's). An exception is one line on stderr (`error: {failure}TYPE: first
    line`) and exit status 1."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never among the messages

    def reply(message: Any) -> None:
        pickle.dump(message, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()

    status = None
    try:
        prepare()
        while status is None:
            try:
                message = pickle.load(sys.stdin.buffer)
            except EOFError:
                break
            status = answer(message, reply)
        at_end()
    except KeyboardInterrupt:  # the parent was stopped: it reports the stop
        return for_signal(signal.SIGINT)
    except Exception as exc:  # pylint: disable=broad-except  # one line for the parent to show
        print(f"error: {failure}{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr, flush=True)
        return EXIT_FAILED
    peak = peak_rss_mb()
    with contextlib.suppress(BrokenPipeError):  # the parent is gone (a reaper outlives its launcher): nobody to tell
        if peak is not None:  # None: no /proc, nothing to report
            reply(PeakMemory(peak))
    return EXIT_OK if status is None else status


def main(argv: list[str]) -> int:
    """`python -m dqn_cartpole.processes.child MODULE [LABEL]`: runs MODULE's `serve_child()`."""
    if len(argv) not in (1, 2):
        print(f"usage: python -m {RUNNER} MODULE [LABEL]  (messages as pickles on stdin)", file=sys.stderr)
        return EXIT_USAGE
    return getattr(importlib.import_module(argv[0]), ENTRY)()


if __name__ == "__main__":
    # This module by its name, not this `__main__` copy: the messages it pickles (`PeakMemory`) must name it.
    from dqn_cartpole.processes import child

    sys.exit(child.main(sys.argv[1:]))
