"""Whether wgmma's f32 sums carry mma.sync's bits: the gate for a tensor-core GEMM built on
the warpgroup MMA that keeps the mma order (docs/numerics.md) bit for bit.

    python3 bench/wgmma_probe.py [--cases 512] [--json bench/wgmma-probe-h200.json]
    python3 bench/wgmma_probe.py --compile-only      # nvcc -arch=sm_90a here, no GPU needed

Why: the mma GEMMs are bound by what each warp issues besides its mmas (x's split, the
codes' conversion, fragment loads; docs/throughput.md), and by the registers of their three
part accumulators. wgmma reads B from shared memory and issues one instruction a warpgroup
for a 64 x N x 16 step, so it removes most of that, if its sums are mma.sync's.

bench/wgmma_probe.cu runs, per case, a chain of S steps D = A_s B_s + D from C, with
wgmma.m64n8k16 (A in registers, B in shared memory) and with mma.sync.m16n8k16, on the same
operands, under both readings of the descriptor's offset fields (``mode``). The case kinds:
  parts    x's exact three-part bf16 split (hi, mid, lo of N(0, 1) x 10^U(-2, 2) values)
           against int8 codes as bf16, 4 steps from 0: a part accumulator of the mma order;
  parts_c  the same from a nonzero C (a running total's magnitude);
  wide     bf16 values over 2^-40 .. 2^40 with random signs, C as wide;
  cancel   rows whose products cancel pairwise but for one term 2^-20 of the others, so
           the exact sum is tiny against its terms (alignment and truncation inside the
           sum show here first).
Reported per mode: the largest error against float64 relative to sum |terms| (a mode that
reads B wrongly shows errors near 1), per kind the elements whose wgmma and mma.sync bits
differ, and an index case (row r picks k = r % 16, code[n][k] = k + 16 n) whose output
names the (k, n) each row and column really got, to diagnose a layout that is wrong. The verdict is ``same_bits`` for the mode whose products are right. Also
recorded (``nvrtc``): whether NVRTC, the product's compiler, builds the probe for sm_90a
(through CuPy's RawModule, and directly to a cubin) and runs it to the nvcc build's bits.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from common import write_json

SRC = Path(__file__).with_name("wgmma_probe.cu")
KINDS = ("parts", "parts_c", "wide", "cancel")
STEPS = 4


def build(out_dir: Path) -> Path:
    """The probe as an sm_90a cubin (wgmma needs the arch-specific target, which the
    product's NVRTC path does not ask for)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("wgmma_probe: nvcc not found on PATH (it builds the sm_90a cubin)")
    cubin = out_dir / "wgmma_probe.cubin"
    subprocess.run([nvcc, "-arch=sm_90a", "-cubin", "-o", str(cubin), str(SRC)], check=True)
    return cubin


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 values already exact in bf16 -> their bf16 bit patterns."""
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def split3(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cuda/mma_common.cuh's cru_split3: x = hi + mid + lo exactly."""
    x = np.asarray(x, np.float32)
    hi = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    r = (x - hi).astype(np.float32)
    mid = (r.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    lo = (r - mid).astype(np.float32)
    return hi, mid, lo


def wide_bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    mant = rng.uniform(1.0, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    v = (mant * np.exp2(rng.integers(-40, 41, shape))).astype(np.float32)
    return bf16_bits((v.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32))


def make_case(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [64, 16 S] and B [S, 8, 16] as bf16 bits, C [64, 8] f32."""
    k = 16 * STEPS
    codes = rng.integers(-127, 128, (STEPS, 8, 16)).astype(np.float32)
    if kind in ("parts", "parts_c"):
        x = (rng.standard_normal((64, k)) * 10.0 ** rng.uniform(-2, 2, (64, 1))).astype(np.float32)
        part = split3(x)[rng.integers(0, 3)]
        a, b = bf16_bits(part), bf16_bits(codes)
        c = np.zeros((64, 8), np.float32)
        if kind == "parts_c":
            c = (rng.standard_normal((64, 8)) * np.abs(x).sum(1, keepdims=True) * 30).astype(np.float32)
        return a, b, c
    if kind == "wide":
        a, b = wide_bf16(rng, (64, k)), wide_bf16(rng, (STEPS, 8, 16))
        c = bf16_value(wide_bf16(rng, (64, 8))).astype(np.float32)
        return a, b, c
    # cancel: each row holds +v and -v in neighbouring k (the same code there), plus one small term.
    v = rng.standard_normal((64, k // 2)).astype(np.float32)
    v = (v.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    a_val = np.empty((64, k), np.float32)
    a_val[:, 0::2], a_val[:, 1::2] = v, -v
    a_val[:, 6] *= np.float32(2.0 ** -20)  # its partner gone: the row's sum is this term alone
    a_val[:, 7] = 0.0
    b_val = np.repeat(codes[:, :, 0::2], 2, axis=2)  # equal codes on each +v, -v pair
    return bf16_bits(a_val), bf16_bits(b_val), np.zeros((64, 8), np.float32)


def reference(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 A B + C and sum |terms| per element."""
    av = bf16_value(a).astype(np.float64)
    bv = bf16_value(b).astype(np.float64).transpose(0, 2, 1).reshape(16 * STEPS, 8)
    return av @ bv + c, np.abs(av) @ np.abs(bv) + np.abs(c)


def nvrtc_direct(cp: Any) -> Any:
    """The probe through NVRTC itself (cupy.cuda.nvrtc: -arch=sm_90a straight to a cubin),
    loaded as a module: a way for the product to build wgmma kernels without nvcc."""
    from cupy.cuda import function
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError:  # older layouts
        from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(SRC.read_text(), "wgmma_probe.cu", (), ())
    try:
        try:
            # NVRTC searches no system directory: cuda_bf16.h comes from nvcc's toolkit
            include = Path(shutil.which("nvcc") or "/").resolve().parent.parent / "include"
            nvrtc.compileProgram(prog, ("-arch=sm_90a", "-std=c++17", f"-I{include}"))
        except nvrtc.NVRTCError as e:
            raise RuntimeError(nvrtc.getProgramLog(prog)[-500:]) from e
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    mod = function.Module()
    mod.load(cubin)
    return mod.get_function("probe")


def nvrtc_check(cp: Any, fn: Any, case: tuple[np.ndarray, ...]) -> dict[str, Any]:
    """Whether NVRTC builds wgmma for sm_90a, two ways: CuPy's RawModule given
    ``-arch=sm_90a`` (the product's path, kernels/source.py, adds its own -arch) and NVRTC
    directly (``nvrtc_direct``); each run to the nvcc build's bits."""
    return {"raw_module": _nvrtc_way(cp, fn, case, lambda: cp.RawModule(
                code=SRC.read_text(), options=("-arch=sm_90a",)).get_function("probe")),
            "direct": _nvrtc_way(cp, fn, case, lambda: nvrtc_direct(cp))}


def _nvrtc_way(cp: Any, fn: Any, case: tuple[np.ndarray, ...], make: Any) -> dict[str, Any]:
    try:
        alt = make()
        outs = []
        for f in (fn, alt):
            a, b, c = (cp.asarray(v[None]) for v in case)
            d_wg, d_mma = cp.zeros((1, 64, 8), cp.float32), cp.zeros((1, 64, 8), cp.float32)
            f((1,), (128,), (a, b, c, d_wg, d_mma, np.int32(STEPS), np.int32(0)))
            outs.append(d_wg.get())
        return {"builds": True, "same_as_nvcc": bool(np.array_equal(outs[0].view(np.uint32),
                                                                   outs[1].view(np.uint32)))}
    except Exception as e:  # noqa: BLE001 - any failure is the answer being recorded
        return {"builds": False, "error": f"{type(e).__name__}: {str(e)[:500]}"}


def index_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step (the rest zero) where row r picks k = r % 16 and code[n][k] = k + 16 n (exact
    small integers), so D[r][n] = r % 16 + 16 n when A's and B's layouts are read as this
    file assumes; any other value names the (k, n) that row r and column n really got."""
    a = np.zeros((64, 16 * STEPS), np.float32)
    a[np.arange(64), np.arange(64) % 16] = 1.0
    b = np.zeros((STEPS, 8, 16), np.float32)
    b[0] = np.arange(16)[None, :] + 16 * np.arange(8)[:, None]
    return bf16_bits(a), bf16_bits(b), np.zeros((64, 8), np.float32)


def index_map(cp: Any, fn: Any, mode: int) -> dict[str, Any]:
    """The index case under one descriptor reading: whether it is right, and the first rows
    of what wgmma returned (the layout's diagnosis when it is not)."""
    a, b, c = (cp.asarray(v[None]) for v in index_case())
    d_wg, d_mma = cp.zeros((1, 64, 8), cp.float32), cp.zeros((1, 64, 8), cp.float32)
    fn((1,), (128,), (a, b, c, d_wg, d_mma, np.int32(STEPS), np.int32(mode)))
    want = (np.arange(64) % 16)[:, None] + 16 * np.arange(8)[None, :]
    wg, mm = d_wg.get()[0], d_mma.get()[0]
    return {"wgmma_right": bool(np.array_equal(wg, want)),
            "mma_sync_right": bool(np.array_equal(mm, want)),
            "wgmma_rows_0_17": wg[:18].astype(int).tolist()}


def run(cases: int, seed: int) -> dict[str, Any]:
    import cupy as cp

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        fn = cp.RawModule(path=str(build(Path(tmp)))).get_function("probe")
    out: dict[str, Any] = {"steps": STEPS, "cases_per_kind": cases, "modes": {}}
    data = {kind: [make_case(kind, rng) for _ in range(cases)] for kind in KINDS}
    for mode in (0, 1):
        rec: dict[str, Any] = {"lbo_bytes": 128 if mode == 0 else 256,
                               "sbo_bytes": 256 if mode == 0 else 128, "kinds": {}}
        for kind in KINDS:
            a = np.stack([x[0] for x in data[kind]])
            b = np.stack([x[1] for x in data[kind]])
            c = np.stack([x[2] for x in data[kind]])
            d_wg = cp.zeros((cases, 64, 8), cp.float32)
            d_mma = cp.zeros_like(d_wg)
            fn((cases,), (128,), (cp.asarray(a), cp.asarray(b), cp.asarray(c), d_wg, d_mma,
                                  np.int32(STEPS), np.int32(mode)))
            wg, mm = d_wg.get(), d_mma.get()
            err_wg = err_mma = 0.0
            for i in range(cases):
                ref, mag = reference(a[i], b[i], c[i])
                scale = np.maximum(mag, 1e-300)
                err_wg = max(err_wg, float(np.max(np.abs(wg[i] - ref) / scale)))
                err_mma = max(err_mma, float(np.max(np.abs(mm[i] - ref) / scale)))
            differ = int(np.count_nonzero(wg.view(np.uint32) != mm.view(np.uint32)))
            rec["kinds"][kind] = {"elements": int(wg.size), "bits_differ": differ,
                                  "max_rel_err_wgmma": err_wg, "max_rel_err_mma_sync": err_mma}
            print(f"mode {mode} {kind:8s} differ {differ:7d} of {wg.size}  err wgmma "
                  f"{err_wg:.3g}  mma.sync {err_mma:.3g}", flush=True)
        rec["index_case"] = index_map(cp, fn, mode)
        rec["products_right"] = all(k["max_rel_err_wgmma"] < 1e-5 for k in rec["kinds"].values())
        rec["same_bits"] = all(k["bits_differ"] == 0 for k in rec["kinds"].values())
        out["modes"][str(mode)] = rec
    out["nvrtc"] = nvrtc_check(cp, fn, data["parts"][0])
    right = [m for m, r in out["modes"].items() if r["products_right"]]
    out["verdict"] = ({"descriptor_mode": right[0], "same_bits": out["modes"][right[0]]["same_bits"]}
                      if right else {"descriptor_mode": None, "same_bits": None,
                                     "note": "neither reading of the descriptor gave the right products"})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.compile_only:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"built {build(Path(tmp)).name}")
        return
    result = run(args.cases, args.seed)
    result["command"] = "python3 bench/wgmma_probe.py " + " ".join(sys.argv[1:])
    print(result["verdict"])
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
