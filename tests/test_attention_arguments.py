"""paged_attention's host checks: the one-expression fast path accepts exactly what the
detailed checks accept, and every bad argument still gets its own message."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.kernels.attention import _arguments_ok, validate_arguments

F32, I32 = np.float32, np.int32


def good() -> dict:
    return dict(q=np.zeros((5, 9 * 64), F32), k_pool=np.zeros((8, 2, 16, 3 * 64), F32),
                v_pool=np.zeros((8, 2, 16, 3 * 64), F32), layer=1,
                segments=np.array([[0, 4, 0, 0], [4, 1, 9, 1]], I32),
                page_tables=np.zeros((2, 3), I32), out=np.zeros((5, 9 * 64), F32),
                n_heads=9, n_kv_heads=3, max_chunk=4, score_capacity=256)


BAD = [
    (dict(q=np.zeros((5, 9 * 64), np.float64)), "q must be float32"),
    (dict(out=np.zeros((5, 8 * 64), F32)), "out shape"),
    (dict(k_pool=np.zeros((8, 2, 16, 3 * 64), F32)[:, :, :, ::2]), "k_pool must be"),
    (dict(segments=np.zeros((2, 3), I32)), "segments must be"),
    (dict(page_tables=np.zeros((2, 3), np.int64)), "page_tables must be int32"),
    (dict(n_heads=8), "multiple of n_kv_heads"),
    (dict(layer=2), "layer 2 outside"),
    (dict(max_chunk=6), "max_chunk 6 outside"),
    (dict(score_capacity=300), "multiple of 256"),
    (dict(v_pool=np.zeros((9, 2, 16, 3 * 64), F32)), "shapes differ"),
]


def test_good_arguments_pass_both() -> None:
    assert _arguments_ok(**good())
    validate_arguments(**good())


@pytest.mark.parametrize("change,message", BAD)
def test_each_bad_argument_is_named(change: dict, message: str) -> None:
    args = {**good(), **change}
    assert not _arguments_ok(**args)
    with pytest.raises(ValueError, match=message):
        validate_arguments(**args)
