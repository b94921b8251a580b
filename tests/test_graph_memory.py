"""The captured graphs' bound on device memory (crucible/backend/cupy_memory.py), host side:
a fake device whose free memory is what the held graphs leave. Captures stop while a step's
headroom is not free, the decode graphs make room (prefill and mixed graphs first, then
the decode graphs), and a step that runs out of memory runs again after each release.
Without the bound the chat mix's growing histories added graph keys until no eager step
could allocate its logits (an H100 serve sweep, 10,757 failed requests)."""

from __future__ import annotations

import sys
import types
from collections import OrderedDict
from types import SimpleNamespace

import pytest

from crucible.backend import cupy_route
from crucible.backend.cupy_graph_cache import GraphCache
from crucible.backend.cupy_memory import EAGER_ROWS, MemoryGuard, step_headroom
from crucible.model.tiny import tiny_random_model

GB = 1 << 30


class OOM(Exception):
    """Stands in for cupy.cuda.memory.OutOfMemoryError."""


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    pool = SimpleNamespace(free_all_blocks=lambda: calls.append("free_all_blocks"))
    fake = types.ModuleType("cupy")
    fake.get_default_memory_pool = lambda: pool
    fake.cuda = SimpleNamespace(memory=SimpleNamespace(OutOfMemoryError=OOM), Device=lambda: (
        SimpleNamespace(synchronize=lambda: calls.append("synchronize"))))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return calls


class Cache(GraphCache):
    def __init__(self, held: int) -> None:
        self.stream = SimpleNamespace(synchronize=lambda: None)
        self._init_cache(capture_after=1, max_graphs=8)
        self.graphs = {f"k{i}": object() for i in range(held)}


def device(total: float, be: SimpleNamespace) -> MemoryGuard:
    """A guard over a device of ``total`` GB where each held graph takes 1 GB."""
    def free(need: int) -> int:
        held = sum(len(c.graphs) for c in (be.prefill_graphs, be.mixed_graphs))
        held += 2 * len(be.graphs.graphs)  # a decode key is a pair
        return int((total - held) * GB)
    return MemoryGuard(be, headroom=2 * GB, free=free)


def backend(prefill: int, mixed: int, decode: int) -> SimpleNamespace:
    dec = SimpleNamespace(graphs=OrderedDict((k, ("a", "b")) for k in range(decode)),
                          cleared=0)

    def clear() -> None:  # DecodeGraphs.clear: every pair, and their shared memory
        dec.cleared += 1
        dec.graphs.clear()

    dec.clear = clear
    return SimpleNamespace(prefill_graphs=Cache(prefill), mixed_graphs=Cache(mixed), graphs=dec)


def test_no_capture_without_headroom_and_the_key_stays_sighted(fake_cupy: list[str]) -> None:
    cache, room = Cache(0), [False]
    cache.has_room = lambda: room[0]
    made: list[str] = []

    def capture() -> object:
        made.append("capture")
        return SimpleNamespace(seconds=0.05)

    assert cache._graph("k", capture) is None and made == []
    assert cache.num_out_of_memory == 1 and cache.num_eager == 1 and "k" in cache.seen
    room[0] = True  # memory came back: the next sighting captures
    assert cache._graph("k", capture) is not None and made == ["capture"]
    assert cache.num_captures == 1 and "k" not in cache.seen


def test_make_room_drops_prefill_and_mixed_first_then_the_decode_graphs(
        fake_cupy: list[str]) -> None:
    be = backend(prefill=3, mixed=4, decode=5)  # 3 + 4 + 10 GB held
    guard = device(20, be)  # 3 GB free: room already
    assert guard.make_room() and len(be.mixed_graphs.graphs) == 4 and fake_cupy == []
    guard = device(18, be)  # 1 GB free: the other graphs go, the decode pairs stay
    assert guard.make_room() and fake_cupy == ["free_all_blocks"]
    assert be.prefill_graphs.graphs == {} and be.mixed_graphs.graphs == {}
    assert (be.prefill_graphs.max_graphs, be.mixed_graphs.max_graphs) == (1, 2)  # half
    assert list(be.graphs.graphs) == [0, 1, 2, 3, 4] and guard.num_dropped == 7
    assert be.graphs.cleared == 0
    # 10 GB of pairs on 11 GB: the pairs share their memory, so one pair alone frees
    # nothing: they all go at once (DecodeGraphs.clear waits for the device first)
    guard = device(11, be)
    assert guard.make_room() and be.graphs.graphs == OrderedDict() and be.graphs.cleared == 1
    assert guard.num_dropped == 10  # this guard's: five pairs
    guard = device(1, be)  # nothing left to drop: no room, and it says so
    assert not guard.make_room() and be.graphs.cleared == 1


def test_wire_hooks_every_cache() -> None:
    be = backend(0, 0, 0)
    be.graphs.make_room = None
    guard = MemoryGuard.wire(be, 5)
    assert be.prefill_graphs.has_room == guard.has_room == be.mixed_graphs.has_room
    assert be.graphs.make_room == guard.make_room and guard.headroom == 5


def test_a_step_out_of_memory_runs_again_after_each_release(
        fake_cupy: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    be = backend(prefill=2, mixed=2, decode=1)
    be.memory = device(100, be)
    tries: list[int] = []

    def route(be_: object, batch: object, forward: object, feed: object) -> str:
        tries.append(len(be.mixed_graphs.graphs))
        if len(tries) == 1:
            raise OOM("out of memory allocating 3,145,728 bytes")
        return "logits"

    monkeypatch.setattr(cupy_route, "_route", route)
    assert cupy_route.run_step(be, None, None) == "logits"
    assert tries == [2, 0] and be.memory.num_retries == 1 and fake_cupy == ["free_all_blocks"]
    tries.clear()

    def never(*a: object) -> str:
        tries.append(1)
        raise OOM("out of memory")

    assert be.graphs.cleared == 0  # the first retry leaves the decode graphs
    monkeypatch.setattr(cupy_route, "_route", never)
    with pytest.raises(OOM):  # a third failure is the step's: no loop of retries
        cupy_route.run_step(be, None, None)
    assert tries == [1, 1, 1] and be.graphs.cleared == 1  # the second retry drops them

    def broken(*a: object) -> str:
        raise ValueError("not a memory error")

    monkeypatch.setattr(cupy_route, "_route", broken)
    with pytest.raises(ValueError):  # other errors are not retried
        cupy_route.run_step(be, None, None)
    assert be.memory.num_retries == 3


def test_headroom_covers_the_largest_eager_steps_logits() -> None:
    cfg = tiny_random_model(seed=0, weights="f32").config
    base = step_headroom(cfg, 512)
    assert base >= 2 * EAGER_ROWS * cfg.vocab_size * 4  # logits and the sampler's copy
    assert step_headroom(cfg, 1024) == base  # graph rows under the eager budget
    assert step_headroom(cfg, 2 * EAGER_ROWS) > base  # larger graphs: more room


def test_free_counts_the_default_pools_cached_blocks_only_once_returned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from crucible.backend.cupy_memory import free_bytes

    state = {"device": 1 * GB, "cached": 3 * GB, "returned": 0}

    def free_all_blocks() -> None:
        state["device"] += state["cached"]
        state["cached"], state["returned"] = 0, state["returned"] + 1

    pool = SimpleNamespace(free_bytes=lambda: state["cached"], free_all_blocks=free_all_blocks)
    fake = types.ModuleType("cupy")
    fake.get_default_memory_pool = lambda: pool
    fake.cuda = SimpleNamespace(runtime=SimpleNamespace(
        memGetInfo=lambda: (state["device"], 80 * GB)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert free_bytes(GB // 2) == GB and state["returned"] == 0  # enough: the cache stays
    assert free_bytes(2 * GB) == 4 * GB and state["returned"] == 1  # short: given back
    assert free_bytes(8 * GB) == 4 * GB and state["returned"] == 1  # nothing left to give


def test_a_short_device_is_not_looked_at_again_for_a_while() -> None:
    """After a check finds no room, checks answer no for RECHECK_S without looking (each
    look may hand the default pool's blocks back, which an eager step then reallocates);
    a decode capture's make_room always looks."""
    from crucible.backend import cupy_memory

    looks, now, room = [], [100.0], [False]

    def free(need: int) -> int:
        looks.append(now[0])
        return need if room[0] else 0

    be = backend(0, 0, 0)
    guard = MemoryGuard(be, headroom=GB, free=free, clock=lambda: now[0])
    assert not guard.has_room() and looks == [100.0]
    room[0] = True
    now[0] += cupy_memory.RECHECK_S / 2
    assert not guard.has_room() and looks == [100.0]  # within the pause: no look
    assert guard.make_room() and len(looks) == 2  # a decode capture looks now
    now[0] += cupy_memory.RECHECK_S
    assert guard.has_room() and len(looks) == 3  # past the pause: looks, finds room
