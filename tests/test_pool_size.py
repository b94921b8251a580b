"""Sizing the KV pool: strict sizes, the CPU default, the CUDA memory rule and its errors."""

from __future__ import annotations

import pytest

from crucible.engine.sizes import parse_bytes
from crucible.engine.pool_size import (GiB, page_bytes, pool_size,
                                       scratch_bytes)
from crucible.engine.settings import Settings
from crucible.errors import ConfigError
from crucible.model.tiny import tiny_config

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, n_layers=30, n_heads=9, n_kv_heads=3,
               head_dim=64, ffn_size=1536, max_context=8192)


@pytest.mark.parametrize("text,want", [
    ("40GiB", 40 << 30), ("1.5 GB", 1_500_000_000), ("512MiB", 512 << 20), ("3kb", 3000),
    ("0.000000001GB", 1), ("1.25GiB", 5 << 28), ("0.5KiB", 512),
    ("7B", 7), ("2TiB", 2 << 40)])
def test_sizes(text: str, want: int) -> None:
    assert parse_bytes(text) == want


@pytest.mark.parametrize("text", ["40", "-1GiB", "40%", "40GiBs", "1e9B", "GiB", "",
                                  "0GiB", "0.0000000001GB", "1,5GB", "4 0GB"])
def test_bad_sizes_name_the_setting(text: str) -> None:
    with pytest.raises(ConfigError, match="kv_cache_memory must be"):
        parse_bytes(text)


def test_page_bytes_of_the_default_model() -> None:
    cfg = tiny_config(**SMOLLM2)
    assert page_bytes(cfg) == 2 * 30 * 16 * 192 * 4 == 737_280


def test_cpu_default_is_two_contexts_and_reported() -> None:
    cfg = tiny_config(**{**SMOLLM2, "max_context": 2048})
    got = pool_size(Settings(), cfg, "cpu", None)
    assert got.num_pages == 256
    assert "256 pages" in got.summary and "two full contexts" in got.summary
    assert pool_size(Settings(num_pages=77), cfg, "cuda", (80 * GiB, 141 * GiB)).num_pages == 77
    with pytest.raises(ConfigError, match="on the CPU give num_pages"):
        pool_size(Settings(kv_cache_memory=GiB), cfg, "cpu", None)


def test_cuda_takes_a_fraction_of_what_is_free_after_scratch() -> None:
    cfg = tiny_config(**SMOLLM2)
    s = Settings()
    free = 100 * GiB
    room = free - scratch_bytes(cfg, s)
    assert 0 < scratch_bytes(cfg, s) < 10 * GiB
    got = pool_size(s, cfg, "cuda", (free, 141 * GiB))
    assert got.num_pages == int(0.9 * room) // page_bytes(cfg)
    half = pool_size(s.replace(gpu_memory_fraction=0.5), cfg, "cuda", (free, 141 * GiB))
    assert half.num_pages == int(0.5 * room) // page_bytes(cfg) < got.num_pages
    tiny = tiny_config(**{**SMOLLM2, "n_layers": 2, "max_context": 512})
    capped = pool_size(s, tiny, "cuda", (free, 141 * GiB))
    assert capped.num_pages == 512 * 32 and "capped at max_running" in capped.summary
    fixed = pool_size(s.replace(kv_cache_memory=40 * GiB), cfg, "cuda", (free, 141 * GiB))
    assert fixed.num_pages == 40 * GiB // page_bytes(cfg)
    assert "kv_cache_memory 40.00 GiB" in fixed.summary


def test_over_capacity_and_too_small_pools_are_refused() -> None:
    cfg = tiny_config(**SMOLLM2)
    with pytest.raises(ConfigError, match="kv_cache_memory of 200.00 GiB does not fit"):
        pool_size(Settings(kv_cache_memory=200 * GiB), cfg, "cuda", (100 * GiB, 141 * GiB))
    with pytest.raises(ConfigError, match="less than one full context"):
        pool_size(Settings(), cfg, "cuda", (GiB * 5 // 2, 141 * GiB))
