"""The prefix cache's four-page spans (engine/prefix_spans.py): a lookup through them finds
exactly the pages the page-by-page walk finds, and no span outlives one of its pages.

The cache is driven directly (publish, match, forget, as the scheduler and the allocator
call it), over chains that branch inside a span, with ``check`` after every change. The
reference walk is the cache with its spans emptied. The negative control: spans that are
not dropped with their pages hand out a page the index no longer holds.
"""

from __future__ import annotations

import random

import pytest

from crucible.engine.prefix_cache import PrefixCache
from crucible.engine.prefix_spans import SPAN_PAGES, SpanIndex
from crucible.step.batch import PAGE_SIZE


def cache() -> PrefixCache:
    return PrefixCache(("test", "spans"), "cpu", max_pages=100_000)


def publish_all(c: PrefixCache, tokens: list[int], first_page: int, salt: str | None = None
                ) -> list[int]:
    """Publish every full page of ``tokens`` as pages first_page, first_page + 1, ..."""
    chain: list[bytes] = []
    pages = list(range(first_page, first_page + len(tokens) // PAGE_SIZE))
    for i in range(len(pages)):  # a page a step
        c.publish_run(pages, i, i + 1, tokens, salt, chain)
    c.check()
    return pages


def page_walk(c: PrefixCache, tokens: list[int], salt: str | None = None) -> list[int]:
    """``match`` without spans: the reference."""
    spans, c._spans = c._spans, SpanIndex()
    try:
        return c.match(tokens, salt, [])
    finally:
        c._spans = spans


def test_a_span_lookup_finds_the_pages_a_page_walk_finds() -> None:
    rng = random.Random(0)
    c = cache()
    system = [rng.randrange(50_000) for _ in range(500)]  # ends mid-page: chains branch there
    convs = [system + [rng.randrange(50_000) for _ in range(rng.randrange(1, 700))]
             for _ in range(12)]
    for k, conv in enumerate(convs):
        publish_all(c, conv, 1_000 * k)
    assert len(c._spans) > 0
    for k, conv in enumerate(convs):
        for tail in ([], [7] * 5, [rng.randrange(50_000) for _ in range(40)]):
            probe = conv + tail
            got, chain = c.match(probe, None, []), []
            assert got == page_walk(c, probe)
            # every cached page but the last token's: the probe's own pages where published
            assert len(got) == min(len(conv) // PAGE_SIZE, (len(probe) - 1) // PAGE_SIZE)
            assert c.match(probe, None, chain) == got and len(chain) >= len(got)
        # a request that differs inside a span stops where the page walk stops
        cut = rng.randrange(PAGE_SIZE * 8, len(conv)) if len(conv) > PAGE_SIZE * 8 else 40
        changed = conv[:cut] + [conv[cut] ^ 1] + conv[cut + 1 :] + [1]
        assert c.match(changed, None, []) == page_walk(c, changed)
        assert len(c.match(changed, None, [])) == min(cut // PAGE_SIZE, len(conv) // PAGE_SIZE)


def test_spans_respect_the_salt() -> None:
    rng = random.Random(1)
    c = cache()
    tokens = [rng.randrange(50_000) for _ in range(16 * 20 + 3)]
    publish_all(c, tokens, 0, salt="a")
    assert len(c.match(tokens, "a", [])) == 20
    assert c.match(tokens, "b", []) == [] and c.match(tokens, None, []) == []


@pytest.mark.parametrize("seed", range(4))
def test_forgetting_any_page_drops_every_span_holding_it(seed: int) -> None:
    rng = random.Random(seed)
    c = cache()
    system = [rng.randrange(50_000) for _ in range(16 * 9 + 5)]
    convs = [system + [rng.randrange(50_000) for _ in range(16 * 12)] for _ in range(6)]
    held = {}
    for k, conv in enumerate(convs):
        pages = publish_all(c, conv, 100 * k)
        held.update({p: k for p in pages if c.indexed(p)})
    spans = len(c._spans)
    # The first conversation's pages 0-19 make five spans; every other one's 9-20 are its
    # own (0-8 are the system prompt's, indexed once), so it adds the spans of 8-11 (page 8
    # in six spans), 12-15 and 16-19.
    assert spans == 5 + 5 * 3
    order = list(held)
    rng.shuffle(order)  # any order, parents before children included
    order.remove(8)
    order.insert(seed, 8)  # the page in six spans goes early, while most of them exist
    for page in order:
        c.forget(page)
        c.check()
        assert not c.indexed(page)
        for conv in convs:
            got = c.match(conv + [1], None, [])
            assert page not in got and got == page_walk(c, conv + [1])
            assert all(c.indexed(p) for p in got)
        assert len(c._spans) <= spans
        spans = len(c._spans)
    assert len(c._spans) == 0 and c.num_pages == 0


def test_republished_pages_make_their_spans_again() -> None:
    rng = random.Random(5)
    c = cache()
    tokens = [rng.randrange(50_000) for _ in range(16 * 16 + 1)]
    publish_all(c, tokens, 0)
    assert len(c._spans) == 16 // SPAN_PAGES
    c.forget(6)  # the second span's third page
    assert len(c._spans) == 16 // SPAN_PAGES - 1
    assert c.match(tokens, None, []) == list(range(6))
    publish_all(c, tokens, 500)  # page 6's content is indexed again, on page 506
    got = c.match(tokens, None, [])
    assert got == page_walk(c, tokens) == list(range(6)) + [506] + list(range(7, 16))
    c.check()


def test_negative_control_spans_kept_past_their_pages_hand_out_a_forgotten_page(
        monkeypatch) -> None:
    rng = random.Random(2)
    c = cache()
    tokens = [rng.randrange(50_000) for _ in range(16 * 8 + 1)]
    publish_all(c, tokens, 0)
    monkeypatch.setattr(SpanIndex, "drop", lambda self, page: None)
    c.forget(2)
    with pytest.raises(AssertionError):
        c.check()
    with pytest.raises(KeyError):  # the stale span names page 2, whose key is gone
        c.match(tokens, None, [])
