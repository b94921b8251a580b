"""The tree-order replay the exact kernels rely on, checked in numpy float32 (CPU only).

The reference sums a warp's 32 per-lane QK partials with an xor butterfly (offsets
16, 8, 4, 2, 1). The exact kernels instead let one thread add the same partials in the
order of ``cru_tree_dots``: leaf i of the staged row holds lane bitrev5(i); four leaves
combine as (l0+l1)+(l2+l3), then chunks pairwise. Equal bits need equal operand pairs at
every node; these tests replay both orders with IEEE float32 adds.
"""

from __future__ import annotations

import numpy as np


def bitrev5(i: int) -> int:
    return int(f"{i:05b}"[::-1], 2)


def butterfly(p: np.ndarray) -> np.float32:
    """Lane 0's value after the xor add tree (every lane ends equal)."""
    v = p.astype(np.float32).copy()
    for off in (16, 8, 4, 2, 1):
        v = (v + v[np.arange(32) ^ off]).astype(np.float32)
    assert np.all(v.view(np.uint32) == v[0].view(np.uint32))
    return v[0]


def tree_order(p: np.ndarray) -> np.float32:
    """The order cru_tree_dots uses, on lanes staged at leaf slot bitrev5(lane)."""
    leaves = p.astype(np.float32)[[bitrev5(i) for i in range(32)]]
    chunks = [(leaves[4 * c] + leaves[4 * c + 1]) + (leaves[4 * c + 2] + leaves[4 * c + 3])
              for c in range(8)]
    v4a = (chunks[0] + chunks[1]) + (chunks[2] + chunks[3])
    v4b = (chunks[4] + chunks[5]) + (chunks[6] + chunks[7])
    return np.float32(v4a + v4b)


def _wide(rng: np.random.Generator) -> np.ndarray:
    # mixed magnitudes make every rounding step matter
    return (rng.standard_normal(32) * 10.0 ** rng.integers(-6, 7, 32)).astype(np.float32)


def test_tree_order_equals_the_butterfly_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    for _ in range(3000):
        p = _wide(rng)
        assert butterfly(p).view(np.uint32) == tree_order(p).view(np.uint32)


def test_a_plain_sequential_sum_is_not_the_same_computation() -> None:
    """Negative control: the check above can fail; a left-to-right sum differs often."""
    rng = np.random.default_rng(1)
    differ = 0
    for _ in range(300):
        p = _wide(rng)
        seq = np.float32(0.0)
        for x in p:
            seq = np.float32(seq + x)
        differ += int(seq.view(np.uint32) != butterfly(p).view(np.uint32))
    assert differ > 30


def test_slot_of_each_dimension_matches_the_kernel_mapping() -> None:
    """cru_tree_slot(d) = 2*bitrev5(d & 31) + (d >> 5): a permutation of 0..63."""
    slots = [2 * bitrev5(d & 31) + (d >> 5) for d in range(64)]
    assert sorted(slots) == list(range(64))
    assert slots[0] == 0 and slots[32] == 1 and slots[16] == 2 and slots[48] == 3


def decode_node_order(p: np.ndarray) -> np.float32:
    """attn_decode's order (cru_dec_dots): q is staged at slot 8*(d & 7) + (d >> 3), so one
    level-2 node i < 8 reads lanes i, i+8, i+16, i+24 as (lo.x, lo.y, lo.z, lo.w) and adds
    (lo.x + lo.z) + (lo.y + lo.w); nodes i and i+4 meet, then 0+2 and 1+3, then the root."""
    slot = [8 * (d & 7) + (d >> 3) for d in range(64)]
    staged = np.empty(64, dtype=np.int64)
    staged[slot] = np.arange(64)  # staged[s] = the dimension held at slot s
    leaf = p.astype(np.float32)
    b = []
    for i in range(8):
        lanes = staged[8 * i:8 * i + 4]  # lo = dims i, i+8, i+16, i+24 (their lanes)
        assert list(staged[8 * i + 4:8 * i + 8]) == [x + 32 for x in lanes]  # hi = + 32
        l0, l8, l16, l24 = leaf[lanes]
        b.append(np.float32(np.float32(l0 + l16) + np.float32(l8 + l24)))
    c = [np.float32(b[i] + b[i + 4]) for i in range(4)]
    return np.float32(np.float32(c[0] + c[2]) + np.float32(c[1] + c[3]))


def test_decode_node_order_equals_the_butterfly_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    for _ in range(3000):
        p = _wide(rng)
        assert butterfly(p).view(np.uint32) == decode_node_order(p).view(np.uint32)
