"""The warm start-up process itself (`python -m dqn_cartpole.processes.warm_process`): Python and TensorFlow
imported once, then one fork per request; `warm_start.WarmStarter` is its client.

It is a fork server and nothing more: once a role is forked, the role depends on its client, not on this process.
A fault here (a client's socket reset, a bad request, a failed fork, this process's own death, even a SIGKILL)
costs at most the request involved; every role already forked runs on, and its client still learns its end.

Protocol, on a Unix socket, one JSON object a line, each request sent with two descriptors (SCM_RIGHTS):
``{"argv": [...], "log": PATH}`` with ``[status_w, life_r]`` -> ``{"pid": N}`` (or ``{"error": "..."}``);
``{"close": true}`` ends this process once its last client has asked so. On connecting, a client is greeted with
``{"warm": PID}``.

* ``life_r``: the read end of a pipe whose write end only the client holds. The fork watches it: when it reads
  the end (the client died, or closed it to end the fork), the fork SIGKILLs itself, as it would have died with
  its client.
* ``status_w``: the write end of a pipe whose read end only the client holds. The fork writes ``exit N`` there
  when its Python exits (`SystemExit`, an exception), and this process writes ``exit N`` again once it reaps the
  fork (the exact status: a signal, `os._exit`). The client takes the last line it read when the pipe ends, and
  a pipe that ends with no line as a SIGKILL. So a fork's end is known whether or not this process is alive.

It listens on `--socket PATH` and outlives its clients: a Ray actor whose worker process is killed is started
again by Ray in a new process, on the same node if it can; that process connects to the same socket and finds the
libraries imported, instead of importing them again (4.5 s of CPU, 20-26 s on 2 loaded cores). With no client it
waits `linger_s` for the next one, then ends and removes its socket. It ends at once, killing its forks, when its
`lifeline` process ends (its node's raylet: the node was stopped or lost). With `--fd N` instead, its one client
is its parent, on a socket pair: it ends with that client.
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
import threading
import time
from typing import Optional

from dqn_cartpole.processes.supervisor import die_with_parent

POLL_S = 0.05
MAX_FDS = 64  # descriptors taken from one read of a client's socket (two per request)


class Client:
    """One client's socket: its requests as they come, with the descriptors sent beside them."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffered, self.fds = sock, b"", []

    def requests(self) -> Optional[list]:
        """The whole requests readable now, each (message, its two descriptors); None: the client has gone (its
        socket ended or failed)."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 65536, MAX_FDS)
        except OSError:  # ECONNRESET and the like: a client killed mid-write has gone all the same
            return None
        for fd in fds:
            os.set_inheritable(fd, False)
        self.fds += fds
        if not data:
            return None
        self.buffered += data
        *lines, self.buffered = self.buffered.split(b"\n")
        requests = []
        for line in (line for line in lines if line.strip()):
            message = json.loads(line)  # a ValueError: a client that talks nonsense is dropped
            if not isinstance(message, dict):
                raise ValueError(f"not a request: {line[:80]!r}")
            if message.get("close"):
                requests.append((message, ()))
            else:
                if len(self.fds) < 2:
                    raise ValueError("a request without its two descriptors")
                requests.append((message, (self.fds.pop(0), self.fds.pop(0))))
        return requests

    def answer(self, message: dict) -> None:
        with contextlib.suppress(OSError):  # the client has gone: its next read says so
            self.sock.sendall((json.dumps(message) + "\n").encode())

    def close(self) -> None:
        close_fds(self.fds)
        self.fds = []
        self.sock.close()


class WarmServer:
    """The forks of one warm process and the clients that ask for them."""

    def __init__(self, program: str, listener: Optional[socket.socket], linger_s: float,
                 lifeline: Optional[int] = None, only: Optional[socket.socket] = None):
        self.program, self.listener, self.linger_s, self.lifeline = program, listener, linger_s, lifeline
        self.clients: dict = {}  # a socket's fd -> its Client
        if only is not None:
            self.add(only)
        self.running: dict = {}  # a fork's pid -> its status pipe's write end
        self.idle_since = time.monotonic()
        self.closed = False  # the last client left with a close request: no lingering

    def serve(self) -> None:
        """Until: the last client leaves with a close request, or `linger_s` passes with no client; its one client
        (`--fd`) goes; or the `lifeline` process ends (a Ray node's raylet: the node is gone)."""
        while True:
            watched = list(self.clients) + ([self.listener] if self.listener else [])
            readable, _, _ = select.select(watched, [], [], POLL_S)
            for ready in readable:
                if ready is self.listener:
                    self.accept()
                elif ready in self.clients:
                    self.handle(self.clients[ready])
            self.reap()
            if not self.alive():
                self.kill_forks()  # the node is gone: so are its roles
                break
            if self.closed or not self.clients and (
                    self.listener is None or time.monotonic() - self.idle_since > self.linger_s):
                break
        for client in list(self.clients.values()):
            self.drop(client)

    def alive(self) -> bool:
        """Whether the lifeline process (if any) still runs."""
        return self.lifeline is None or pid_exists(self.lifeline)

    def accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:  # the client gave up before it was accepted (ECONNABORTED), or no descriptor is left
            return
        self.add(sock).answer({"warm": os.getpid()})

    def add(self, sock: socket.socket) -> Client:
        client = Client(sock)
        self.clients[sock.fileno()] = client
        return client

    def handle(self, client: Client) -> None:
        """Serves what `client` asked. A client that has gone, or whose request cannot be read, is dropped: that
        costs its pending requests, never another client's nor a running fork."""
        try:
            requests = client.requests()
        except ValueError as exc:
            print(f"warm process: a client's request was dropped: {exc}", file=sys.stderr, flush=True)
            requests = None
        for request, fds in requests or []:
            if request.get("close"):
                self.drop(client)
                self.closed = not self.clients
                return
            client.answer(self.start(request, *fds))
        if requests is None:
            self.drop(client)

    def start(self, request: dict, status_w: int, life_r: int) -> dict:
        """Forks the role `request` names; the answer for its client."""
        try:
            pid = fork_role(self.program, list(request["argv"]), str(request["log"]), status_w, life_r,
                            self.sockets(), self.descriptors())
        except Exception as exc:  # pylint: disable=broad-except  # a bad request or a failed fork: this one only
            close_fds([status_w, life_r])
            return {"error": f"{type(exc).__name__}: {exc}"}
        os.close(life_r)  # the fork's and its client's alone (only the warm process returns from `fork_role`)
        self.running[pid] = status_w
        return {"pid": pid}

    def sockets(self) -> list:
        """The sockets a fork must not keep: the listener and the clients'."""
        socks = [self.listener] + [client.sock for client in self.clients.values()]
        return [sock for sock in socks if sock is not None]

    def descriptors(self) -> list:
        """The other descriptors a fork must not keep: the other forks' status pipes, and those sent with requests
        not yet served."""
        fds = list(self.running.values())
        for client in self.clients.values():
            fds += client.fds
        return fds

    def drop(self, client: Client) -> None:
        """`client` has gone (or asked to close): its forks are theirs to end (see `life_r`), not this one's."""
        with contextlib.suppress(KeyError, OSError, ValueError):
            del self.clients[client.sock.fileno()]
        client.close()
        self.idle_since = time.monotonic()

    def reap(self) -> None:
        for pid in list(self.running):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, None
            if done:
                status_w = self.running.pop(pid)
                if status is not None:
                    with contextlib.suppress(OSError):
                        os.write(status_w, f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                os.close(status_w)

    def kill_forks(self) -> None:
        for pid in list(self.running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.reap()


def listen(path: str) -> socket.socket:
    """A Unix socket at `path` (only its owner may connect)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old_mask)
    listener.listen(16)
    return listener


def pid_exists(pid: int) -> bool:
    """Whether a process `pid` exists (another user's too): `kill(pid, 0)`, no read of /proc at each poll."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def close_fds(fds) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def import_modules(modules: list) -> None:
    import importlib  # pylint: disable=import-outside-toplevel

    from dqn_cartpole.console.imports import heavy_imports  # pylint: disable=import-outside-toplevel

    if modules:
        with heavy_imports():
            for module in modules:
                importlib.import_module(module)


def fork_role(program: str, argv: list, log_path: str, status_w: int, life_r: int, sockets: list,
              descriptors: list) -> int:
    """Forks; the fork runs `python -m PROGRAM ARGV` to its exit, telling `status_w` how it ended, and ends with a
    SystemExit that ends this interpreter as it would a fresh one (atexit handlers, threads joined): nothing of the
    warm process's own code runs in it after that. In the warm process: the fork's pid."""
    import runpy  # pylint: disable=import-outside-toplevel
    import traceback  # pylint: disable=import-outside-toplevel

    pid = os.fork()
    if pid:
        return pid
    try:
        for sock in sockets:
            sock.close()  # the fork's copies only
        close_fds(descriptors)
        become_role(log_path, life_r)
    except BaseException:  # pylint: disable=broad-except  # nowhere to report it: the status says it
        os._exit(1)  # pylint: disable=protected-access
    show_command([sys.executable, "-m", program, *argv])
    sys.argv = [program, *argv]
    from dqn_cartpole.processes.exit_now import report_with  # pylint: disable=import-outside-toplevel

    report_with(lambda status: report_exit(status_w, status))  # a role that ends at once says how, too
    code = 0
    try:
        runpy.run_module(program, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # pylint: disable=broad-except  # as a fresh Python: the traceback, then status 1
        traceback.print_exc()
        code = 1
    report_exit(status_w, exit_code(code))
    raise SystemExit(code)


def exit_code(code) -> int:
    """The exit status a SystemExit with `code` gives the interpreter."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def report_exit(status_w: int, code: int) -> None:
    with contextlib.suppress(OSError):
        os.write(status_w, f"exit {code}\n".encode())


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


def become_role(log_path: str, life_r: int) -> None:
    """In the fork: a new session, dying with its client (not with the warm process), signals as in a fresh
    Python, output to the log."""
    os.setsid()
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=die_with_client, args=(life_r,), name="warm-lifeline", daemon=True).start()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, source in ((0, null), (1, log), (2, log)):
        os.dup2(source, target)
    os.close(log)
    os.close(null)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False, buffering=1)  # pylint: disable=consider-using-with
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # pylint: disable=consider-using-with


def die_with_client(life_r: int) -> None:
    """The fork's lifeline: its client holds the pipe's only write end, so the pipe ends when the client dies or
    lets the fork go; the fork then ends at once, as a child of the client would have."""
    while True:
        try:
            if not os.read(life_r, 64):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Optional[list] = None) -> None:
    """python -m dqn_cartpole.processes.warm_process PROGRAM MODULE,MODULE,... ROOM (--socket PATH [--linger S]
    [--lifeline PID] | --fd N)"""
    parser = argparse.ArgumentParser()
    parser.add_argument("program")
    parser.add_argument("modules")
    parser.add_argument("room")  # spaces: the argv area's room for a fork's command line
    parser.add_argument("--socket")
    parser.add_argument("--fd", type=int)
    parser.add_argument("--linger", type=float, default=60.0)
    parser.add_argument("--lifeline", type=int)
    args = parser.parse_args(argv)
    listener = listen(args.socket) if args.socket else None  # bound first: a client may connect at once
    only = socket.socket(fileno=args.fd) if args.fd is not None else None
    if only is not None:
        die_with_parent(signal.SIGKILL)  # its one client is its parent
    warm_pid = os.getpid()
    try:
        import_modules([module for module in args.modules.split(",") if module])
        WarmServer(args.program, listener, args.linger, args.lifeline, only).serve()
    finally:
        if listener is not None and os.getpid() == warm_pid:  # not in a fork ending (its SystemExit passes here)
            listener.close()
            for path in (args.socket, args.socket + ".lock"):  # the lock: `warm_start.WarmStarter.connect_or_launch`
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


if __name__ == "__main__":
    main()
