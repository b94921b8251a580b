"""A reduced attention check on a real GPU (skipped without CuPy or a device)."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.checks.attention_cases import Case
from crucible.checks.attention_suite import HETERO
from crucible.kernels.variants import Variant, all_variants, parse_variant

cp = pytest.importorskip("cupy")
try:
    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:  # noqa: BLE001 - no driver counts as no GPU
    HAVE_GPU = False

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="no CUDA device")]

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
