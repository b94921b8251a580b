"""The chunk-parallel decode GEMM (cuda/linear_chunks.cu, crucible/kernels/linear_chunks.py),
checked without a GPU: routing thresholds, tile policy, argument errors, the launch plan,
the scratch cache, an nvcc build with no spills, and the finisher's order against an exact
model (with a negative control). On the GPU: tests/test_gpu_engine.py, gpu-engine-check."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from crucible.kernels import linear_chunks as cc
from crucible.kernels.device_weight import DeviceWeight
from crucible.checks.chunks_check import finish_partials
from crucible.kernels.source import cuda_source_dir
from tests.cpu_reference import canonical_gemm, fma_f32


class Dev(np.ndarray):
    """A host array posing as a device one: the wrappers read dtype, shape, flags, data.ptr."""

    @property
    def data(self) -> SimpleNamespace:  # type: ignore[override]
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


def dev(shape: tuple[int, ...], dtype: type = np.float32, offset: int = 0) -> Dev:
    """A zeroed array starting ``offset`` bytes past a 16-byte boundary."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(size + 32, np.uint8)
    start = (-raw.__array_interface__["data"][0]) % 16 + offset
    return raw[start : start + size].view(dtype).reshape(shape).view(Dev)


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    fake = types.ModuleType("cupy")
    fake.float32, fake.int32, fake.uint32, fake.int8 = np.float32, np.int32, np.uint32, np.int8
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def weight(n: int, k: int, int8: bool = True) -> DeviceWeight:
    if int8:
        return DeviceWeight(None, dev((n, k), np.int8), dev((n,)))
    return DeviceWeight(None, dev((n, k)), None)


def test_use_chunks_thresholds() -> None:
    assert cc.CHUNKS_FROM == {cc.EPI_STORE: 48, cc.EPI_SWIGLU: 32} and cc.CHUNKS_MAX_M == 64
    assert not cc.use_chunks(47, 576, 576) and cc.use_chunks(48, 576, 576)
    assert cc.use_chunks(64, 576, 1536) and cc.use_chunks(65, 576, 1536)  # row blocks
    assert not cc.use_chunks(31, 3072, 576, cc.EPI_SWIGLU)
    assert cc.use_chunks(32, 3072, 576, cc.EPI_SWIGLU)
    assert not cc.use_chunks(33, 3071, 576, cc.EPI_SWIGLU)  # no [2F, K] split
    assert not cc.use_chunks(64, 960, 576, 2)  # RoPE is not built
    assert not cc.use_chunks(48, 70, 100) and cc.use_chunks(48, 70, 112)  # K % 16
    assert not cc.use_chunks(48, 49152, 576)  # the LM head: 113 MB of partials


@pytest.mark.parametrize("m, n, k, epi, want", [
    # bench/gemm-chunks-h200.json (132 SMs): faster than the wide kernel's pick ...
    (96, 576, 576, 0, True), (256, 576, 576, 0, True), (512, 576, 1536, 0, True),
    (1024, 576, 576, 0, True), (256, 960, 576, 0, True), (768, 960, 576, 0, True),
    (128, 3072, 576, 1, True), (256, 3072, 576, 1, True),
    # ... and slower: 0.6-0.9 and from 1.5 tiles of 64x64 a SM, or the partials too big
    (768, 576, 576, 0, False), (384, 960, 576, 0, False), (1024, 960, 576, 0, False),
    (512, 3072, 576, 1, False), (1024, 3072, 576, 1, False), (2048, 576, 576, 0, False),
    (300, 49152, 576, 0, False),
])
def test_use_chunks_past_64_rows(m, n, k, epi, want) -> None:
    assert cc.use_chunks(m, n, k, epi, sms=132) is want


def test_tile_width_past_64_rows() -> None:
    # 64 columns once row blocks give 4 x CTA_TARGET CTAs of them (measured, same file)
    assert cc.chunks_nt(576, 576, 0, 256) == 32 and cc.chunks_nt(576, 576, 0, 1024) == 64
    assert cc.chunks_nt(3072, 576, 1, 256) == 64 and cc.chunks_nt(960, 576, 0, 256) == 32
    assert cc.chunks_nt(576, 1536, 0, 256) == 32 and cc.chunks_nt(960, 576, 0, 768) == 64


def test_tile_policy() -> None:
    assert [cc.chunks_mr(m) for m in (1, 16, 17, 32, 33, 64)] == [16, 16, 32, 32, 64, 64]
    assert cc.chunks_nt(3072, 576, cc.EPI_SWIGLU) == 64  # gate/up: 48 tiles x 9 chunks
    assert cc.chunks_nt(576, 576) == 32  # O: 9 x 9 CTAs would leave SMs idle
    assert cc.chunks_nt(576, 1536) == 32  # down: 24 chunks, a long finisher at 64
    assert cc.tile_count(3072, 64, cc.EPI_SWIGLU) == 48 and cc.tile_count(70, 32, 0) == 3
    assert cc.scratch_floats(70, 112, 0, 32) == 3 * 2 * 64 * 32
    assert [cc.row_blocks(m) for m in (1, 64, 65, 128, 129, 1024)] == [1, 1, 2, 2, 3, 16]
    assert cc.chunks_mr(300) == 64 and cc.scratch_floats(70, 112, 0, 32, 16) == 3 * 2 * 16 * 32
    assert cc.scratch_floats(576, 576, 0, 32, 130) == 3 * 18 * 9 * 64 * 32


def test_argument_errors(fake_cupy: types.ModuleType) -> None:
    x, out, wd = dev((8, 64)), dev((8, 96)), weight(96, 64)
    bad = [
        (dict(x=dev((8, 48))), "K=48"),
        (dict(x=dev((8, 64), np.float64)), "f32"),
        (dict(x=dev((1025, 64)), out=dev((1025, 96))), "at most 1024"),
        (dict(out=dev((8, 95))), "out"),
        (dict(residual=dev((8, 95))), "residual"),
        (dict(wd=weight(96, 72), x=dev((8, 72))), "multiple of 16"),
        (dict(wd=DeviceWeight(None, dev((96, 64), np.int8), None)), "scale"),
        (dict(wd=DeviceWeight(None, dev((96, 64), np.int16), None)), "f32 or int8"),
        (dict(epi=2), "epilogue"),
        (dict(epi=cc.EPI_SWIGLU), "out"),  # [8, 96] is not [8, F = 48]
        (dict(epi=cc.EPI_SWIGLU, out=dev((8, 48)), residual=dev((8, 96))), "no residual"),
        (dict(nt=48), "columns per tile"),
        (dict(x=dev((8, 64), offset=4)), "16-byte"),
        (dict(out=dev((8, 96), offset=8)), "16-byte"),
    ]
    for change, msg in bad:
        kw = dict(x=x, wd=wd, out=out, residual=None, epi=cc.EPI_STORE, nt=None) | change
        with pytest.raises(ValueError, match=msg):
            cc.linear_chunks(kw["x"], kw["wd"], kw["out"], kw["residual"], kw["epi"],
                             nt=kw["nt"])


def test_launch_plan(fake_cupy: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple] = []
    scratch = SimpleNamespace(part="part", counters="counters")
    monkeypatch.setattr(cc, "chunks_kernel", lambda name: name)
    monkeypatch.setattr(cc, "scratch", lambda floats, tiles: calls.append((floats, tiles))
                        or scratch)
    monkeypatch.setattr(cc, "launch", lambda fn, grid, block, args, shared_mem=0, pdl=False:
                        calls.append((fn, grid, block, args)))
    wd = weight(3072, 576)
    y = dev((40, 1536))
    assert cc.linear_chunks(dev((40, 576)), wd, y, epi=cc.EPI_SWIGLU) is y
    assert calls[0] == (48 * 64 * 9 * 64, 48)
    fn, grid, block, args = calls[1]
    assert fn == "linear_chunks<signed char, 64, 64, 1>" and grid == (48, 9) and block == (256,)
    assert args[5:7] == ("part", "counters") and args[3] == np.uint64(0)
    assert [int(a) for a in args[7:]] == [40, 1536, 576]
    calls.clear()
    cc.linear_chunks(dev((16, 1536)), weight(576, 1536, int8=False), dev((16, 576)),
                     dev((16, 576)))
    fn, grid, _, args = calls[1]
    assert fn == "linear_chunks<float, 32, 16, 0>" and grid == (18, 24)
    assert args[2] is args[4]  # f32: the unused scale slot gets a valid pointer (out)
    calls.clear()
    cc.linear_chunks(dev((130, 576)), weight(576, 576), dev((130, 576)), dev((130, 576)))
    assert calls[0] == (3 * 18 * 9 * 64 * 32, 3 * 18)  # row blocks: partials and counters
    fn, grid, _, args = calls[1]
    assert fn == "linear_chunks<signed char, 32, 64, 0>" and grid == (18, 9, 3)
    assert int(args[7]) == 130  # the kernel cuts the rows into blocks itself
    calls.clear()
    assert cc.linear_chunks(dev((0, 576)), wd, dev((0, 3072))) is not None and not calls


def test_scratch_cache(fake_cupy: types.ModuleType) -> None:
    """Per (device, stream); grown, the old buffers kept alive; no allocation in a capture."""
    state = SimpleNamespace(stream=SimpleNamespace(ptr=7, is_capturing=lambda: False),
                            memsets=[])
    fake_cupy.cuda = SimpleNamespace(
        get_current_stream=lambda: state.stream,
        runtime=SimpleNamespace(getDevice=lambda: 0,
                                memsetAsync=lambda *a: state.memsets.append(a)))
    fake_cupy.get_default_memory_pool = lambda: SimpleNamespace(malloc=lambda n: n)
    fake_cupy.ndarray = lambda shape, dtype, memptr: SimpleNamespace(
        size=shape[0], dtype=dtype, data=SimpleNamespace(ptr=memptr))
    # Saved and restored: a GPU run's earlier tests leave real buffers (real CuPy arrays,
    # which this fake module cannot compare) in both.
    saved = dict(cc._SCRATCH), list(cc._RETIRED)
    cc._SCRATCH.clear()
    cc._RETIRED.clear()
    a = cc.scratch(1000, 10)
    assert cc.scratch(500, 5) is a and state.memsets == [(40, 0, 40, 7)]
    b = cc.scratch(2000, 4)
    assert b is not a and b.part.size == 2000 and b.counters.size == 10
    assert any(r is a for r in cc._RETIRED) and cc.current_scratch() is b
    state.stream = SimpleNamespace(ptr=9, is_capturing=lambda: True)
    with pytest.raises(RuntimeError, match="capture"):
        cc.scratch(10, 1)
    cc._SCRATCH.clear()
    cc._RETIRED.clear()
    cc._SCRATCH.update(saved[0])
    cc._RETIRED.extend(saved[1])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_nvcc_builds_every_form_without_spills(tmp_path: Path) -> None:
    src = cuda_source_dir() / "linear_chunks.cu"
    r = subprocess.run(["nvcc", "-arch=sm_90", "-Xptxas", "-v", "-std=c++17",
                        f"-I{cuda_source_dir()}", "-c", str(src), "-o", str(tmp_path / "o.o")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    forms = re.findall(r"Compiling entry function '_Z13linear_chunks(\w+)'", r.stderr)
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert len(forms) == 24 and len(spills) == 24, r.stderr
    assert all(s == "0" for s in spills), r.stderr


def model_partials(x: np.ndarray, w: np.ndarray, nt: int) -> np.ndarray:
    """What CTA (tile, chunk) writes to the scratch, in exact arithmetic: each chunk's chain
    of fmas from zero, k ascending. Padding columns past N stay zero."""
    m, k = x.shape
    n = w.shape[0]
    tiles, chunks = -(-n // nt), -(-k // 64)
    part = np.zeros((tiles, chunks, m, nt), np.float32)
    for col in range(n):
        for c in range(chunks):
            for r in range(m):
                acc = np.float32(0.0)
                for kk in range(64 * c, min(k, 64 * c + 64)):
                    acc = fma_f32(x[r, kk], np.float32(w[col, kk]), acc)
                part[col // nt, c, r, col % nt] = acc
    return part


def test_finisher_order_and_negative_control() -> None:
    """Ascending chunk order over exactly rounded partials == the canonical GEMM (int8 with
    scale and residual); the descending sum of the same partials differs (negative control:
    the check can see an order change)."""
    rng = np.random.default_rng(4)
    m, n, k = 3, 40, 192
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.integers(-127, 128, (n, k)).astype(np.int8)
    scale = (rng.random(n) * 0.01).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    part = model_partials(x, w, 32)
    want = canonical_gemm(x, w, scale, res)
    assert np.array_equal(finish_partials(part, n, scale, res).view(np.uint32),
                          want.view(np.uint32))
    down = finish_partials(part, n, scale, res, descending=True)
    assert not np.array_equal(down.view(np.uint32), want.view(np.uint32))


def test_routing(fake_cupy: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """ck.linear (O and down, via linear_add) and mlp_in take the chunk kernel exactly where
    use_chunks says so (and not for ``tiled`` or a misaligned array); else as before."""
    from crucible.backend.cupy_backend import CupyBackend
    from crucible.backend.options import BackendOptions
    from crucible.kernels import linear as ck
    from crucible.kernels import linear_rows as cf

    seen: list[tuple] = []
    monkeypatch.setattr(cc, "linear_chunks", lambda x, wd, out, residual=None, epi=0, **kw:
                        seen.append(("chunks", epi)) or out)
    monkeypatch.setattr(cf, "linear_rows", lambda x, wd, out, **kw:
                        seen.append(("rows", kw.get("epi", 0))) or out)
    monkeypatch.setattr(ck, "linear_tiled", lambda x, wd, out, residual=None:
                        seen.append(("tiled", 0)) or out)
    wd = weight(576, 576)
    for m in (8, 47, 48, 64, 65):
        ck.linear(dev((m, 576)), wd, dev((m, 576)), dev((m, 576)))
    ck.linear(dev((48, 576)), wd, dev((48, 576)), tiled=True)
    ck.linear(dev((48, 576)), wd, dev((48, 576), offset=4))
    assert seen == [("rows", 0), ("rows", 0), ("chunks", 0), ("chunks", 0), ("chunks", 0),
                    ("tiled", 0), ("rows", 0)]
    seen.clear()
    be = CupyBackend.__new__(CupyBackend)
    be._linear = {"l0.gate_up": weight(3072, 576)}
    be._norms = {"l0.ffn_norm": dev((576,))}
    be.cfg = SimpleNamespace(rms_eps=1e-5)
    be.options = BackendOptions()
    be.new = lambda shape: dev(shape)
    be.rmsnorm = lambda x, name: seen.append(("norm", name)) or x
    assert be.mlp_in(dev((33, 576)), 0).shape == (33, 1536)
    be.mlp_in(dev((8, 576)), 0)
    assert seen == [("norm", "l0.ffn_norm"), ("chunks", cc.EPI_SWIGLU), ("rows", cf.EPI_SWIGLU)]
