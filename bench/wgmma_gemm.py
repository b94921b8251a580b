"""wgmma GEMMs in the mma order against the routed tensor-core GEMM (kernels/linear_mma.py):
their bits, their error against float64, their speed. The kernels: bench/wgmma_gemm.cu (a
register double buffer, bench only, built here with nvcc) and the product's
cuda/linear_wgmma.cu forms (a cp.async pipeline) and cuda/linear_wgmma_rows.cu forms (K
blocks over warpgroups, for few rows), through kernels/linear_wgmma.py's own NVRTC sm_90a
build, as CRUCIBLE_WGMMA=1 runs them.

    PYTHONPATH=$PWD python3 bench/wgmma_gemm.py [--rounds 5] [--json bench/wgmma-gemm-h200.json]
    python3 bench/wgmma_gemm.py --compile-only     # nvcc -arch=sm_90a, no GPU needed
    compute-sanitizer --tool racecheck python3 bench/wgmma_gemm.py --quick

Run it after bench/wgmma_probe.py: if wgmma sums a step as mma.sync does, this kernel
should give linear_mma's bits at every shape and M, residual or not. For both readings of
the shared-memory descriptor (``mode``) and every kernel (``KERNELS``: BN columns a CTA,
and the pipeline's stages), at the
default model's four layer shapes and M in ``EXACT_MS``: elements whose bits differ from
linear_mma's and the largest error relative to scale * sum |x q| (a wrong reading shows
errors near 1). Then, for the mode with the right products, every kernel against
linear_mma at ``TIME_MS`` (bench/gemm_bench.py's timer: graphs of back-to-back launches,
rounds alternating), us per launch and the ratio over linear_mma, min-max over rounds.
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

from common import stat, write_json

HERE = Path(__file__).resolve().parent
SOURCES = ("wgmma_gemm.cu",)
# name: (kind, BN, stages or warpgroups): "bench" bench/wgmma_gemm.cu's register double
# buffer, "tile" linear_wgmma.cu's forms, "rows" linear_wgmma_rows.cu's (K over warpgroups)
KERNELS = {"gemm_32": ("bench", 32, 0), "gemm_64": ("bench", 64, 0),
           "pipe_16_4": ("tile", 16, 4), "pipe_32_3": ("tile", 32, 3),
           "pipe_32_4": ("tile", 32, 4), "pipe_64_3": ("tile", 64, 3),
           "rows_16_3": ("rows", 16, 3), "rows_16_2": ("rows", 16, 2)}
ROWS_TIMED = 256  # the rows kernels are timed up to here (a CTA walks 64 rows at a time)
LAYERS = ("qkv", "o", "gate_up", "down")
EXACT_MS = (1, 37, 64, 256, 1024)
QUICK_MS = (37, 65)  # --quick (under compute-sanitizer): a row tail, and two row tiles
TIME_MS = (16, 64, 128, 256, 512, 1024, 2048)


def build(out_dir: Path) -> dict[str, Path]:
    """Each source as an sm_90a cubin (wgmma needs the arch-specific target)."""
    from crucible.kernels.source import cuda_source_dir

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("wgmma_gemm: nvcc not found on PATH (it builds the sm_90a cubins)")
    out = {}
    for src in SOURCES:
        out[src] = out_dir / src.replace(".cu", ".cubin")
        # --ftz=true: CuPy builds every RawModule so (kernels/source.py CUPY_IMPLIED_OPTIONS)
        subprocess.run([nvcc, "-arch=sm_90a", "-cubin", "--ftz=true", f"-I{cuda_source_dir()}",
                        "-o", str(out[src]), str(HERE / src)], check=True)
    return out


def weight(n: int, k: int, rng: np.random.Generator) -> tuple[Any, np.ndarray, np.ndarray]:
    """Random int8 codes and scales uploaded with their bf16 copies (DeviceWeight.wb, .wg)."""
    from crucible.kernels.device_weight import upload_weight

    codes = np.clip(np.rint(rng.standard_normal((n, k)) * 40), -127, 127).astype(np.int8)
    scale = (rng.random(n) * 0.02 + 0.001).astype(np.float32)
    return upload_weight(codes, scale, bf16=True, wgmma=True), codes, scale


def run(rounds: int, seed: int, quick: bool = False) -> dict[str, Any]:
    import cupy as cp

    from gemm_bench import SHAPES, measure
    from gemm_mma_bench import activations, errors

    from crucible.kernels import linear_mma as lm
    from crucible.kernels import linear_wgmma as lw

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        # RawModule loads its file on the first get_function: fetch them while it exists
        mod = cp.RawModule(path=str(build(Path(tmp))["wgmma_gemm.cu"]))
        fns = {name: mod.get_function(f"wgmma_gemm_{bn}")
               for name, (kind, bn, _) in KERNELS.items() if kind == "bench"}

    def wgmma(kname: str, mode: int, x: Any, wd: Any, y: Any, res: Any) -> Any:
        m, k = x.shape
        n = wd.shape[0]
        kind, bn, extra = KERNELS[kname]
        if kind == "tile":
            return lw.linear_wgmma(x, wd, y, res, form=(bn, extra), mode=mode)
        if kind == "rows":
            return lw.linear_wgmma_rows(x, wd, y, res, form=(bn, extra), mode=mode)
        fns[kname]((n // bn, -(-m // 64)), (128,),
                   (x, wd.wb, wd.scale, res if res is not None else np.uint64(0), y,
                    np.int32(m), np.int32(n), np.int32(k), np.int32(mode)))
        return y

    out: dict[str, Any] = {"exact": {}, "timing": {}}
    weights = {name: weight(*SHAPES[name][:2], rng) for name in LAYERS}
    right: dict[int, bool] = {0: True, 1: True}
    for name in LAYERS:
        wd, codes, scale = weights[name]
        n, k, has_res = SHAPES[name]
        for m in (QUICK_MS if quick else EXACT_MS):
            xh = activations(m, k, rng)
            x = cp.asarray(xh)
            resh = rng.standard_normal((m, n)).astype(np.float32) if has_res else None
            res = cp.asarray(resh) if has_res else None
            ref = lm.linear_mma(x, wd, cp.empty((m, n), cp.float32), res)
            for mode in (0, 1):
                for kname in KERNELS:
                    y = wgmma(kname, mode, x, wd, cp.full((m, n), np.nan, cp.float32), res)
                    differ = int(cp.count_nonzero(y.view(cp.uint32) != ref.view(cp.uint32)))
                    err = errors(y, xh, codes, scale, resh)
                    right[mode] = right[mode] and err["max"] < 1e-5
                    key = f"{name} M={m} mode={mode} {kname}"
                    out["exact"][key] = {"bits_differ": differ, "elements": m * n, "error": err}
                    print(f"{key:34s} differ {differ:8d} of {m * n:8d}  max err "
                          f"{err['max']:.3g}", flush=True)
    modes = [mode for mode, ok in right.items() if ok]
    out["mode_with_right_products"] = modes[0] if modes else None
    out["same_bits"] = bool(modes) and all(
        v["bits_differ"] == 0 for key, v in out["exact"].items() if f"mode={modes[0]} " in key)
    if not modes or quick:
        return out
    stream = cp.cuda.Stream(non_blocking=True)
    for name in LAYERS:
        wd, _, _ = weights[name]
        n, k, has_res = SHAPES[name]
        for m in TIME_MS:
            x = cp.asarray(activations(m, k, rng))
            res = cp.asarray(rng.standard_normal((m, n)).astype(np.float32)) if has_res else None
            y = cp.empty((m, n), cp.float32)
            cands = {"linear_mma": lambda: lm.linear_mma(x, wd, y, res)}
            for kname, (kind, _, _) in KERNELS.items():
                if kind != "rows" or m <= ROWS_TIMED:
                    cands[kname] = (lambda kname=kname: wgmma(kname, modes[0], x, wd, y, res))
            ms = measure(cands, rounds, 2.0, stream)
            rec = {c: stat([t * 1e3 for t in v]) for c, v in ms.items()}
            for c in cands:
                if c != "linear_mma":
                    rec[f"{c} / linear_mma time"] = stat(
                        [a / b for a, b in zip(ms[c], ms["linear_mma"])])
            out["timing"][f"{name} M={m}"] = rec
            print(f"{name:8s} M={m:5d} " + "  ".join(
                f"{c} {rec[c]['median']:.2f} us" for c in cands), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="two small M a shape and no timing: a run under compute-sanitizer")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.compile_only:
        with tempfile.TemporaryDirectory() as tmp:
            print("built " + ", ".join(p.name for p in build(Path(tmp)).values()))
        return
    result = run(args.rounds, args.seed, args.quick)
    result["command"] = "python3 bench/wgmma_gemm.py " + " ".join(sys.argv[1:])
    print({k: result[k] for k in ("mode_with_right_products", "same_bits")})
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
