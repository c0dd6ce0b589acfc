"""When a process started, as Unix time: what every "seconds since the process started" counts from.

`psutil.Process().create_time()` adds a process's start (clock ticks since boot) to the boot time, which on Linux
it reads from /proc/stat in whole seconds: its result is early by the fraction of a second the boot time had, up to
1 s, the same for every process of a boot. On the machine where this was found it was 0.67 s, which every time to
the policy and to the exit carried. Here the boot time comes from the clock that counts since boot
(`CLOCK_BOOTTIME`), so the start is exact to the clock tick (10 ms).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Optional


def process_start_time(pid: Optional[int] = None) -> float:
    """When process `pid` (None: this one) started, as Unix time (psutil's, where /proc is not there)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid or 'self'}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            ticks_since_boot = int(fields[19])  # field 22 of proc(5), `starttime`
            booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
            return booted + ticks_since_boot / os.sysconf("SC_CLK_TCK")
    import psutil  # a declared dependency

    return psutil.Process(pid).create_time()
