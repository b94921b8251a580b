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
    """The process's own cgroup v2 directory (from ``0::/path``) and each parent up to the
    root: a quota anywhere above a process limits it. In a container the namespace's root
    is usually the container's own cgroup."""
    own = root
    for line in (_read(proc_cgroup) or "").splitlines():
        if line.startswith("0::"):
            own = root / line[3:].strip().lstrip("/")
    dirs = [own]
    while dirs[-1] != root and root in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs if dirs[-1] == root else dirs + [root]


def quota_cores(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The tightest CPU quota as whole cores (rounded up, at least 1), or None when there
    is none or it cannot be read. Malformed files count as no quota."""
    texts = [_read(d / "cpu.max") for d in _v2_dirs(root, proc_cgroup)]
    v2 = [t.split() for t in texts if t is not None]
    found = [_cores(*p) for p in v2 if len(p) == 2]
    if not v2:  # no cgroup v2 controller files: the v1 cpu controller's
        found.append(_cores(_read(root / "cpu" / "cpu.cfs_quota_us"),
                            _read(root / "cpu" / "cpu.cfs_period_us")))
    quotas = [q for q in found if q is not None]
    return min(quotas) if quotas else None


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
