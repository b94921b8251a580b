"""Which batches the attention check and bench run: fixed edge cases, fuzz, bench shapes.

Fixed cases cover page boundaries on both sides (15/16/17 ... 255/256/257), context edges
(941/1023/1024), long prompts up to and past the default tile's shared-memory capacity (so
the hand-over to fewer rows runs), zero / page-aligned / unaligned prefixes, packed
heterogeneous slices, many single-row decodes (64 at once: the grouped decode launch, also
on the default model's typical histories with a huge score spread), G = 1, 2, 3, 4, 8 (and
9, which must hand over to the reference), and adversarial data (huge score spread, rising
maxima, zeros).
"""

from __future__ import annotations

import numpy as np

from crucible.checks.attention_cases import DATA_MODES, PAGE_MODES, Case

FIXTURE = (12, 3)  # the test fixture: G = 4
DEFAULT_MODEL = (9, 3)  # SmolLM2-135M: G = 3
GEOMETRIES = ((4, 4), (8, 4), (9, 3), (12, 3), (16, 2))  # G = 1, 2, 3, 4, 8
HETERO = ((0, 17), (63, 64), (255, 129), (512, 257))

SINGLE_LENGTHS = (1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257,
                  511, 512, 941, 1023, 1024, 2048, 3000, 4096)
PREFIXED = ((5, 20), (16, 16), (17, 40), (100, 1), (255, 2), (512, 300), (960, 64),
            (1000, 24), (7, 1), (4000, 96))


def fixed_cases() -> list[Case]:
    h, kv = FIXTURE
    cases = [Case(f"single-{n}", h, kv, ((0, n),), seed=n) for n in SINGLE_LENGTHS]
    cases += [Case(f"model-single-{n}", *DEFAULT_MODEL, ((0, n),), seed=7 + n)
              for n in (1, 17, 64, 255, 512, 1024, 8192)]
    cases += [Case(f"prefix-{s}+{n}", h, kv, ((s, n),), seed=s + n) for s, n in PREFIXED]
    cases += [
        Case("hetero-interleaved", h, kv, HETERO, pages="interleaved", seed=11),
        Case("decodes-16", h, kv, tuple((int(s), 1) for s in
                                         np.random.default_rng(5).integers(0, 1500, 16)),
             pages="interleaved", seed=12),
        # Decode launch (attn_decode) edges: QK sweeps of 256 keys, V tiles of 128.
        Case("decodes-tile-edges", *DEFAULT_MODEL,
             tuple((s, 1) for s in (0, 126, 127, 128, 255, 256, 383, 1000, 4095, 8191)),
             seed=14),
        Case("mixed-prefill-decode", h, kv, ((0, 100), (50, 1), (300, 1), (0, 33), (1023, 1)),
             pages="interleaved", seed=13),
    ]
    # Wide decode steps: 64 rows make attn_decode serve a KV head's whole group per CTA
    # (G = 2, 3, 4; G = 8 is past what it is built for and stays at one head per CTA).
    wide = tuple((int(s), 1) for s in np.random.default_rng(15).integers(0, 1300, 58)) + \
        tuple((s, 1) for s in (0, 127, 128, 255, 256, 1023))
    cases += [Case(f"decodes-64-g{nh // nkv}", nh, nkv, wide, pages="interleaved", seed=16)
              for nh, nkv in GEOMETRIES]
    # The grouped launch on the default model's typical decode histories (130..261: one QK
    # sweep, or a second for a few keys; 2-3 V tiles), with most exponentials underflowing.
    model = tuple((int(s), 1) for s in np.random.default_rng(17).integers(129, 261, 64))
    cases.append(Case("decodes-64-g3-huge", *DEFAULT_MODEL, model, data="huge", seed=18))
    for nh, nkv in GEOMETRIES + ((18, 2),):
        g = f"g{nh // nkv}-{nh}/{nkv}"
        cases += [
            Case(f"{g}-single-1", nh, nkv, ((0, 1),), seed=21),
            Case(f"{g}-single-33", nh, nkv, ((0, 33),), seed=22),
            Case(f"{g}-single-257", nh, nkv, ((0, 257),), seed=23),
            Case(f"{g}-prefix-70+50", nh, nkv, ((70, 50),), seed=24),
            Case(f"{g}-hetero", nh, nkv, HETERO, pages="interleaved", seed=25),
        ]
    for data in DATA_MODES[1:]:
        for nh, nkv in (FIXTURE, DEFAULT_MODEL):
            cases.append(Case(f"{data}-hetero-{nh}/{nkv}", nh, nkv, HETERO, data=data, seed=31))
        cases.append(Case(f"{data}-single-1024", h, kv, ((0, 1024),), data=data, seed=32))
    return cases


def fuzz_cases(count: int, seed: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(count):
        nh, nkv = GEOMETRIES[int(rng.integers(len(GEOMETRIES)))]
        slices = []
        for _ in range(int(rng.integers(1, 7))):
            start = 0 if rng.random() < 0.3 else int(rng.integers(0, 2000))
            length = int(np.exp(rng.uniform(0.0, np.log(400.0))))
            slices.append((start, max(1, length)))
        cases.append(Case(f"fuzz-{i}", nh, nkv, tuple(slices),
                          pages=PAGE_MODES[int(rng.integers(2))],
                          data=DATA_MODES[int(rng.integers(len(DATA_MODES)))],
                          seed=int(rng.integers(1 << 30))))
    return cases


def bench_shapes() -> dict[str, tuple[tuple[int, int], ...]]:
    """The 25 timing shapes: name -> (absolute_start, chunk_len) per request."""
    shapes: dict[str, tuple[tuple[int, int], ...]] = {}
    for n in (1, 16, 32, 64, 128, 256, 512, 768, 941, 1024):
        shapes[f"single-{n}"] = ((0, n),)
    for count, n in ((16, 16), (8, 32), (4, 64), (4, 128), (4, 256), (8, 128), (2, 512)):
        shapes[f"{count}x{n}"] = ((0, n),) * count
    for at in (0, 64, 256, 512, 960):
        shapes[f"history-64-at-{at}"] = ((at, 64),) * 4
    shapes["scheduled-4x512-first"] = ((0, 256),) * 4
    shapes["scheduled-4x512-second"] = ((256, 256),) * 4
    shapes["heterogeneous"] = HETERO
    return shapes
