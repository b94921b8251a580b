"""The prefix cache's identity, without a model (D10): the namespace and page keys as the
design spells them, a chain that is filled before its admission, and a hit that needs the
page's own ids, not only its key. tests/test_prefix_cache.py runs the engine with it."""

from __future__ import annotations

import numpy as np

from crucible.engine.prefix_cache import namespace_key, page_key


def test_d10_identity() -> None:
    # Length-prefixed: moving a character across a field boundary changes the key.
    assert namespace_key("ab", "c") != namespace_key("a", "bc")
    assert namespace_key("a", "") != namespace_key("a")
    root = namespace_key("m")
    page = list(range(16))
    assert page_key(root, page) == page_key(root, list(page))
    assert page_key(root, page) != page_key(root, page[:15] + [16])
    assert page_key(root, page) != page_key(namespace_key("m2"), page)
    # ids are int32, not bytes: 256 and 1 differ even though one byte of each is 1.
    assert page_key(root, [256] + page[1:]) != page_key(root, [1] + page[1:])
    # The documented encoding itself, whichever way it is packed (lists or numpy ids).
    import xxhash

    want = xxhash.xxh3_128_digest(root + np.asarray(page, dtype="<i4").tobytes())
    assert page_key(root, page) == want == page_key(root, np.asarray(page, np.int64))


def test_a_request_whose_chain_is_filled_still_hits() -> None:
    """A request's keys are filled before its admission in two ways: publishing, before a
    preemption sends it back to the queue, and an admission that found no free pages (the
    next step matches it again). Either way the walk starts at the root: the same pages as
    a fresh chain (a match that began at the chain's last key found nothing)."""
    from crucible.engine.prefix_cache import PrefixCache

    cache = PrefixCache(("test", "model", "int8"), "arith", max_pages=64)
    toks = list(range(100, 100 + 16 * 5 + 3))
    published: list[bytes] = []
    for i in range(5):  # a page a step
        cache.publish_run(list(range(10, 15)), i, i + 1, toks, None, published)
    fresh: list[bytes] = []
    want = [10, 11, 12, 13, 14]
    assert cache.match(toks, None, fresh) == want and fresh == published
    assert cache.match(toks, None, list(published)) == want  # back from a preemption
    assert cache.match(toks, None, fresh) == want  # matched again after a blocked admission
    assert cache.match(toks, None, published[:2]) == want  # a chain published in part
    # Control: a chain whose keys are not this prompt's finds nothing, however it is held.
    other = toks[:16] + [7] * 16 + toks[32:]
    assert cache.match(other, None, []) == [10]
    assert cache.match(other, None, published[:1]) == [10]


def test_a_hash_collision_is_caught_by_the_stored_ids(monkeypatch) -> None:
    """A hit needs the page's ids and parent, not only its key: with a forged hash under
    which every page of a chain collides, another prompt's page is never a hit, and the
    chain's own pages still are (those the collisions let in: the first; later ones share
    its key, so they are not indexed)."""
    import crucible.engine.prefix_cache as pcm

    cache = pcm.PrefixCache(("test", "model", "int8"), "arith", max_pages=64)
    toks = list(range(300, 300 + 16 * 6 + 1))
    chain: list[bytes] = []
    monkeypatch.setattr(pcm.xxhash, "xxh3_128_digest", lambda data: b"k" * 16)
    for i in range(6):
        cache.publish_run(list(range(20, 26)), i, i + 1, toks, None, chain)
    cache.check()
    assert cache.num_pages == 1 and cache.match(toks, None, []) == [20]
    for bad in range(16):  # one id of the first page changed: same key, other content
        other = list(toks)
        other[bad] += 1
        assert cache.match(other, None, []) == []
    # A page's own ids under another parent are another page (the walk's parent check).
    assert cache.match(toks[16:], None, []) == []
