"""How many cores this process may really use: its CPU affinity, capped by a container's CPU
quota (cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``).

A pod limited to 4 CPUs on a 128-core host still sees all 128 in its affinity mask; sizing
a thread pool by that mask runs 128 threads on 4 CPUs' time. The CPU kernels' default thread
count (cpu_ext.py) and the start-up NVRTC builds (cupy_prebuild.py, each build holding a few
hundred MB while it runs) both take their width from here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _v2_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """The process's own cgroup v2 directory (from ``0::/path``), then the root: in a
    container the namespace's root is usually the container's own cgroup."""
    dirs = []
    for line in (_read(proc_cgroup) or "").splitlines():
        if line.startswith("0::"):
            dirs.append(root / line[3:].lstrip("/"))
    return dirs + [root]


def quota_cores(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The CPU quota as whole cores (rounded up, at least 1), or None when there is none
    or it cannot be read. Malformed files count as no quota."""
    for d in _v2_dirs(root, proc_cgroup):
        text = _read(d / "cpu.max")
        if text is None:
            continue
        parts = text.split()
        if len(parts) != 2 or parts[0] == "max":
            return None
        return _cores(parts[0], parts[1])
    return _cores(_read(root / "cpu" / "cpu.cfs_quota_us"),
                  _read(root / "cpu" / "cpu.cfs_period_us"))


def _cores(quota: str | None, period: str | None) -> int | None:
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    if q <= 0 or p <= 0:  # v1 writes -1 for no quota
        return None
    return max(1, math.ceil(q / p))


def available_cores() -> int:
    """The affinity's cores, capped by the CPU quota when there is one."""
    quota = quota_cores()
    cores = affinity_cores()
    return cores if quota is None else max(1, min(cores, quota))
