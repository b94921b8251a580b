"""attn_decode on small cases, for compute-sanitizer (memcheck and racecheck):

    compute-sanitizer --tool memcheck python3 scripts/sanitize_decode.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_decode.py

Only the decode module is compiled (the attention module's every variant is slow to load
under the sanitizer). Each case runs attn_decode<1> and <3> with L2 prefetch budgets of
none, part of the history and all of it; every run must give the same bits (prefetches
change no arithmetic, the heads per CTA change who computes what, not how), and agree with
a float64 numpy attention to 1e-5. Exit status 1 on any mismatch.
"""

from __future__ import annotations

import sys

import numpy as np

from crucible.checks.attention_cases import LAYER, Case, build
from crucible.kernels.variants import decode_smem_bytes

CASES = (Case("decode-8", 9, 3, ((0, 1), (15, 1), (16, 1), (130, 1), (255, 1), (256, 1),
                                 (300, 1), (700, 1)), pages="interleaved", seed=11),
         Case("decode-1", 9, 3, ((413, 1),), seed=12))


def reference(b) -> np.ndarray:
    """float64 causal attention of each one-row segment over its history."""
    hd, g = 64, b.case.n_heads // b.case.n_kv_heads
    out = np.zeros(b.q.shape, np.float64)
    for i, (row, _, start, t) in enumerate(b.segments):
        n = start + 1
        pages = b.page_tables[t][: -(-n // 16)]
        k = b.k_pool[pages, LAYER].reshape(-1, b.k_pool.shape[-1])[:n].astype(np.float64)
        v = b.v_pool[pages, LAYER].reshape(-1, b.v_pool.shape[-1])[:n].astype(np.float64)
        for h in range(b.case.n_heads):
            kv = slice((h // g) * hd, (h // g + 1) * hd)
            s = k[:, kv] @ b.q[row, h * hd:(h + 1) * hd].astype(np.float64) / 8.0
            p = np.exp(s - s.max())
            out[row, h * hd:(h + 1) * hd] = (p / p.sum()) @ v[:, kv]
    return out


def main() -> int:
    import cupy as cp

    from crucible.checks.attention_check import to_device
    from crucible.kernels.attention import decode_args
    from crucible.kernels.launch import launch
    from crucible.kernels.loader import decode_kernel, ensure_dynamic_smem

    bad = 0
    for case in CASES:
        b = build(case)
        d = to_device(b)
        want = reference(b)
        first = None
        for g in (1, 3):
            fn = decode_kernel(g)
            smem = decode_smem_bytes(b.capacity, g)
            ensure_dynamic_smem(fn, smem)
            for prefetch in (0, 100, 2**31 - 1):
                out = cp.full(d["q"].shape, cp.nan, dtype=cp.float32)
                args = decode_args(d["q"], d["k"], d["v"], LAYER, d["segs"], d["tables"], out,
                                   case.n_heads, case.n_kv_heads, b.capacity,
                                   heads_per_cta=g, prefetch_len=prefetch)
                launch(fn, (case.n_heads // g, b.segments.shape[0], 1), (256, 1, 1), args,
                       shared_mem=smem)
                got = cp.asnumpy(out)
                first = got if first is None else first
                same = np.array_equal(got.view(np.uint32), first.view(np.uint32))
                close = bool(np.isfinite(got).all()) and float(np.abs(got - want).max()) < 1e-5
                bad += not (same and close)
                print(f"{case.name} G={g} prefetch={prefetch}: "
                      f"{'same bits' if same else 'BITS DIFFER'}, "
                      f"{'close to float64' if close else 'FAR FROM float64'}")
        first = None
    print("RESULT:", "PASS" if bad == 0 else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
