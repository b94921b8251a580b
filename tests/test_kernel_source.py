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


class _FakeNvrtc:
    """cupy's nvrtc binding as cached_arch_module uses it: records compiles, can fail."""

    class NVRTCError(Exception):
        pass

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.compiles, self.destroyed = fail, [], 0

    def getVersion(self) -> tuple[int, int]:  # noqa: N802 - the binding's name
        return (13, 0)

    def createProgram(self, src: str, name: str, headers: tuple, names: tuple) -> str:  # noqa: N802
        return src

    def compileProgram(self, prog: str, options: tuple) -> None:  # noqa: N802
        self.compiles.append(options)
        if self.fail:
            raise self.NVRTCError("7")

    def getProgramLog(self, prog: str) -> str:  # noqa: N802
        return "error: wgmma needs sm_90a"

    def getCUBIN(self, prog: str) -> bytes:  # noqa: N802
        return b"cubin:" + prog.encode()

    def destroyProgram(self, prog: str) -> None:  # noqa: N802
        self.destroyed += 1


def _fake_cupy(monkeypatch: pytest.MonkeyPatch, cache: Path) -> list[str]:
    import sys
    import types

    loaded: list[str] = []
    cupy = types.ModuleType("cupy")
    cupy.RawModule = lambda path: loaded.append(path) or ("module", path)
    cuda = types.ModuleType("cupy.cuda")
    cupy.cuda = cuda
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(source, "kernel_cache_dir", lambda: cache)
    return loaded


def test_arch_module_builds_once_with_cupys_options_and_reuses_the_cubin(
        cuda_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An sm_90a build: NVRTC gets the project's options, the arch and CuPy's implied
    -ftz=true; the cubin lands in the kernel cache and a new process (the function's cache
    cleared) loads it without compiling; a changed header builds again."""
    loaded = _fake_cupy(monkeypatch, tmp_path / "cache")
    fake = _FakeNvrtc()
    monkeypatch.setattr(source, "_nvrtc", lambda: fake)
    source.cached_arch_module.cache_clear()
    source.cached_arch_module("k.cu", "sm_90a")
    assert len(fake.compiles) == 1 and fake.destroyed == 1
    opts = fake.compiles[0]
    assert "-arch=sm_90a" in opts and "-ftz=true" in opts and "-std=c++17" in opts
    assert f"-I{cuda_dir}" in opts
    cubins = list((tmp_path / "cache").glob("crucible-k-sm_90a-*.cubin"))
    assert len(cubins) == 1 and cubins[0].read_bytes().startswith(b"cubin:")
    assert loaded == [str(cubins[0])]
    source.cached_arch_module.cache_clear()
    source.cached_arch_module("k.cu", "sm_90a")
    assert len(fake.compiles) == 1 and loaded == [str(cubins[0])] * 2  # from the cache
    (cuda_dir / "h.cuh").write_text("#define N 3\n")
    source.cached_arch_module.cache_clear()
    source.cached_arch_module("k.cu", "sm_90a")
    assert len(fake.compiles) == 2 and len(list((tmp_path / "cache").glob("*.cubin"))) == 2
    assert not list((tmp_path / "cache").glob("*.tmp"))
    source.cached_arch_module.cache_clear()


def test_arch_module_build_error_names_the_file_and_nvrtcs_log(
        cuda_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cupy(monkeypatch, tmp_path / "cache")
    fake = _FakeNvrtc(fail=True)
    monkeypatch.setattr(source, "_nvrtc", lambda: fake)
    source.cached_arch_module.cache_clear()
    with pytest.raises(RuntimeError, match=r"could not build k\.cu for sm_90a:\n.*needs sm_90a"):
        source.cached_arch_module("k.cu", "sm_90a")
    assert fake.destroyed == 1 and not list((tmp_path / "cache").glob("*"))
    source.cached_arch_module.cache_clear()
