"""Which int8 GEMM forms a decode step's graph should take, timed in the replay itself: the
step captured under each routing of linear_mma's forms, against the shipped routing
(linear_mma.pick_form), in one process, with the logits compared bit for bit (every form
gives the same bits: cuda/linear_mma.cu's order; a difference is a failure here).

Why in the replay: pick_form's table came from GEMMs timed one at a time
(bench/gemm-mma-h200.json); in a decode graph each GEMM is one link of a PDL chain, where
what counts is how soon its last CTA finishes once the one before it has
(bench/launch_bound.py: the GEMMs are 56% of the 64-row step, ~7 us a launch).

A route names the rows kernel's form (NT, warps) for each weight kind at these rows; the
SwiGLU GEMM needs an even NT (fused_form raises an odd one by one, as it does for the
shipped route). Past 128 rows, where the warpgroup kernel runs gate/up, the routes
swiglu-off and swiglu-all take its SwiGLU epilogue nowhere and everywhere, against the
shipped linear_wgmma.SWIGLU_SKIP_ROWS. Random weights of the default model's shapes, int8,
mma order.

    python3 bench/route_forms.py [--rows 64] [--routes shipped,nt1,nt4,down16]
        [--rounds 5] [--replays 50] [--json bench/route-forms.json]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Callable, Iterator

import numpy as np
from common import stat, write_json
from graph_variants import Variants

# route -> {weight kind: rows form (NT, warps)}; a kind not named keeps the shipped form.
# o and down share N = 576 and differ in K (576 / 1,536), so "down" keys on K.
ROUTES: dict[str, dict[str, tuple[int, int]]] = {
    "shipped": {},
    "nt1": {"qkv": (1, 12), "o": (1, 12), "down": (1, 12)},
    "nt4": {"qkv": (4, 12), "o": (4, 12), "down": (4, 12), "gate_up": (4, 12)},
    "down16": {"down": (2, 16)},
    "nt1-down16": {"qkv": (1, 12), "o": (1, 12), "down": (1, 16)},
    "gate_up4": {"gate_up": (4, 12)},
    "swiglu-off": {},
    "swiglu-all": {},
}
# route -> linear_wgmma.SWIGLU_SKIP_ROWS while it is captured (else the shipped one).
SWIGLU_SKIPS: dict[str, tuple[tuple[int, int], ...]] = {
    "swiglu-off": ((0, 1 << 30),), "swiglu-all": ()}


def kind(n: int, k: int) -> str | None:
    if n == 576:
        return "down" if k == 1536 else "o"
    return {960: "qkv", 3072: "gate_up"}.get(n)


@contextlib.contextmanager
def routed(name: str) -> Iterator[None]:
    """pick_form answers the route's form for its weight kinds, and swiglu_route skips the
    route's rows, while a graph is captured."""
    import crucible.kernels.linear_mma as lm
    import crucible.kernels.linear_wgmma as lw

    route = ROUTES[name]
    real: Callable[[int, int, int], tuple[int, ...]] = lm.pick_form
    skip = lw.SWIGLU_SKIP_ROWS

    def pick(m: int, n: int, k: int) -> tuple[int, ...]:
        form = route.get(kind(n, k) or "")
        return form if form is not None and lm.fits(n, k, form) else real(m, n, k)

    lm.pick_form = pick
    lm._plan.cache_clear()  # plans are cached per shape: none may outlive its routing
    lw.SWIGLU_SKIP_ROWS = SWIGLU_SKIPS.get(name, skip)
    try:
        yield
    finally:
        lm.pick_form = real
        lm._plan.cache_clear()
        lw.SWIGLU_SKIP_ROWS = skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--routes", default=",".join(ROUTES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--json", default="bench/route-forms.json")
    args = p.parse_args(argv)
    names = tuple(dict.fromkeys(("shipped",) + tuple(args.routes.split(","))))
    if any(n not in ROUTES for n in names):
        p.error(f"--routes: each of {', '.join(ROUTES)}")
    v = Variants(args.rows, names, lambda n, runner: routed(n), "route_forms")

    def check() -> None:
        # Each runner's pool holds the same histories and the replays write the same rows'
        # K/V, so every route's logits must be the shipped route's, bit for bit.
        want = v.logits("shipped")
        for n in names[1:]:
            if not np.array_equal(v.logits(n), want):
                raise SystemExit(f"route_forms: route {n}'s logits differ from shipped's")

    times = v.time(args.rounds, args.replays, check)
    results = {}
    for n, ts in times.items():
        ratio = [a / b for a, b in zip(times["shipped"], ts)]
        results[n] = {"route": {k: list(v) for k, v in ROUTES[n].items()},
                      "step_ms": stat(ts), "shipped_over_this": stat(ratio),
                      "tok_per_s": args.rows / (stat(ts)["median"] / 1e3)}
        print(f"{n:>12}: {stat(ts)['median']:.3f} ms a step ({results[n]['tok_per_s']:,.0f} tok/s),"
              f" shipped/this x{stat(ratio)['median']:.3f} [{stat(ratio)['min']:.3f}-"
              f"{stat(ratio)['max']:.3f}]", file=sys.stderr, flush=True)
    write_json(args.json, {
        "command": "python3 bench/route_forms.py "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": v.device, "rows": args.rows, "logits_identical": True, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
