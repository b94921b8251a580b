#!/usr/bin/env bash
# The GPU checks of linear_wgmma's wide forms (two warpgroups a CTA sharing x's stages:
# cuda/linear_wgmma.cu, WG = 2; not routed), in the order they gate each other. Random
# weights: no model. About six minutes.
#
#     OUT=/some/dir bash bench/wgmma_wide_checks.sh
#
# 1. tests/test_gpu_linear_wgmma.py: every form, the wide ones included, against linear_mma
#    bit for bit at M 1-1,024, and the SwiGLU epilogue's wide forms against linear_mma_rows'.
# 2. bench/wgmma_wide.py: the chat steps' mixed graphs with the wide forms routed against
#    the shipped route, logits bit for bit every round (before the sanitizers: whether the
#    forms are worth routing decides what else they need).
# 3. compute-sanitizer memcheck and racecheck over bench/wgmma_gemm.py --quick (every tile
#    form at M 37 and 65 on the four layer shapes) and the wide SwiGLU forms at M 65.
# 4. bench/wgmma_gemm.py: each form alone against linear_mma at M 16-2,048.
. "$(dirname "$0")/device_run.sh"
gpu_tests wgmma-wide tests/test_gpu_linear_wgmma.py
python3 bench/wgmma_wide.py --rounds 3 --replays 20 --json "$OUT/wgmma-wide.json" 2>&1 | tail -9
(cd bench && sanitize wgmma-wide python3 wgmma_gemm.py --quick)
sanitize wgmma-wide-swiglu python3 -c '
import cupy as cp, numpy as np
from crucible.kernels import linear_wgmma as lw
from crucible.kernels.device_weight import upload_weight
rng = np.random.default_rng(0)
wd = upload_weight(rng.integers(-127, 128, (3072, 576)).astype(np.int8),
                   (0.001 + 0.02 * rng.random(3072)).astype(np.float32), bf16=True, wgmma=True)
x = cp.asarray(rng.standard_normal((65, 576)).astype(np.float32))
outs = [lw.linear_wgmma_swiglu(x, wd, cp.empty((65, 1536), cp.float32), form=f)
        for f in ((64, 3), (64, 3, 2), (32, 3, 2))]
assert all(bool(cp.array_equal(o.view(cp.uint32), outs[0].view(cp.uint32))) for o in outs)
print("wide SwiGLU forms at M 65: the one-warpgroup bits")'
(cd bench && python3 wgmma_gemm.py --rounds 3 --json "$OUT/wgmma-gemm-wide.json" 2>&1 | tail -28)
