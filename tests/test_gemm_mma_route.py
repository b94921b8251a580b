"""CRUCIBLE_GEMM=mma on the CPU: the setting's parsing, the tensor-core GEMM's shape rules
and form picks, and the CuPy backend's routes with it on and off (a fake CuPy records which
kernel each stage would launch; the GPU bits are tests/test_gpu_linear_mma.py's)."""

from __future__ import annotations

import types
from types import SimpleNamespace

import numpy as np
import pytest

from crucible.engine.settings import ConfigError, Settings
from crucible.kernels import linear_mma as lm
from crucible.kernels.device_weight import DeviceWeight
from tests.test_linear_chunks import dev, fake_cupy, weight  # noqa: F401 - fixture

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576))  # SmolLM2-135M


def test_setting_parses_and_refuses_other_values() -> None:
    assert Settings.from_env({}).gemm == "mma"
    s = Settings.from_env({"CRUCIBLE_GEMM": " fma "})
    assert s.gemm == "fma" and s.backend_options().gemm == "fma"
    s = Settings.from_env({"CRUCIBLE_GEMM": "mma"})
    assert s.gemm == "mma" and s.backend_options().gemm == "mma"
    for bad in ("", "MMA", "tensor", "1"):
        with pytest.raises(ConfigError, match="CRUCIBLE_GEMM must be one of fma, mma"):
            Settings.from_env({"CRUCIBLE_GEMM": bad})
    with pytest.raises(ConfigError, match="gemm must be one of fma, mma, got 'bf16'"):
        Settings(gemm="bf16")


def test_the_order_named_is_the_one_the_gemms_take() -> None:
    """mma is the default for int8 weights on CUDA only: f32 weights and the CPU have
    linear.cu's order, so the backend, the start-up report and the prefix cache's
    namespace must say fma there (and an explicit mma changes nothing for them)."""
    for gemm in ("mma", "fma"):
        assert Settings(gemm=gemm).gemm_order("cuda") == gemm
        assert Settings(gemm=gemm).gemm_order("cpu") == "fma"
        f32 = Settings(gemm=gemm, weights="f32")
        assert f32.gemm_order("cuda") == "fma" and f32.backend_options().gemm == "fma"
    assert Settings().backend_options().gemm == "mma"


def test_a_cpu_engine_reports_the_fma_order() -> None:
    from crucible.engine import factory

    _, info = factory.build_engine(factory.TINY_MODEL, Settings(device="cpu",
                                                                graph_warmup=False))
    assert info.device == "cpu" and info.gemm == "fma"


def test_every_model_shape_has_a_form_at_every_size() -> None:
    for n, k in SHAPES:
        for m in (1, 16, 64, 65, 256, 1023, 1024, 4096):
            form = lm.pick_form(m, n, k)
            assert lm.fits(n, k, form)
            assert lm.supports(n, k)
            rows_kernel = m <= 64 or (m <= 128 and n < 2048)
            assert (len(form) == 2) == (rows_kernel and n < 8192), (n, k, m, form)
            one_row = lm.ROW1_ROUTED and m == 1 and n >= lm.ROW1_FROM_N
            assert (len(form) == 1) == one_row, (n, k, m, form)
    assert not lm.fits(576, 560, (1, 2, 2, 2))  # K not whole 64-blocks
    assert not lm.fits(600, 576, (1, 2, 2, 2))  # N not whole 32-column tiles
    assert not lm.fits(576, 64 * 49, (4, 8))  # the rows kernel's block values past 48 KB
    with pytest.raises(ValueError, match="no form fits N=100, K=576"):
        lm.pick_form(16, 100, 576)
    assert not lm.supports(100, 576) and not lm.supports(576, 100)  # these keep linear.cu


def test_wrapper_refuses_f32_weights_and_misfits(fake_cupy: types.ModuleType) -> None:
    with pytest.raises(ValueError, match="int8 weights only"):
        lm.linear_mma(dev((4, 576)), weight(576, 576, int8=False), dev((4, 576)))
    with pytest.raises(ValueError, match=r"form \(1, 2, 2, 2\) does not fit N=40"):
        lm.linear_mma(dev((4, 64)), weight(40, 64), dev((4, 40)), form=(1, 2, 2, 2))
    with pytest.raises(ValueError, match="16-byte aligned"):
        lm.linear_mma(dev((4, 576), offset=4), weight(576, 576), dev((4, 576)))


def test_wrapper_refuses_what_the_fused_forms_cannot_run(fake_cupy: types.ModuleType) -> None:
    x, gu, norm, out = dev((2, 576)), weight(3072, 576), dev((576,)), dev((2, 1536))
    cases = ((dict(norm=dev((64,)), swiglu=True), r"contiguous f32 \[576\]"),
             (dict(swiglu=True, one_acc=True), "no fused form"),
             (dict(swiglu=True, form=(1, 12)), "no fused rows form"),
             (dict(norm=norm, swiglu=True, one_acc=True), "no fused form"),
             (dict(norm=norm, swiglu=True, form=(1, 12)), "no fused rows form"),
             (dict(norm=norm, swiglu=True, form=(2, 4, 2, 2)), "no fused rows form"))
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            lm.linear_mma(x, gu, out, **kw)
    with pytest.raises(ValueError, match="takes no residual"):
        lm.linear_mma(x, gu, out, dev((2, 1536)), norm=norm, swiglu=True)
    with pytest.raises(ValueError, match=r"out must be contiguous f32 \(2, 1536\)"):
        lm.linear_mma(x, gu, dev((2, 3072)), norm=norm, swiglu=True)
    # Past 64 rows gate/up takes the tile kernel, which fuses nothing.
    with pytest.raises(ValueError, match="no fused rows form for M=65"):
        lm.linear_mma(dev((65, 576)), gu, dev((65, 1536)), norm=norm, swiglu=True)
    with pytest.raises(ValueError, match="no fused rows form for M=65"):
        lm.linear_mma(dev((65, 576)), gu, dev((65, 1536)), swiglu=True)
    # K = 1536 at NT = 4: the block values fill 48 KiB, the norm's 576 bytes do not fit.
    assert lm.fits(576, 1536, (4, 8)) and not lm.fits(576, 1536, (4, 8), norm=True)
    with pytest.raises(ValueError, match=r"form \(4, 8\) does not fit"):
        lm.linear_mma(dev((2, 1536)), weight(576, 1536), dev((2, 576)), norm=dev((1536,)),
                      form=(4, 8))
    assert lm.fused_form(1, 3072, 576, swiglu=True) == (2, 12)  # an even NT for SwiGLU
    assert lm.fused_form(lm.FUSE_MAX_ROWS + 1, 960, 576) is None
    # The SwiGLU epilogue alone: wherever the rows kernel runs, whatever FUSE_MAX_ROWS.
    for m in (1, 3, 16, 64):
        assert lm.fused_form(m, 3072, 576, swiglu=True, norm=False) == (2, 12)
    assert lm.fused_form(65, 3072, 576, swiglu=True, norm=False) is None
    assert lm.fused_form(8, 960, 576, norm=False) is None  # neither: nothing to fuse
    # The prologue stages its CTA's rows (min(16, M)) of x in shared memory beside the block
    # values: K = 576 at NT = 2 fits with 16 rows (46,656 bytes), at NT = 4 up to 13, and
    # K = 640 at NT = 2 with 4 (where it does not fit, the stages stay separate).
    assert lm.row_smem(576, 2, 16) + lm.NORM_SMEM == 46656
    assert lm.fits(576, 576, (2, 12), norm=True, m=64)
    assert lm.fits(576, 576, (4, 8), norm=True, m=13)
    assert not lm.fits(576, 576, (4, 8), norm=True, m=14)
    assert lm.fits(576, 640, (2, 8), norm=True, m=4)
    assert not lm.fits(576, 640, (2, 8), norm=True, m=16)


def test_the_one_row_form_takes_one_row_of_a_wide_weight(
        fake_cupy: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """linear_mma_row1 (the batch-1 LM head): routed (ROW1_ROUTED; a bench may switch it
    off), picked at one row of 8,192 columns or more and fused with the final RMSNorm there
    (never with SwiGLU); it refuses more rows, the control, and shapes whose B fragments do
    not fit or whose columns are not whole pairs."""
    head = weight(49152, 576)
    assert lm.ROW1_ROUTED and lm.ROW1_FORMS[0] == (2,)
    monkeypatch.setattr(lm, "ROW1_ROUTED", False)  # off: the tile kernel, nothing fused
    assert len(lm.pick_form(1, 49152, 576)) == 4
    assert lm.fused_form(1, 49152, 576) is None
    monkeypatch.setattr(lm, "ROW1_ROUTED", True)
    assert lm.pick_form(1, 49152, 576) == (2,) and len(lm.pick_form(2, 49152, 576)) == 4
    assert len(lm.pick_form(1, 3072, 576)) == 2  # narrower weights keep the rows kernel
    assert lm.fused_form(1, 49152, 576) == (2,) and lm.fused_form(2, 49152, 576) is None
    assert lm.fused_form(1, 49152, 576, swiglu=True) is None
    assert lm.fits(49152, 576, (2,)) and lm.fits(64, 64 * 128, (9,))
    assert not lm.fits(49160, 576, (9,)) and not lm.fits(49152, 560, (9,))
    assert not lm.fits(64, 64 * 129, (9,))  # 384 bytes of fragments a block past 48 KiB
    with pytest.raises(ValueError, match=r"one-row form \(9,\) takes one row .* got M=2"):
        lm.linear_mma(dev((2, 576)), head, dev((2, 49152)), form=(9,))
    with pytest.raises(ValueError, match="takes one row and no control"):
        lm.linear_mma(dev((1, 576)), head, dev((1, 49152)), form=(9,), one_acc=True)
    with pytest.raises(ValueError, match="no fused rows form"):
        lm.linear_mma(dev((1, 576)), weight(3072, 576), dev((1, 1536)), norm=dev((576,)),
                      swiglu=True, form=(9,))


def backend(gemm: str, seen: list, monkeypatch: pytest.MonkeyPatch) -> object:
    from crucible.backend.cupy_backend import CupyBackend
    from crucible.backend.options import BackendOptions
    from crucible.kernels import linear as ck
    from crucible.kernels import linear_chunks as cc
    from crucible.kernels import linear_rows as cf

    monkeypatch.setattr(lm, "linear_mma", lambda x, wd, out, residual=None, pdl=None,
                        norm=None, swiglu=False, **kw: seen.append(
                            ("mma", residual is not None, pdl) if norm is None and not swiglu
                            else ("mma+norm" if norm is not None else "mma+swiglu", swiglu,
                                  kw["form"])) or out)
    monkeypatch.setattr(ck, "linear", lambda x, wd, out, residual=None, **kw:
                        seen.append(("fma", residual is not None)) or out)
    monkeypatch.setattr(cc, "linear_chunks", lambda x, wd, out, *a, **kw:
                        seen.append(("chunks", kw.get("epi", 0))) or out)
    monkeypatch.setattr(cf, "linear_rows", lambda x, wd, out, **kw:
                        seen.append(("rows", kw.get("epi", 0))) or out)
    be = CupyBackend(BackendOptions(gemm=gemm))
    be._linear = {"l0.gate_up": weight(3072, 576), "l0.o": weight(576, 576),
                  "l0.f32": weight(576, 576, int8=False), "lm_head": weight(49152, 576)}
    be._norms = {"l0.ffn_norm": dev((576,)), "final_norm": dev((576,))}
    be.cfg = SimpleNamespace(rms_eps=1e-5, head_dim=64)
    be.new = lambda shape: dev(shape)
    be.rmsnorm = lambda x, name: seen.append(("norm", name)) or x
    be.swiglu = lambda gu: seen.append(("swiglu", 0)) or dev((gu.shape[0], gu.shape[1] // 2))
    return be


def test_mma_routes_every_int8_gemm_and_turns_the_fused_kernels_off(
        fake_cupy: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []
    be = backend("mma", seen, monkeypatch)
    # The batch-1 stack runs under mma too, its MMA forms (tests/test_decode_stack.py).
    assert be.use_stack and be.arithmetic.endswith("-mma")
    be._drop_graphs = lambda: None
    be.set_decode_stack(False)
    assert not be.use_stack
    x = dev((8, 576))
    be.linear(x, "l0.o")
    be.linear_add(x, "l0.o", x)
    be.linear(x, "l0.f32")  # f32 weights keep linear.cu's kernels
    assert seen == [("mma", False, True), ("mma", True, True), ("fma", False)]
    seen.clear()
    be.set_pdl(False)  # the backend's PDL switch reaches the mma launches
    be.linear(x, "l0.o")
    assert seen == [("mma", False, False)]
    seen.clear()
    monkeypatch.setattr(lm, "ROW1_ROUTED", False)  # the head on the tile kernel first
    for m in (1, 40, 300):  # rows, chunks and wide sizes under fma
        assert not be.fuses(dev((m, 576)), "mlp_in")
        be.mlp_in(dev((m, 576)), 0)
        be.norm_linear(dev((m, 576)), "final_norm", "lm_head")
    head = [("norm", "final_norm"), ("mma", False, False)]  # the LM head: the tile kernel
    # One row: RMSNorm, gate/up and SwiGLU in one rows launch (an even NT, for SwiGLU); past
    # FUSE_MAX_ROWS but in the rows kernel (40) the RMSNorm, then gate/up with the SwiGLU
    # epilogue; in the tile kernel (300) the separate stages.
    separate = [("norm", "l0.ffn_norm"), ("mma", False, False), ("swiglu", 0)]
    epi = [("norm", "l0.ffn_norm"), ("mma+swiglu", True, (2, 12))]
    assert seen == [("mma+norm", True, (2, 12))] + head + epi + head + separate + head
    seen.clear()
    # With the one-row form routed, one row's final norm and LM head are one launch of it.
    monkeypatch.setattr(lm, "ROW1_ROUTED", True)
    be.norm_linear(dev((1, 576)), "final_norm", "lm_head")
    be.norm_linear(dev((2, 576)), "final_norm", "lm_head")
    assert seen == [("mma+norm", False, (2,))] + head


def test_fma_keeps_the_fused_kernels(fake_cupy: types.ModuleType,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []
    be = backend("fma", seen, monkeypatch)
    assert be.use_stack and not be.arithmetic.endswith("-mma")
    be.linear(dev((8, 576)), "l0.o")
    be.mlp_in(dev((8, 576)), 0)
    be.mlp_in(dev((40, 576)), 0)
    assert seen == [("fma", False), ("rows", 1), ("norm", "l0.ffn_norm"), ("chunks", 1)]


def test_cli_flag_reaches_the_settings_and_refuses_other_orders(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        generate_settings) -> None:
    from crucible import cli_generate

    for argv, env, want in ((["--gemm", "mma"], None, "mma"), ([], None, "mma"),
                            ([], "fma", "fma"), (["--gemm", "fma"], "mma", "fma"),
                            (["--gemm", "mma"], "fma", "mma")):
        monkeypatch.delenv("CRUCIBLE_GEMM", raising=False)
        if env is not None:
            monkeypatch.setenv("CRUCIBLE_GEMM", env)
        assert generate_settings(argv).gemm == want, (argv, env)
    with pytest.raises(SystemExit):
        cli_generate.generate_parser().parse_args(["--prompt", "x", "--gemm", "tf32"])
    assert "invalid choice: 'tf32'" in capsys.readouterr().err


def test_serve_takes_the_flag_too() -> None:
    from crucible.cli_serve import parser as serve_parser

    assert serve_parser().parse_args(["--gemm", "mma"]).gemm == "mma"
    assert serve_parser().parse_args([]).gemm is None  # CRUCIBLE_GEMM or mma decides


def test_launch_plans_are_made_once_and_launch_what_the_rules_say(
        fake_cupy: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """linear_mma's launch (kernel, grid, block, shared memory, codes array, extra
    arguments) per the rules, for the tile, rows and one-row forms and a fused rows form; a
    repeated call reuses its plan (lm._plan: no second kernel lookup), and a changed
    ROW1_ROUTED is a new plan, never a stale one."""
    made, launched = [], []
    monkeypatch.setattr(lm, "kernel", lambda *a, **kw: made.append((a, kw)) or (a, tuple(
        sorted(kw.items()))))
    monkeypatch.setattr(lm, "launch", lambda fn, grid, block, args, smem=0, pdl=False:
                        launched.append((fn, grid, block, args, smem)))
    lm._plan.cache_clear()
    qkv = DeviceWeight(None, dev((960, 576), np.int8), dev((960,)), dev((960, 576), np.uint16))
    for m, wb in ((300, False), (1024, True)):  # the tile kernel; bf16 codes from 512 rows
        x, out = dev((m, 576)), dev((m, 960))
        lm.linear_mma(x, qkv, out)
        mt, nt, wm, wn = form = lm.pick_form(m, 960, 576)
        fn, grid, block, args, smem = launched[-1]
        assert fn[0][0] == form and grid == (960 // (8 * nt * wn), -(-m // (16 * mt * wm)))
        assert block == (32 * wm * wn,) and smem == 0 and len(args) == 8
        assert (args[1] is qkv.wb) == wb and (args[1] is qkv.w) == (not wb)
        assert args[0] is x and args[4] is out and [int(v) for v in args[5:]] == [m, 960, 576]
    n_made = len(made)
    lm.linear_mma(dev((300, 576)), qkv, dev((300, 960)))  # the same shape: the plan again
    assert len(made) == n_made and launched[-1][1:3] == launched[0][1:3]
    x, out = dev((40, 576)), dev((40, 960))  # the rows kernel: K blocks over warps
    lm.linear_mma(x, qkv, out)
    nt, warps = lm.pick_form(40, 960, 576)
    fn, grid, block, args, smem = launched[-1]
    assert grid == (960 // (8 * nt), 3) and block == (32 * min(warps, 9),)
    assert smem == lm.row_smem(576, nt) and len(args) == 10 and int(args[8]) == 0
    head = DeviceWeight(None, dev((49152, 576), np.int8), dev((49152,)))
    norm = dev((576,))
    lm.linear_mma(dev((1, 576)), head, dev((1, 49152)), norm=norm, eps=1e-5)  # one-row form
    fn, grid, block, args, smem = launched[-1]
    assert fn[0][0] == (2,) and block == (lm.ROW1_THREADS,) and smem == 384 * 9
    assert args[7] is norm and [int(v) for v in args[5:7]] == [49152, 576]
    lm.linear_mma(dev((1, 576)), head, dev((1, 49152)))
    assert launched[-1][0][0][0] == (2,)
    monkeypatch.setattr(lm, "ROW1_ROUTED", False)  # the same call, now the tile kernel
    lm.linear_mma(dev((1, 576)), head, dev((1, 49152)))
    assert len(launched[-1][0][0][0]) == 4
    lm._plan.cache_clear()
