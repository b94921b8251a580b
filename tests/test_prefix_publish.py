"""Publishing a run of pages (``PrefixCache.publish_run``, what a step's results publish for
each request) indexes exactly what publishing the same pages one at a time does, under
every budget: the longest kept prefix, the number of chains, the resident pages (with
shedding), and pages whose content is indexed already.

Requests share prefixes and branch, as chat turns do; each is published in random runs
(a step completes a slice's pages), the reference one page at a time. The whole index is
compared after each request, and ``check`` holds throughout. The negative control: a run
that hashes each page from the wrong parent indexes other keys, and the comparison sees it.
"""

from __future__ import annotations

import random

import pytest

from crucible.engine.prefix_cache import PrefixCache
from crucible.step.batch import PAGE_SIZE


def state(c: PrefixCache) -> tuple:
    """Everything the index holds, comparable."""
    return (c._pages, c._keys, c._parents, c._ids, c._content, c._root_pages,
            c._spans._spans, c._spans._span_of, list(c._unowned), c.stats.admissions,
            c.stats.evictions)


def workload(seed: int) -> list[tuple[list[int], str | None]]:
    """Requests over a few system prompts, sharing and branching inside pages and spans."""
    rng = random.Random(seed)
    systems = [[rng.randrange(50) for _ in range(rng.randrange(20, 120))] for _ in range(3)]
    out = []
    for _ in range(24):
        base = list(rng.choice(systems))
        if out and rng.random() < 0.4:  # the next turn of an earlier conversation
            base = list(rng.choice(out)[0])
        tokens = base + [rng.randrange(50) for _ in range(rng.randrange(1, 90))]
        out.append((tokens, rng.choice([None, None, "tenant"])))
    return out


def drive(c: PrefixCache, requests: list, runs: bool, seed: int) -> list[tuple]:
    """Publish every request's full pages (runs of random length, or one page at a time),
    releasing some pages as the allocator does so the resident budget can shed; the
    index's state after each request."""
    rng, nxt, states = random.Random(seed), 0, []
    for tokens, salt in requests:
        n = len(tokens) // PAGE_SIZE
        pages, chain, at = list(range(nxt, nxt + n)), [], 0
        nxt += n
        while at < n:
            end = min(n, at + rng.randrange(1, 9))
            if runs:
                c.publish_run(pages, at, end, tokens, salt, chain)
            else:
                for i in range(at, end):
                    c.publish_run(pages, i, i + 1, tokens, salt, chain)
            at = end
            c.check()
        for page in reversed(pages):  # the request ends: its pages lose their owner
            c.released(page)
        states.append(state(c))
    return states


@pytest.mark.parametrize("budget", [dict(max_pages=10_000),
                                    dict(max_pages=10_000, max_tokens=5 * PAGE_SIZE + 3),
                                    dict(max_pages=10_000, max_entries=2),
                                    dict(max_pages=12),
                                    dict(max_pages=12, max_tokens=7 * PAGE_SIZE,
                                         max_entries=3)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_run_indexes_what_its_pages_one_at_a_time_do(budget: dict, seed: int) -> None:
    requests = workload(seed)
    one = drive(PrefixCache(("t",), "cpu", **budget), requests, runs=False, seed=seed)
    run = drive(PrefixCache(("t",), "cpu", **budget), requests, runs=True, seed=seed)
    assert run == one
    assert one[-1][9] > 0  # something was indexed


def test_the_budgets_bite() -> None:
    """The budgets above are not vacuous: each stops something being indexed."""
    requests = workload(0)
    free = drive(PrefixCache(("t",), "cpu", max_pages=10_000), requests, True, 0)[-1]
    for budget in (dict(max_tokens=5 * PAGE_SIZE + 3), dict(max_entries=2)):
        held = drive(PrefixCache(("t",), "cpu", max_pages=10_000, **budget), requests, True,
                     0)[-1]
        assert held[9] < free[9]
    shed = drive(PrefixCache(("t",), "cpu", max_pages=12), requests, True, 0)[-1]
    assert shed[10] > 0 and len(shed[1]) <= 12


def test_pages_past_the_longest_prefix_neither_index_nor_hash() -> None:
    c = PrefixCache(("t",), "cpu", max_pages=100, max_tokens=3 * PAGE_SIZE)
    tokens, chain = list(range(8 * PAGE_SIZE)), []
    c.publish_run(list(range(8)), 0, 5, tokens, None, chain)
    c.publish_run(list(range(8)), 5, 8, tokens, None, chain)  # wholly past it: nothing
    assert c.num_pages == 3 and len(chain) == 3


def test_negative_control_a_wrong_parent_is_seen(monkeypatch) -> None:
    import crucible.engine.prefix_cache as pcm

    requests = workload(0)
    one = drive(PrefixCache(("t",), "cpu", max_pages=10_000), requests, False, 0)
    real = pcm.xxhash.xxh3_128_digest

    class Skewed:  # hashes a page as if its parent's key had a flipped byte
        @staticmethod
        def xxh3_128_digest(data: bytes) -> bytes:
            return real(bytes([data[0] ^ 1]) + data[1:])

    monkeypatch.setattr(pcm, "xxhash", Skewed)
    run = drive(PrefixCache(("t",), "cpu", max_pages=10_000), requests, True, 0)
    assert run != one
