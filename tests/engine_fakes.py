"""A fake runner for engine/scheduler tests that need no model.

Each row's token is written into a token pool at the row's slot (like K/V into the page
pool); the logits of a final row are a pure function of the row's whole history *read back
through its page table*. So a wrong page table, a slot clobbered by another request, or a
slice that skipped or repeated positions changes the logits and the generated tokens,
just as it would with a real model, while correct paging is batch-invariant by design.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np

from crucible.backend.protocol import GRAPH_STATS
from crucible.step.batch import PAGE_SIZE, PackedBatch


class FakeRunner:
    """The runner interface the engine uses, without a device sampler (host sampling)."""

    sampler = None
    chain_rows = 0  # no pipelined decode
    mixed_feed_rows = None  # no pipelined mixed step

    def __init__(self, num_pages: int, *, vocab_size: int = 64, max_context: int = 512,
                 on_batch=None) -> None:
        self.num_pages = num_pages
        self.config = SimpleNamespace(vocab_size=vocab_size, max_context=max_context)
        self.pool = np.full(num_pages * PAGE_SIZE, -1, dtype=np.int64)
        self.on_batch = on_batch  # called with every batch before it runs (invariant checks)
        self.num_forwards = 0

    def graph_stats(self) -> dict[str, int]:
        return dict.fromkeys(GRAPH_STATS, 0)  # every step eager: there are no graphs

    def first_use(self, batch: PackedBatch, fed: bool) -> bool:
        return False  # no graphs to capture

    def forward(self, batch: PackedBatch) -> np.ndarray:
        if self.on_batch is not None:
            self.on_batch(batch)
        self.num_forwards += 1
        self.pool[batch.slot_mapping()] = batch.token_ids
        seg_of_row = np.repeat(np.arange(batch.num_segments), batch.segments[:, 1])
        out = np.empty((batch.final_rows.shape[0], self.config.vocab_size), dtype=np.float32)
        for i, r in enumerate(batch.final_rows.tolist()):
            table = batch.page_tables[batch.segments[seg_of_row[r], 3]]
            pos = np.arange(int(batch.positions[r]) + 1)
            history = self.pool[table[pos // PAGE_SIZE].astype(np.int64) * PAGE_SIZE
                                + pos % PAGE_SIZE]
            assert (history >= 0).all(), "read a slot that was never written"
            digest = hashlib.blake2b(history.tobytes(), digest_size=8).digest()
            rng = np.random.default_rng(int.from_bytes(digest, "little"))
            out[i] = (rng.standard_normal(self.config.vocab_size) * 2.0).astype(np.float32)
        return out


def fake_tokenizer(eos: int | None = None) -> SimpleNamespace | None:
    """A minimal tokenizer stand-in: only stop ids (no text) for token-level tests."""
    if eos is None:
        return None
    return SimpleNamespace(stop_token_ids=(eos,), detokenizer=lambda: None)
