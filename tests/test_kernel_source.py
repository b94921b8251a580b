"""The CUDA sources as NVRTC gets them: a header change must change the module's text,
since CuPy's kernel cache keys a module by its text alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.kernels import source


@pytest.fixture
def cuda_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "k.cu").write_text('#include "h.cuh"\nextern "C" __global__ void k() {}\n')
    (tmp_path / "h.cuh").write_text("#define N 1\n")
    monkeypatch.setattr(source, "cuda_source_dir", lambda: tmp_path)
    return tmp_path


def test_header_change_changes_the_module_text(cuda_dir: Path) -> None:
    before = source.module_source("k.cu")
    assert before.startswith((cuda_dir / "k.cu").read_text())
    assert source.module_source("k.cu") == before  # stable: the cache still hits
    (cuda_dir / "h.cuh").write_text("#define N 2\n")
    assert source.module_source("k.cu") != before


def test_new_header_changes_the_module_text(cuda_dir: Path) -> None:
    before = source.module_source("k.cu")
    (cuda_dir / "g.cuh").write_text("#define M 1\n")
    assert source.module_source("k.cu") != before


def test_the_shipped_sources_carry_the_digest() -> None:
    text = source.module_source("sampling.cu")
    assert text.startswith(source.read_cuda_source("sampling.cu"))
    assert "// headers: " in text.splitlines()[-1]
