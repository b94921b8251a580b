"""cuda/linear_mma_pipe.cu: linear_mma.cu's tile GEMM (same forms, same bits) with x and the
codes staged through shared memory by a cp.async pipeline of S stages, and K groups (KG
copies of the CTA's warps over interleaved K blocks). ``linear_mma`` launches it for a tile
form where ``pick_pipe`` says so, or where a caller names (S, KG).
"""

from __future__ import annotations

import functools
from typing import Any


from crucible.kernels.launch import launch
from crucible.kernels.loader import ensure_dynamic_smem
from crucible.kernels.source import cached_module

# (MT, NT, WM, WN, S, KG): the built instantiations.
PIPE_FORMS: tuple[tuple[int, int, int, int, int, int], ...] = (
    (1, 4, 2, 2, 4, 1), (1, 4, 2, 2, 3, 2), (1, 4, 2, 2, 2, 3), (1, 2, 1, 4, 3, 1),
    (2, 4, 2, 2, 3, 1), (2, 4, 4, 1, 3, 1),
)
# Where the tile kernel's form takes the pipeline, as (S, KG) by form: none until measured.
ROUTE: dict[tuple[int, int, int, int], tuple[int, int]] = {}
ROUTE_MIN_ROWS = 128  # below, the rows kernel runs (linear_mma.pick_form)
ROUTED = True  # benches switch it off to time the plain tile kernel


def _name(p: tuple[int, ...]) -> str:
    return "linear_mma_pipe<{}, {}, {}, {}, {}, {}>".format(*p)


@functools.cache
def kernel(p: tuple[int, ...]) -> Any:
    return cached_module("linear_mma_pipe.cu", tuple(_name(f) for f in PIPE_FORMS)).get_function(
        _name(p))


def smem_bytes(p: tuple[int, ...]) -> int:
    """PipeSmem<...>::BYTES of linear_mma_pipe.cu."""
    mt, nt, wm, wn, s, kg = p
    stage = 16 * mt * wm * 256 + 8 * nt * wn * 64
    vals = (kg - 1) * wm * wn * mt * nt * 4 * 32 if kg > 1 else 0
    return kg * s * stage + 4 * vals


def pick_pipe(form: tuple[int, ...], m: int) -> tuple[int, int] | None:
    """(S, KG) for a tile form at M rows, or None for linear_mma.cu's own kernel."""
    if not ROUTED or len(form) != 4 or m < ROUTE_MIN_ROWS:
        return None
    return ROUTE.get(tuple(form))  # type: ignore[arg-type]


def launch_pipe(form: tuple[int, ...], sk: tuple[int, int], args: tuple[Any, ...], m: int,
                n: int, pdl: bool) -> None:
    """One launch of the pipelined form ``form`` + ``sk`` over linear_mma's arguments."""
    p = tuple(form) + tuple(sk)
    if p not in PIPE_FORMS:
        raise ValueError(f"linear_mma: no pipelined form {p} is built (PIPE_FORMS)")
    mt, nt, wm, wn, _, kg = p
    fn = kernel(p)
    nbytes = smem_bytes(p)
    ensure_dynamic_smem(fn, nbytes)
    launch(fn, (n // (8 * nt * wn), -(-m // (16 * mt * wm))), (32 * wm * wn * kg,), args,
           nbytes, pdl=pdl)
