"""Variant names, env parsing and the launch plan's hand-over rules (CPU only)."""

from __future__ import annotations

import pytest

from crucible.errors import ConfigError
from crucible.kernels.variants import (
    DEFAULT_VARIANT, Variant, all_variants, parse_variant, plan_launch, score_capacity,
    tiled_smem_bytes, valid_names)

H200_OPTIN = 232448


def test_every_family_name_round_trips() -> None:
    names = [v.name for v in all_variants()]
    assert len(names) == 28 and len(set(names)) == 28
    for q in (1, 2, 4):
        for k in (16, 32, 64):
            for family in ("exact", "online"):
                assert parse_variant(f"{family}-q{q}-k{k}") == Variant(family, q, k)
            assert parse_variant(f"exact-q{q}-k{k}-cache") == Variant("exact", q, k, True)
    assert parse_variant("reference") == Variant("reference")


def test_default_and_alias() -> None:
    assert DEFAULT_VARIANT == "exact-q4-k64"
    assert parse_variant("exact") == parse_variant("exact-q4-k64") == Variant("exact", 4, 64)
    # The environment variable's parsing (blank, alias, a diagnostic name): test_settings.py.


@pytest.mark.parametrize("bad", ["exact-q8-k64", "flash", "exact-q4", "online-q4-k128", "",
                                 "online-q4-k64-cache"])
def test_unknown_names_list_the_valid_ones(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_variant(bad)
    message = str(err.value)
    assert repr(bad) in message
    for name in valid_names():
        assert name in message


def test_online_is_never_exact() -> None:
    assert all(v.is_exact == (v.family != "online") for v in all_variants())


def test_capacity_rounds_up_to_256() -> None:
    assert [score_capacity(n) for n in (1, 256, 257, 1024, 1025)] == [256, 256, 512, 1024, 1280]
    with pytest.raises(ValueError):
        score_capacity(0)


def test_shared_bytes_follow_the_documented_formula() -> None:
    v = Variant("exact", 4, 64)
    assert tiled_smem_bytes(v, 4, 1024) == 4 * (64 * 68 + 16 * 64 + 96 + 16 * 1024)
    # online scores are tile sized, so capacity does not matter
    o = Variant("online", 4, 64)
    assert tiled_smem_bytes(o, 4, 256) == tiled_smem_bytes(o, 4, 8192)
    # the page-table cache adds one int per 16 positions of capacity
    assert tiled_smem_bytes(Variant("exact", 4, 64, True), 4, 1024) == \
        tiled_smem_bytes(v, 4, 1024) + 4 * 64


def _plan(name: str, heads: int, kv: int, capacity: int, head_dim: int = 64):
    return plan_launch(parse_variant(name), n_heads=heads, n_kv_heads=kv, head_dim=head_dim,
                       capacity=capacity, smem_limit=H200_OPTIN)


def test_default_runs_as_requested_when_it_fits() -> None:
    for heads, kv in ((12, 3), (9, 3), (4, 4), (8, 4), (16, 2)):
        plan = _plan("exact", heads, kv, 1024)
        assert plan.variant == Variant("exact", 4, 64) and plan.reason is None
        assert plan.threads == 32 * 4 * (heads // kv)


def test_large_capacity_hands_over_to_fewer_rows_then_reference() -> None:
    plan = _plan("exact", 12, 3, 4096)
    assert plan.variant == Variant("exact", 2, 64) and "fewer rows" in plan.reason
    assert plan.smem_bytes <= H200_OPTIN
    plan = _plan("exact", 16, 2, 8192)  # G = 8: even one row does not fit
    assert plan.variant.family == "exact" or plan.variant == Variant("reference")
    cached = _plan("exact-q4-k64-cache", 12, 3, 4096)
    assert cached.variant == Variant("exact", 2, 64, True)
    huge = _plan("exact", 16, 2, 32768)
    assert huge.variant == Variant("reference") and huge.reason
    with pytest.raises(ValueError, match="exceeds"):
        _plan("reference", 12, 3, 65536)


def test_unsupported_geometry_runs_reference() -> None:
    assert _plan("exact", 18, 2, 256).variant == Variant("reference")  # G = 9
    assert _plan("online-q2-k32", 12, 3, 256, head_dim=128).variant == Variant("reference")
    assert _plan("reference", 12, 3, 256).reason is None


def test_startup_report_names_the_variant_and_warns_for_online() -> None:
    from crucible.kernels.variants import startup_report

    assert "exact-q4-k64" in startup_report(parse_variant("exact"))
    assert "DIAGNOSTIC" in startup_report(parse_variant("online-q4-k64"))
    assert "DIAGNOSTIC" not in startup_report(parse_variant("reference"))


def test_commands_explain_a_missing_cupy_instead_of_crashing(capsys) -> None:
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("CuPy is installed here")
    from crucible.checks import attention_bench, attention_check

    assert attention_check.main(["--fuzz", "1"]) == 2
    assert attention_bench.main(["--shapes", "single-1"]) == 2
    assert "needs CuPy" in capsys.readouterr().err


def test_the_prefetching_instance_at_group_3_of_exact_q4_k64() -> None:
    """exact-q4-k64 at group 3 takes attn_exact's prefetching instance when asked, at every
    capacity that instance fits (timed faster even where the plain one fits three CTAs an
    SM: bench/prefetch-attention-h100.json). Never at another group, tile or family."""
    from crucible.kernels.variants import plan_launch

    def pf(name: str, capacity: int, heads: int = 9, kv: int = 3, on: bool = True) -> bool:
        return plan_launch(parse_variant(name), n_heads=heads, n_kv_heads=kv, head_dim=64,
                           capacity=capacity, smem_limit=232448, prefetch=on).prefetch

    assert all(pf("exact-q4-k64", c) for c in (256, 1024, 1280, 1792, 4352))
    assert not pf("exact-q4-k64", 1792, on=False)  # off unless asked (variants.PREFETCH)
    assert not pf("exact-q4-k64", 1792, heads=12)  # group 4: 512 threads
    assert not pf("exact-q4-k32", 1792) and not pf("exact-q4-k64-cache", 1792)
    assert not pf("online-q4-k64", 1792) and not pf("exact-q2-k64", 1792)
    assert not pf("exact-q4-k64", 4608)  # q4 no longer fits: the q2 hand-over
