"""cores.py: the affinity capped by a container's CPU quota, read from stand-in cgroup files."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.backend import cores, cpu_ext


def tree(tmp_path: Path, files: dict[str, str], proc: str = "") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "proc").write_text(proc)
    return root, tmp_path / "proc"


@pytest.mark.parametrize("files, proc, want", [
    ({"cpu.max": "400000 100000\n"}, "", 4),
    ({"cpu.max": "150000 100000"}, "", 2),  # 1.5 CPUs: rounded up
    ({"cpu.max": "1000 100000"}, "", 1),  # a sliver is still one
    ({"cpu.max": "max 100000"}, "", None),
    ({"kubepods/pod1/cpu.max": "200000 100000", "cpu.max": "max 100000"},
     "0::/kubepods/pod1\n", 2),  # the process's own cgroup
    ({"kubepods/pod1/app/cpu.max": "max 100000", "kubepods/pod1/cpu.max": "300000 100000",
      "kubepods/cpu.max": "800000 100000"}, "0::/kubepods/pod1/app\n", 3),  # a parent's
    ({"cpu.max": "max 100000", "cpu/cpu.cfs_quota_us": "200000",
      "cpu/cpu.cfs_period_us": "100000"}, "", None),  # v2 present: v1 files are not read
    ({"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}, "", 3),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, "", None),
    ({"cpu.max": "lots"}, "", None),  # malformed: no quota, not an error
    ({"cpu.max": "0 100000"}, "", None),
    ({}, "", None),  # no cgroup files at all
])
def test_quota_cores(tmp_path: Path, files: dict[str, str], proc: str, want: int | None) -> None:
    root, proc_file = tree(tmp_path, files, proc)
    assert cores.quota_cores(root, proc_file) == want


def test_available_cores_is_the_smaller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores, "affinity_cores", lambda: 64)
    monkeypatch.setattr(cores, "quota_cores", lambda: 4)
    assert cores.available_cores() == 4 and cpu_ext.default_threads() == 4
    monkeypatch.setattr(cores, "quota_cores", lambda: 128)
    assert cores.available_cores() == 64
    monkeypatch.setattr(cores, "quota_cores", lambda: None)
    assert cores.available_cores() == 64


def test_prebuild_threads_follow_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    from crucible.backend import cupy_prebuild

    monkeypatch.setattr(cores, "affinity_cores", lambda: 64)
    monkeypatch.setattr(cores, "quota_cores", lambda: 3)
    assert cupy_prebuild._threads(20) == 3 and cupy_prebuild._threads(2) == 2
