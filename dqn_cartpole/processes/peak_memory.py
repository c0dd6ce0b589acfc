"""A process's peak resident memory since its exec: the kernel's VmHWM line of /proc/PID/status.

psutil has no reading of it (its `memory_info` is the current RSS), and `getrusage`'s `ru_maxrss` would count the pages
a fork copied from its parent, so this is the one place that reads it.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Union


def peak_rss_mb(pid: Union[int, str] = "self") -> Optional[float]:
    """Process `pid`'s (this one's by default) peak resident memory in MB; None if it ended or there is no /proc."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None
