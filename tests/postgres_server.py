"""A real, throwaway PostgreSQL server on 127.0.0.1 for tests, from the pgserver wheel's binaries.

PostgreSQL refuses to run as root, so as root the server runs as the unprivileged `nobody` user
(its data folder is made theirs). `start()` returns None with a reason when no PostgreSQL can be had.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Optional


@dataclass
class Server:
    url: str
    folder: str
    pg_ctl: str
    user: Optional[str]

    def stop(self) -> None:
        subprocess.run([self.pg_ctl, "-D", os.path.join(self.folder, "data"), "-m", "immediate", "-w", "stop"],
                       user=self.user, capture_output=True, timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


def binaries() -> tuple[Optional[str], str]:
    """The folder holding initdb and pg_ctl, or (None, why not)."""
    spec = importlib.util.find_spec("pgserver")  # located, not imported: its import warns about XDG dirs
    if spec is not None and spec.submodule_search_locations:
        bin_dir = os.path.join(list(spec.submodule_search_locations)[0], "pginstall", "bin")
        if os.path.exists(os.path.join(bin_dir, "initdb")):
            return bin_dir, ""
    found = shutil.which("initdb") or next(
        (p for p in (f"/usr/lib/postgresql/{v}/bin/initdb" for v in range(20, 11, -1)) if os.path.exists(p)), None)
    return (os.path.dirname(found), "") if found else (None, "no pgserver wheel and no initdb on this machine")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start() -> tuple[Optional[Server], str]:
    """initdb into a temporary folder, then pg_ctl start on a free loopback port (waits until ready)."""
    bin_dir, why = binaries()
    if bin_dir is None:
        return None, why
    user = None
    folder = tempfile.mkdtemp(prefix="dqn-pg-")
    os.chmod(folder, 0o755)
    if os.geteuid() == 0:
        user = "nobody"
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    data, port = os.path.join(folder, "data"), free_port()
    env = dict(os.environ, LC_ALL="C")
    try:
        subprocess.run([os.path.join(bin_dir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
                        "--encoding=utf8"], user=user, env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([os.path.join(bin_dir, "pg_ctl"), "-D", data, "-w", "-t", "60", "-l",
                        os.path.join(folder, "log"), "-o", f"-h 127.0.0.1 -p {port} -k {folder}", "start"],
                       user=user, env=env, check=True, capture_output=True, timeout=90)
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        return None, f"cannot start PostgreSQL: {exc}"
    return Server(f"postgresql://postgres@127.0.0.1:{port}/postgres", folder,
                  os.path.join(bin_dir, "pg_ctl"), user), ""
