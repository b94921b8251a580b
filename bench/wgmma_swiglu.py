"""linear_wgmma's SwiGLU epilogue (cuda/linear_wgmma.cu, EPI) against what it replaces: the
routed gate/up GEMM (linear_wgmma) then swiglu_rows, on the default model's gate/up shape
(3,072 x 576), bits compared at every M, then timed as graphs of back-to-back launches
(bench/gemm_bench.py's timer, rounds alternating), us per pair of launches against one.

    PYTHONPATH=$PWD python3 bench/wgmma_swiglu.py [--rounds 5] [--json bench/x.json]
    compute-sanitizer --tool memcheck python3 bench/wgmma_swiglu.py --quick

--quick: M 65 and 130 (a row tail, two row tiles), bits only, no timing.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from common import stat, write_json
from gemm_bench import measure

from crucible.kernels import linear_mma as lm
from crucible.kernels import linear_wgmma as lw
from crucible.kernels.device_weight import upload_weight
from crucible.kernels.model_ops import flat_launch

N, K = 3072, 576
MS = (128, 256, 512, 960, 1024, 2048)
QUICK_MS = (65, 130)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import cupy as cp

    rng = np.random.default_rng(0)
    codes = rng.integers(-127, 128, (N, K)).astype(np.int8)
    wd = upload_weight(codes, (0.001 + 0.02 * rng.random(N)).astype(np.float32), bf16=True,
                       wgmma=True)
    ms = QUICK_MS if args.quick else MS
    x = cp.asarray(rng.standard_normal((max(ms), K)).astype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    result: dict[str, Any] = {"command": "python3 bench/wgmma_swiglu.py "
                              + " ".join(argv if argv is not None else sys.argv[1:]),
                              "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                              "shape": [N, K], "m": {}}
    for m in ms:
        form = lw.swiglu_route(m, wd) or lw.SWIGLU_FORMS[0]
        gu = cp.empty((m, N), cp.float32)
        sep = cp.full((m, N // 2), cp.nan, cp.float32)
        fused = cp.full((m, N // 2), cp.nan, cp.float32)

        def separate() -> None:
            lm.linear_mma(x[:m], wd, gu, wgmma=True)
            flat_launch("swiglu_rows", sep.size, (gu, sep, np.int32(N // 2), np.int64(sep.size)))

        def epilogue() -> None:
            lw.linear_wgmma_swiglu(x[:m], wd, fused, form=form)

        separate()
        epilogue()
        cp.cuda.Device().synchronize()
        same = bool(cp.array_equal(sep.view(cp.uint32), fused.view(cp.uint32)))
        entry: dict[str, Any] = {"form": list(form), "identical": same}
        if not same:
            raise SystemExit(f"wgmma_swiglu: M={m}: the epilogue's bits differ")
        if not args.quick:
            t = measure({"separate": separate, "epilogue": epilogue}, args.rounds, 2.0, stream)
            ratio = [a / b for a, b in zip(t["separate"], t["epilogue"])]
            entry.update({"separate_us": stat([v * 1e3 for v in t["separate"]]),
                          "epilogue_us": stat([v * 1e3 for v in t["epilogue"]]),
                          "separate_over_epilogue": stat(ratio)})
            print(f"M {m:5d} {form}: separate {entry['separate_us']['median']:7.1f} us, "
                  f"epilogue {entry['epilogue_us']['median']:7.1f} us, "
                  f"x{entry['separate_over_epilogue']['median']:.3f}", flush=True)
        result["m"][str(m)] = entry
    print(f"bits identical at M {', '.join(result['m'])}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
