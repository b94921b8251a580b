"""A reduced attention check on a real GPU (skipped without CuPy or a device)."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.checks.attention_cases import Case
from crucible.checks.attention_suite import HETERO
from crucible.kernels.variants import Variant, all_variants, parse_variant

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

CASES = [
    Case("single-129", 12, 3, ((0, 129),), seed=1),
    Case("hetero", 9, 3, HETERO, pages="interleaved", seed=2),
    Case("g8-prefix", 16, 2, ((33, 70),), data="huge", seed=3),
    Case("g1-decodes", 4, 4, ((5, 1), (700, 1), (0, 3)), data="zeros", seed=4),
    # 64 decode rows: attn_decode<3>, the default model's group per CTA (histories around
    # one QK sweep of 256 keys and two V tiles of 128, plus the edges)
    Case("g3-decodes-64", 9, 3,
         tuple((int(s), 1) for s in np.random.default_rng(6).integers(129, 261, 58))
         + tuple((s, 1) for s in (0, 127, 128, 255, 256, 600)), pages="interleaved", seed=6),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_variant_matches_the_reference(case: Case) -> None:
    from crucible.checks.attention_check import Tally, check_case

    variants = list(all_variants())
    tallies = {v.name: Tally() for v in variants}
    check_case(case, variants, tallies)
    for name, t in tallies.items():
        assert t.comparisons > 0 and t.failures == 0 and t.oracle_failures == 0, name
        if parse_variant(name).is_exact:  # reference and every exact variant: same bits
            assert t.max_abs == 0.0, name


def test_online_is_a_real_negative_control() -> None:
    """Online reorders f32 work, so on a long history its bits must differ somewhere."""
    from crucible.checks.attention_cases import build
    from crucible.checks.attention_check import to_device, run_variant

    d = to_device(build(Case("long", 12, 3, ((0, 700),), seed=5)))
    ref, _ = run_variant(Variant("reference"), d)
    exact, _ = run_variant(Variant("exact", 4, 64), d)
    online, _ = run_variant(Variant("online", 2, 32), d)
    assert bool((exact.view(cp.uint32) == ref.view(cp.uint32)).all())
    assert not bool((online.view(cp.uint32) == ref.view(cp.uint32)).all())
    assert float(cp.abs(online - ref).max()) < 1e-4


# Decode rows interleaved with prefill slices, as the scheduler packs a busy step: the split
# launch (decode kernel + tiled kernel) must give the single launch's and the reference's
# bits; nothing may stay unwritten (outputs start as NaN).
MIXED = Case("mixed", 9, 3, ((300, 1), (0, 70), (811, 1), (5, 1), (64, 33), (1000, 1),
                             (129, 1)), pages="interleaved", seed=7)


def _split(segs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    one = segs[:, 1] == 1
    return np.ascontiguousarray(segs[one]), np.ascontiguousarray(segs[~one])


def _capacity(segs: np.ndarray) -> int:
    from crucible.kernels.variants import score_capacity

    return score_capacity(int((segs[:, 2] + segs[:, 1]).max()))


def test_mixed_step_split_matches_one_launch() -> None:
    from crucible.checks.attention_cases import LAYER, build
    from crucible.checks.attention_check import run_variant, to_device
    from crucible.kernels.attention import paged_attention_mixed

    host = build(MIXED)
    d = to_device(host)
    single, multi = _split(host.segments)
    ref, _ = run_variant(Variant("reference"), d)
    one, plan = run_variant(parse_variant("exact-q4-k64"), d)
    assert not plan.decode  # the single launch is the tiled kernel over every segment
    out = cp.full(d["q"].shape, cp.nan, dtype=cp.float32)
    tiled, dec = paged_attention_mixed(
        d["q"], d["k"], d["v"], LAYER, cp.asarray(single), cp.asarray(multi), d["tables"], out,
        n_heads=9, n_kv_heads=3, multi_max_chunk=int(multi[:, 1].max()),
        single_capacity=_capacity(single), multi_capacity=_capacity(multi))
    assert dec.decode and not tiled.decode
    assert bool(cp.isfinite(out).all())
    assert bool((out.view(cp.uint32) == one.view(cp.uint32)).all())
    assert bool((out.view(cp.uint32) == ref.view(cp.uint32)).all())
    # A mixed graph's fixed-size lists: empty entries (chunk_len 0) past the live ones
    # launch CTAs that must exit without writing anything, and the chunk bound is the graph's
    # bucket (above the live 70 rows, at most the step's token count).
    pad = np.zeros((5, 4), np.int32)
    out2 = cp.full(d["q"].shape, cp.nan, dtype=cp.float32)
    paged_attention_mixed(
        d["q"], d["k"], d["v"], LAYER, cp.asarray(np.concatenate([single, pad])),
        cp.asarray(np.concatenate([multi, pad[:2]])), d["tables"], out2, n_heads=9,
        n_kv_heads=3, multi_max_chunk=int(d["q"].shape[0]), single_capacity=_capacity(single),
        multi_capacity=_capacity(multi))
    assert bool((out2.view(cp.uint32) == out.view(cp.uint32)).all())
    # Negative control: the online variant over the same step differs from those bits.
    online, _ = run_variant(Variant("online", 2, 32), d)
    assert not bool((online.view(cp.uint32) == out.view(cp.uint32)).all())


def test_the_prefetching_instance_gives_the_reference_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chat-like launches past 1,024 positions (a cohort of slices after long histories, a
    lone joiner, a long prompt) and short ones (capacity 256, where the plain instance fits
    three CTAs an SM): with variants.PREFETCH on, exact-q4-k64 takes attn_exact's
    prefetching instance (the plan says so) and must give the reference's bits; off, the
    plain instance. The online control above shows the comparison can fail."""
    from crucible.checks.attention_cases import build
    from crucible.checks.attention_check import run_variant, to_device
    from crucible.kernels import variants

    starts = np.random.default_rng(8).integers(900, 1300, 16)
    cases = (Case("chat-cohort", 9, 3, tuple((int(s), 60) for s in starts),
                  pages="interleaved", seed=8),
             Case("chat-joiner", 9, 3, ((1400, 84),), seed=9),
             Case("long-prompt", 9, 3, ((0, 1500),), seed=10),
             Case("short-slices", 9, 3, ((0, 64), (100, 40), (7, 1)), seed=11))
    for case in cases:
        d = to_device(build(case))
        ref, _ = run_variant(Variant("reference"), d)
        for on in (True, False):
            monkeypatch.setattr(variants, "PREFETCH", on)
            out, plan = run_variant(Variant("exact", 4, 64), d)
            assert plan.prefetch == on, case.name
            assert bool((out.view(cp.uint32) == ref.view(cp.uint32)).all()), (case.name, on)
