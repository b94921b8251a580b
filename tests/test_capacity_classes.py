"""Score-capacity classes (kernels/capacity.py) and the mixed graphs' keys that use them, on
the host: the driver's occupancy answer is modelled from shared memory (an H100's and
H200's 228 KiB an SM, 1 KiB reserved a CTA) and the register bounds the kernels have at the
default model's group: three CTAs an SM for attn_decode and the plain attn_exact, two for
its prefetching instance (80 registers, 384 threads; variants.PREFETCH)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from crucible.backend.cupy_mixed_graphs import MAX_SLICES, MixedGraphs
from crucible.kernels import variants
from crucible.kernels.capacity import CapacityClasses, OwnedClasses
from crucible.kernels.variants import (
    LaunchPlan,
    decode_static_bytes,
    parse_variant,
    plan_launch,
)
from crucible.step.batch import SegmentSpec, build_packed_batch

SM_SMEM, RESERVED, OPTIN = 233472, 1024, 232448
VARIANT = parse_variant("exact-q4-k64")


def occupancy(plan: LaunchPlan) -> int:
    static = decode_static_bytes(plan.decode_heads) if plan.decode else 0
    return min(2 if plan.prefetch else 3, SM_SMEM // (plan.smem_bytes + static + RESERVED))


def classes(ceiling: int = 8192, spread: bool = False) -> CapacityClasses:
    return CapacityClasses(9, 3, VARIANT, ceiling, OPTIN, 132, occupancy, spread)


def plan(capacity: int, decode: bool = False, rows: int = 0) -> LaunchPlan:
    return plan_launch(VARIANT, n_heads=9, n_kv_heads=3, head_dim=64, capacity=capacity,
                       smem_limit=OPTIN, decode=decode, rows=rows, sm_count=132,
                       prefetch=variants.PREFETCH)


@pytest.mark.parametrize("decode,rows", [(False, 0), (True, 512), (True, 16)])
def test_a_class_is_the_widest_capacity_at_the_same_occupancy(decode: bool, rows: int) -> None:
    c = classes()  # the occupancy rule (no spread: the default)
    for asked in range(1, 8193, 97):
        got = c.decode(asked, rows) if decode else c.slices(asked)
        first = plan(-(-asked // 256) * 256, decode, rows)
        assert got % 256 == 0 and asked <= got <= 8192, (asked, got)
        same = plan(got, decode, rows)
        assert same.variant == first.variant and occupancy(same) == occupancy(first)
        if got + 256 <= 8192:  # one step wider loses a CTA an SM or changes the kernel
            wider = plan(got + 256, decode, rows)
            assert (wider.variant != first.variant or wider.decode_heads != first.decode_heads
                    or occupancy(wider) < occupancy(first)), (asked, got)


def test_the_default_models_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slices' launch keeps two CTAs an SM up to 1,792 positions and one up to 4,352
    (then q2 tiles); with the plain attn_exact instance, three up to 1,024. The decode rows'
    keeps three up to 3,328. The control: the powers of two these replace (2,048 and 4,096)
    hold fewer CTAs an SM than the classes do."""
    c = classes()
    assert variants.PREFETCH  # the shipped default: two CTAs an SM at any capacity
    assert [c.slices(x) for x in (256, 1024, 1025, 1792, 1793, 4352)] == \
        [1792, 1792, 1792, 1792, 4352, 4352]
    monkeypatch.setattr(variants, "PREFETCH", False)
    assert [classes().slices(x) for x in (1024, 1025, 1792, 1793, 4352)] == \
        [1024, 1792, 1792, 4352, 4352]
    monkeypatch.undo()
    assert plan(c.slices(4353)).variant.rows == 2  # q4 no longer fits: another kernel
    assert c.decode(1, 512) == c.decode(2048, 512) == c.decode(3328, 512) == 3328
    assert c.decode(3329, 512) > 3328
    assert occupancy(plan(2048)) == 1 < occupancy(plan(c.slices(1280))) == 2
    assert occupancy(plan(4096, True, 512)) == 2 < occupancy(plan(c.decode(2600, 512), True, 512))
    assert classes(ceiling=1536).slices(1280) == 1536  # never past the context


def graphs(with_classes: bool, spread: bool = False) -> MixedGraphs:
    g = MixedGraphs.__new__(MixedGraphs)  # host side only: no device, no stream
    g.width, g.scratch = 512, 9000
    owner = SimpleNamespace(cfg=SimpleNamespace(n_heads=9, n_kv_heads=3), variant=VARIANT)
    g.classes = OwnedClasses(owner, 512) if with_classes else None
    if g.classes is not None:  # the modelled device's, kept: same geometry and variant
        g.classes.classes = classes(spread=spread)
    return g


def test_mixed_keys_take_each_launchs_class() -> None:
    """Chat steps late in their conversations: decodes at ~2,500 positions beside slices
    ending past 1,024. Each launch gets its own class; powers of two (no owner) give the
    capacities that cost CTAs. Under the spread rule a cohort's slices, which fill several
    waves, keep two CTAs an SM (1,792); a lone joiner's grid is its graph's tile list
    (192 rows: 64 tiles, 192 CTAs), one wave at two an SM, so it keeps 1,792 too, where a
    launch of 96 CTAs, one wave at one an SM, takes the widest class that holds one."""
    def step(decode_start: int, slice_start: int, slices: int, n: int) -> object:
        dec = [SegmentSpec(f"d{i}", [1], decode_start, list(range(200)), [0]) for i in range(48)]
        return build_packed_batch(dec + [SegmentSpec(f"p{j}", [1] * n, slice_start,
                                                     list(range(200)), [n - 1])
                                         for j in range(slices)])

    cohort, joiner = step(2500, 1000, 16, 60), step(2500, 1000, 1, 84)
    for batch in (cohort, joiner):
        assert MixedGraphs.key(graphs(True), batch)[4:] == (3328, 1792)
        assert MixedGraphs.key(graphs(False), batch)[4:] == (4096, 2048)
    assert MixedGraphs.key(graphs(True, spread=True), cohort)[4:] == (3328, 1792)
    assert MixedGraphs.key(graphs(True, spread=True), joiner)[4:] == (3328, 1792)
    assert classes(spread=True).slices(1280, 4, 32) == 4352  # 96 CTAs
    # short histories: one decode class; the slices' floor class, two CTAs an SM with the
    # prefetching instance (three, up to 1,024, with the plain one)
    assert MixedGraphs.key(graphs(True), step(300, 0, 16, 60))[4:] == (3328, 1792)
    g = graphs(True, spread=True)
    w, rows, _ = g._sizes(MixedGraphs.key(g, joiner))
    # the table width covers every history; a row per one-row entry and slice, the scratch
    assert w == 3328 // 16 and rows == MixedGraphs.key(g, joiner)[0] + MAX_SLICES + 1


def test_one_wave_grids_spread() -> None:
    """Under the spread rule a grid that fits one wave at one CTA an SM takes the widest
    capacity that still holds one; without it (the default), the occupancy class."""
    c = classes(spread=True)
    assert c.slices(1280, 128, 1) == 4352  # 3 x 32 CTAs < 132 SMs
    assert c.slices(1280, 128, 2) == 1792  # 192 CTAs: two an SM hold them in one wave
    assert c.slices(1280, 128, 16) == 1792  # 1,536: waves either way
    assert classes().slices(1280, 128, 1) == 1792
    assert c.decode(2600, 40) > 3328 and occupancy(plan(c.decode(2600, 40), True, 40)) >= 1
    assert occupancy(plan(c.decode(2600, 64), True, 64)) == 2  # 192 CTAs: 2 an SM suffice


def test_decode_graphs_widen_past_the_stack_under_the_spread_rule() -> None:
    """Under the spread rule, decode buckets past the batch-1 stack replay at their grid's
    class (64 rows: 192 CTAs, two an SM hold them); bucket 1 keeps graph_capacity's, which
    the stack's attention (W_o staged beside the scores) is fitted to; without the rule or
    an owner, graph_capacity's everywhere."""
    from crucible.backend.cupy_graphs import DecodeGraphs, graph_capacity

    g = DecodeGraphs.__new__(DecodeGraphs)
    g.ceiling = 8192
    assert g.capacity_class(300, 64) == graph_capacity(300, 8192) == 2048
    g.classes = graphs(True).classes
    assert g.capacity_class(300, 64) == 2048 and g.capacity_class(2600, 256) == 3072
    g.classes = graphs(True, spread=True).classes
    assert g.capacity_class(300, 1) == 2048
    wide = g.capacity_class(300, 64)
    assert wide > 2048 and occupancy(plan(wide, True, 64)) == 2 < occupancy(plan(2048, True, 64))
    assert g.capacity_class(2600, 256) == 3328  # 768 CTAs: waves either way, three an SM
