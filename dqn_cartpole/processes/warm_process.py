"""The warm start-up process itself (`python -m dqn_cartpole.processes.warm_process`): Python and TensorFlow
imported once, then one fork per request; `warm_start.WarmStarter` is its client.

It talks one JSON object a line: {"argv": [...], "log": PATH} -> {"pid": N}; when a fork ends,
{"pid": N, "status": S} (S as `subprocess.Popen.returncode`: negative for a signal); {"close": true} ends it.

* **On its stdin and stdout** (no socket given): its one client is its parent. When the parent closes its stdin
  (or dies: the warm process dies with it, by its parent-death signal), the warm process ends, and its forks die
  with it.
* **On a Unix socket** (`--socket PATH`): it outlives its client. A Ray actor whose worker process is killed is
  started again by Ray in a new process, on the same node if it can; that process connects to the same socket and
  finds the libraries imported, instead of importing them again (4.5 s of CPU, 20-26 s on 2 loaded cores). When
  its client goes (its socket closed: the client ended or was killed), the forks it started are SIGKILLed, as they
  would have died with it, and the warm process waits `linger_s` for the next one, then ends and removes its
  socket. It ends at once when its `lifeline` process ends (its node's raylet: the node was stopped or lost), and
  when its last client leaves with a close request. It serves several clients at once (every role of a run on
  one node: the libraries are imported once per node, not once per role).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Optional

from dqn_cartpole.processes.supervisor import die_with_parent

POLL_S = 0.05


class Client:
    """One client's line-based channel: stdin/stdout, or an accepted socket."""

    def __init__(self, read_fd: int, write_fd: int, sock: Optional[socket.socket] = None):
        self.read_fd, self.write_fd, self.sock, self.buffered = read_fd, write_fd, sock, b""

    def requests(self) -> Optional[list]:
        """The whole lines readable now, decoded; None at the end of the channel."""
        data = os.read(self.read_fd, 65536)
        if not data:
            return None
        self.buffered += data
        *lines, self.buffered = self.buffered.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def answer(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.write_fd, data):]
        except OSError:
            pass  # the client has gone: the next read says so

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


class WarmServer:
    """The forks of one warm process and the clients they answer to (on stdin/stdout: one, its parent)."""

    def __init__(self, program: str, listener: Optional[socket.socket], linger_s: float,
                 lifeline: Optional[int] = None):
        self.program, self.listener, self.linger_s, self.lifeline = program, listener, linger_s, lifeline
        self.clients: dict = {} if listener else {sys.stdin.fileno(): Client(sys.stdin.fileno(), sys.stdout.fileno())}
        self.running: dict = {}  # a fork's pid -> the client that asked for it
        self.idle_since = time.monotonic()
        self.closed = False  # the last client left with a close request: no lingering

    def serve(self) -> None:
        """Until: its parent closes its stdin; the last client leaves with a close request, or `linger_s` passes
        with no client (socket); or the `lifeline` process ends (a Ray node's raylet: the node is gone)."""
        while True:
            watched = list(self.clients) + ([self.listener] if self.listener else [])
            readable, _, _ = select.select(watched, [], [], POLL_S)
            for ready in readable:
                if ready is self.listener:
                    self.accept()
                else:
                    self.handle(self.clients[ready])
            self.reap()
            if self.listener is None and not self.clients or self.closed or not self.alive() or (
                    not self.clients and time.monotonic() - self.idle_since > self.linger_s):
                for client in list(self.clients.values()):
                    self.drop(client)
                return

    def alive(self) -> bool:
        """Whether the lifeline process (if any) still runs."""
        if self.lifeline is None:
            return True
        try:
            os.kill(self.lifeline, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def accept(self) -> None:
        sock, _ = self.listener.accept()
        client = Client(sock.fileno(), sock.fileno(), sock)
        self.clients[client.read_fd] = client
        client.answer({"warm": os.getpid()})

    def handle(self, client: Client) -> None:
        """Serves what `client` asked; drops it when it has gone or asked to close."""
        requests = client.requests()
        for request in requests or []:
            if request.get("close"):
                self.drop(client)
                self.closed = not self.clients
                return
            pid = fork_role(self.program, request["argv"], request["log"], self.inherited_sockets())
            self.running[pid] = client
            client.answer({"pid": pid})
        if requests is None:  # it has gone
            self.drop(client)

    def inherited_sockets(self) -> list:
        """What a fork must not keep: the listening socket and the clients'."""
        socks = [self.listener] + [client.sock for client in self.clients.values()]
        return [sock for sock in socks if sock is not None]

    def drop(self, client: Client) -> None:
        """`client` has gone: its forks die, as they would have with it."""
        for pid in [pid for pid, owner in self.running.items() if owner is client]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            del self.running[pid]
        client.close()
        del self.clients[client.read_fd]
        self.idle_since = time.monotonic()

    def reap(self) -> None:
        for pid in list(self.running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                client = self.running.pop(pid)
                client.answer({"pid": pid, "status": os.waitstatus_to_exitcode(status)})


def listen(path: str) -> socket.socket:
    """A Unix socket at `path` (only its owner may connect)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old_mask)
    listener.listen(4)
    return listener


def import_modules(modules: list) -> None:
    import importlib  # pylint: disable=import-outside-toplevel

    from dqn_cartpole.console.imports import heavy_imports  # pylint: disable=import-outside-toplevel

    if modules:
        with heavy_imports():
            for module in modules:
                importlib.import_module(module)


def fork_role(program: str, argv: list, log_path: str, sockets: list) -> int:
    """Forks; the fork runs `python -m PROGRAM ARGV` to its exit (a SystemExit that ends this interpreter as
    it would a fresh one: atexit handlers, threads joined). In the warm process: the fork's pid."""
    import runpy  # pylint: disable=import-outside-toplevel

    warm_pid = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        for sock in sockets:
            sock.close()  # the fork's copy only
        become_role(warm_pid, log_path)
    except BaseException:  # pylint: disable=broad-except  # nowhere to report it: the status says it
        os._exit(1)  # pylint: disable=protected-access
    show_command([sys.executable, "-m", program, *argv])
    sys.argv = [program, *argv]
    runpy.run_module(program, run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def show_command(words: list) -> None:
    """Makes /proc/self/cmdline (what `ps`, psutil and `lock.role_of` read) say `words`: written over the argv area
    the kernel reads it from (the warm process's, with room to spare: see `warm_start.COMMAND_ROOM`), as
    setproctitle does. Python keeps its own copy of its arguments, so nothing else reads that memory."""
    import ctypes  # pylint: disable=import-outside-toplevel

    with open("/proc/self/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end (fields 48 and 49)
    data = b"\0".join(word.encode() for word in words)[:end - start - 1]
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def become_role(warm_pid: int, log_path: str) -> None:
    """In the fork: a new session, dying with the warm process, signals as in a fresh Python, output to the log."""
    os.setsid()
    die_with_parent(signal.SIGKILL)
    if os.getppid() != warm_pid:  # the warm process died before the parent-death signal was set
        os._exit(1)  # pylint: disable=protected-access
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, source in ((0, null), (1, log), (2, log)):
        os.dup2(source, target)
    os.close(log)
    os.close(null)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False, buffering=1)  # pylint: disable=consider-using-with
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # pylint: disable=consider-using-with


def main(argv: Optional[list] = None) -> None:
    """python -m dqn_cartpole.processes.warm_process PROGRAM MODULE,MODULE,... ROOM [--socket PATH --linger S
    --lifeline PID]"""
    parser = argparse.ArgumentParser()
    parser.add_argument("program")
    parser.add_argument("modules")
    parser.add_argument("room")  # spaces: the argv area's room for a fork's command line
    parser.add_argument("--socket")
    parser.add_argument("--linger", type=float, default=60.0)
    parser.add_argument("--lifeline", type=int)
    args = parser.parse_args(argv)
    listener = listen(args.socket) if args.socket else None  # bound first: a client may connect at once
    warm_pid = os.getpid()
    try:
        import_modules([module for module in args.modules.split(",") if module])
        WarmServer(args.program, listener, args.linger, args.lifeline).serve()
    finally:
        if listener is not None and os.getpid() == warm_pid:  # not in a fork ending (its SystemExit passes here)
            listener.close()
            for path in (args.socket, args.socket + ".lock"):  # the lock: `warm_start.WarmStarter.connect_or_launch`
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


if __name__ == "__main__":
    main()
