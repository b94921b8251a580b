"""The warpgroup-MMA GEMM's host side (kernels/linear_wgmma.py, CRUCIBLE_WGMMA): the codes'
pre-permuted image puts every k where cuda/linear_wgmma.cu reads the slot linear_mma.cu's
order gives it; which GEMMs route there; the switch is strict and needs the mma order; the
backend names it in its arithmetic (so the prefix cache keeps the two apart). The kernel's
index arithmetic runs on the host in tests/test_kernels_on_host.py; its bits on the GPU in
tests/test_gpu_linear_wgmma.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import warnings

import pytest

from crucible.backend.cupy_backend import CupyBackend
from crucible.backend.options import BackendOptions
from crucible.engine.settings import Settings
from crucible.errors import ConfigError
from crucible.kernels import linear_wgmma as lw
from crucible.kernels.device_weight import codes_bf16, codes_wgmma


def test_codes_image_holds_each_k_in_its_mma_slot() -> None:
    """Element (nc, c, j, kc, r, p) = code[8 nc + r][64 c + 16 (p // 2) + 4 j + p % 2 +
    2 kc]: step j's slot 8 kc + p of column 8 nc + r, as mma_common.cuh's fragments hold
    k = 16 t + 4 j + 0..3 in the slots 2t, 2t+1, 2t+8, 2t+9."""
    codes = np.random.default_rng(3).integers(-127, 128, (16, 128)).astype(np.int8)
    got = codes_wgmma(codes).reshape(2, 2, 4, 2, 8, 8)
    bits = codes_bf16(codes)
    for nc, c, j, kc, r, p in np.ndindex(got.shape):
        slot = 8 * kc + p
        t, s = (slot % 8) // 2, slot % 2 + 2 * (slot // 8)  # the slot's lane group, k offset
        assert got[nc, c, j, kc, r, p] == bits[8 * nc + r, 64 * c + 16 * t + 4 * j + s]
    assert sorted(got.ravel().tolist()) == sorted(bits.ravel().tolist())  # a permutation


def test_routes_by_rows_and_width_with_the_image_and_a_fitting_shape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ROUTE's first matching entry: below FROM_M rows none (linear_mma, the rows kernel is
    not routed); from 128 rows only a wide N (gate_up); from 256 every layer, BN 64 for a
    wide N; from 512 BN 64. Only for a weight uploaded in the kernel's order and a shape
    the form takes (else the next entry, or none)."""
    def wd(n: int, k: int = 576, wg: object | None = object()) -> SimpleNamespace:
        return SimpleNamespace(shape=(n, k), wg=wg)

    assert lw.FROM_M == 128
    for m in (1, 16, 64, 127):
        assert lw.route(m, wd(3072)) is None and lw.route(m, wd(960)) is None
    assert lw.route(128, wd(3072)) == (64, 3) and lw.route(255, wd(960)) is None
    assert lw.route(256, wd(960)) == (32, 3) and lw.route(256, wd(3072)) == (64, 3)
    assert lw.route(511, wd(576, 1536)) == (32, 3)
    assert lw.route(512, wd(960)) == (64, 3) and lw.route(4096, wd(576, 1536)) == (64, 3)
    assert lw.route(2048, wd(960, wg=None)) is None  # not uploaded in the kernel's order
    assert lw.route(2048, wd(960, 576 + 32)) is None  # K not whole 64-blocks
    assert lw.route(2048, wd(960 + 32)) == (32, 3)  # BN 64 does not divide N: the next entry
    assert lw.route(2048, wd(960 + 16)) is None  # no routed form does
    assert lw.smem_bytes((32, 3)) == 3 * (16384 + 32 * 128)
    # down (K = 1,536) at three warpgroups: 6 stages and 24 blocks' values, under 227 KiB
    assert lw.rows_smem((16, 3), 1536) == 6 * (16384 + 16 * 128) + 24 * 64 * 16 * 4
    assert lw.rows_fits(576, 1536) and not lw.rows_fits(576, 64 * 30)
    calls: list = []
    monkeypatch.setattr(lw, "kernel", lambda form: form)
    monkeypatch.setattr(lw, "_launch", lambda fn, bn, *a: calls.append((fn, bn)))
    for form in lw.FORMS:
        lw.run(SimpleNamespace(shape=(512, 576)), wd(960), None, None, form)
    assert calls == [(f, f[0]) for f in lw.FORMS]


def test_the_swiglu_epilogue_routes_where_its_form_takes_gate_up() -> None:
    """swiglu_route: the tile kernel's route where that form has a SwiGLU epilogue and N
    holds whole pairs of half tiles (2 BN), else None (GEMM and swiglu_rows stay apart);
    linear_wgmma_swiglu refuses other forms and mismatched shapes by name."""
    def wd(n: int, k: int = 576, wg: object | None = object()) -> SimpleNamespace:
        return SimpleNamespace(shape=(n, k), wg=wg, dtype_name="int8")

    assert lw.swiglu_route(64, wd(3072)) is None  # below FROM_M: the rows kernel's epilogue
    assert lw.swiglu_route(128, wd(3072)) == (64, 3) and lw.swiglu_route(1024, wd(3072)) == (64, 3)
    assert lw.swiglu_route(384, wd(960)) == (32, 3)  # (32, 3) has one too
    assert lw.SWIGLU_SKIP_ROWS == ((256, 384),)  # measured slower at 256 in the graphs
    assert lw.swiglu_route(255, wd(3072)) == (64, 3) and lw.swiglu_route(384, wd(3072)) == (64, 3)
    assert lw.swiglu_route(256, wd(3072)) is None and lw.swiglu_route(320, wd(3072)) is None
    assert lw.swiglu_route(1024, wd(3072, wg=None)) is None
    assert lw.swiglu_route(2048, wd(960 + 32)) is None  # (32, 3): 992 is not whole 64-pairs
    x = SimpleNamespace(shape=(4, 576))
    with pytest.raises(ValueError, match="no SwiGLU epilogue"):
        lw.linear_wgmma_swiglu(x, wd(3072), None, form=(16, 4))
    with pytest.raises(ValueError, match=r"out \[M, 1536\]"):
        lw.linear_wgmma_swiglu(x, wd(3072), SimpleNamespace(shape=(4, 3072)), form=(64, 3))


def test_switch_is_strict_and_needs_the_mma_order() -> None:
    assert Settings.from_env({}).wgmma is None  # auto: where the GPU runs it
    assert Settings.from_env({}).backend_options().wgmma is None
    assert Settings.from_env({"CRUCIBLE_WGMMA": "auto"}).wgmma is None
    assert Settings.from_env({"CRUCIBLE_WGMMA": "0"}).backend_options().wgmma is False
    s = Settings.from_env({"CRUCIBLE_WGMMA": "1"})
    assert s.wgmma and s.backend_options().wgmma
    for bad in ("on", "2", "", "AUTO"):
        with pytest.raises(ConfigError, match="CRUCIBLE_WGMMA must be 0, 1 or auto"):
            Settings.from_env({"CRUCIBLE_WGMMA": bad})
    with pytest.raises(ConfigError, match="wgmma must be True, False or None"):
        Settings(wgmma=1)
    # auto under fma is simply off; only an explicit 1 is a contradiction
    assert Settings.from_env({"CRUCIBLE_GEMM": "fma"}).backend_options().wgmma is False
    with pytest.raises(ConfigError, match="needs gemm 'mma'"):
        Settings.from_env({"CRUCIBLE_WGMMA": "1", "CRUCIBLE_GEMM": "fma"})
    # f32 weights take linear.cu's order: the switch does not reach the backend there
    assert not Settings(wgmma=True, weights="f32").backend_options().wgmma


def test_backend_keeps_one_arithmetic_with_or_without_the_kernel() -> None:
    """The warpgroup-MMA GEMMs give linear_mma's bits (the H200's bitwise tests), so the
    backend's arithmetic, which keys the prefix cache, is the same with them or without."""
    on = CupyBackend(BackendOptions(gemm="mma", wgmma=True))
    off = CupyBackend(BackendOptions(gemm="mma"))
    auto = CupyBackend(BackendOptions(gemm="mma", wgmma=None))
    assert on.wgmma is True and off.wgmma is False and auto.wgmma is None  # auto: at load
    assert on.arithmetic == off.arithmetic == auto.arithmetic == "cupy-exact-q4-k64-mma"
    assert CupyBackend(BackendOptions(gemm="fma", wgmma=True)).wgmma is False
    assert CupyBackend(BackendOptions(gemm="fma", wgmma=None)).wgmma is False


def test_start_up_refuses_another_gpu_or_a_failed_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """CRUCIBLE_WGMMA=1 is checked when the weights load: another GPU generation, or an
    NVRTC that cannot build sm_90a, is a ConfigError naming the setting, not a failure at
    the first GEMM of 128 rows."""
    import sys
    import types

    cc = {"value": "80"}
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(
        compute_capability=cc["value"]))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    built: list = []
    monkeypatch.setattr(lw, "kernel", lambda form: built.append(form))
    with pytest.raises(ConfigError, match="CRUCIBLE_WGMMA=1: .*needs an sm_90 GPU.*sm_80"):
        lw.require_device()
    assert built == []
    cc["value"] = "90"
    lw.require_device()
    assert built == [(64, 3), (32, 3)]  # every routed form built at start-up
    built.clear()
    assert lw.enable(True) and lw.enable(None) and built == [(64, 3), (32, 3)] * 2
    cc["value"] = "80"  # auto elsewhere: off, quietly (mma's kernels give the same bits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lw.enable(None) is False
    with pytest.raises(ConfigError, match="needs an sm_90 GPU"):
        lw.enable(True)

    def broken(form: tuple) -> None:
        raise RuntimeError("NVRTC could not build linear_wgmma.cu for sm_90a:\nlog")

    monkeypatch.setattr(lw, "kernel", broken)
    cc["value"] = "90"
    with pytest.raises(ConfigError, match="CRUCIBLE_WGMMA=1: NVRTC could not build"):
        lw.require_device()
    # auto on a Hopper whose NVRTC fails: off, with a warning saying why
    with pytest.warns(RuntimeWarning, match="warpgroup-MMA GEMMs are off: .*NVRTC could not"):
        assert lw.enable(None) is False
    with pytest.raises(ConfigError, match="NVRTC could not build"):
        lw.enable(True)


def test_kernels_are_looked_up_by_form_with_their_shared_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import crucible.kernels.loader as loader
    import crucible.kernels.source as source

    names: list[str] = []
    opted: list[int] = []
    module = SimpleNamespace(get_function=lambda name: names.append(name) or name)
    monkeypatch.setattr(source, "cached_arch_module", lambda file, arch: module)
    monkeypatch.setattr(loader, "ensure_dynamic_smem", lambda fn, smem: opted.append(smem))
    lw.kernel.cache_clear()
    lw.swiglu_kernel.cache_clear()
    try:
        lw.kernel((64, 3)), lw.swiglu_kernel((32, 3))
    finally:
        lw.kernel.cache_clear()
        lw.swiglu_kernel.cache_clear()
    assert names == ["linear_wgmma_64_3", "linear_wgmma_swiglu_32_3"]
    assert opted == [lw.smem_bytes((64, 3)), lw.smem_bytes((32, 3))]
