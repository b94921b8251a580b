"""The decode graphs' twins and in-graph argmax, checked on the host (no GPU): which twin a
step replays, which ``fed`` buffer it reads and writes, what each replay waits for, where the
capture's warm-up argmax writes, and when the runner takes a graph's argmax as the step's
ids instead of launching the sampler."""

from __future__ import annotations

import sys
import types
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest

from crucible.backend import cupy_graphs
from crucible.backend.cupy_capture import Captured
from crucible.backend.cupy_graphs import DecodeGraphs
from crucible.step.rows import greedy_rows_in_order, row_sampling
from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.engine.sampling import SamplingParams
from crucible.engine.runner import ModelRunner
from fake_streams import Event, event, stream_class

VOCAB = 50


class _Ring:
    def __init__(self, log: list[tuple]) -> None:
        self.log = log

    def upload(self, host: np.ndarray, dev: Any, stream: Any) -> None:
        self.log.append((stream.name, "meta", host.tolist()))


def _fake_cupy(monkeypatch: pytest.MonkeyPatch, log: list[tuple]) -> type:
    Stream = stream_class(log)
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Stream=types.SimpleNamespace(null=Stream("default")),
                                      memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    fake.asarray = np.asarray
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return Stream


def test_decode_replay_runs_on_the_default_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The metadata goes up on the upload stream (after this graph's previous replay has
    read it), then the default stream waits for the upload and for ``after`` and replays."""
    log: list[tuple] = []
    Stream = _fake_cupy(monkeypatch, log)

    class Graph:
        def launch(self, stream: Any) -> None:
            log.append((stream.name, "launch"))

    cap = Captured(Graph(), "meta_dev", logits="logits", pool=None)
    upload, ring = Stream("upload"), _Ring(log)
    copied = event("copied")
    assert cap.replay_default(np.array([1, 2]), ring, upload, after=copied) == "logits"
    assert log == [("upload", "meta", [1, 2]), ("default", "waits", "event(upload)"),
                   ("default", "waits", "copied"), ("default", "launch")]
    assert cap.done == "event(default)"
    log.clear()
    cap.replay_default(np.array([3]), ring, upload)
    assert log == [("upload", "waits", "event(default)"), ("upload", "meta", [3]),
                   ("default", "waits", "event(upload)"), ("default", "launch")]
    # Events already reached queue no wait.
    log.clear()
    cap.done.done = True
    cap.replay_default(np.array([4]), ring, upload, after=event("copied", done=True))
    assert log == [("upload", "meta", [4]), ("default", "waits", "event(upload)"),
                   ("default", "launch")]


class _Launcher:  # GreedyLauncher: records where each argmax writes
    def __init__(self, log: list[tuple]) -> None:
        self.log = log

    def launch(self, logits: Any, meta: Any, r: int, out: Any) -> None:
        self.log.append(("argmax", r, out))


def _graphs(monkeypatch: pytest.MonkeyPatch, log: list[tuple]) -> DecodeGraphs:
    _fake_cupy(monkeypatch, log)
    g = DecodeGraphs.__new__(DecodeGraphs)  # host side only: no device, no stream
    g.width, g.scratch, g._templates, g.ceiling = 12, 500, {}, 256
    g.graphs, g.num_captures, g.num_replays, g.num_out_of_memory = OrderedDict(), 0, 0, 0
    g.fed, g.last, g.last_replayed, g._read = ("fed0", "fed1"), 0, False, [None, None]
    g._warm_ids, g.argmax, g.ring, g.upload, g.stream = "warm", _Launcher(log), None, None, None
    g.make_room = None
    g.memory = types.SimpleNamespace(released=0, sized=[])  # the pairs' shared memory
    g.memory.release = lambda: setattr(g.memory, "released", g.memory.released + 1)
    g.memory.logits = lambda rows, vocab: g.memory.sized.append((rows, vocab))
    g.vocab = 32

    class Cap:
        def __init__(self, twin: int) -> None:
            self.twin = twin

        def replay_default(self, meta: np.ndarray, ring: Any, upload: Any, after: Any) -> list:
            log.append(("replay", self.twin, after))
            return ["row"] * 64

    def capture(be: Any, stream: Any, meta_dev: Any, meta: Any, memory: Any, tail: Any) -> Cap:
        assert memory is g.memory  # every pair captures into the one shared memory
        twin = 1 - ["fed0", "fed1"].index(meta.fed)  # the views read the other twin's ids
        log.append(("capture", twin))
        tail("logits", True)
        tail("logits", False)
        return Cap(twin)

    monkeypatch.setattr(cupy_graphs, "capture_forward", capture)
    return g


def _decode(b: int, pos: int = 40):
    return build_packed_batch([SegmentSpec(f"r{i}", [3], pos, [7 + i] * 3, [0])
                               for i in range(b)])


def test_twins_alternate_and_wait_for_the_copy_two_steps_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple] = []
    g = _graphs(monkeypatch, log)
    got = []
    for step in range(6):
        out = g.run(_decode(3), 256, np.arange(3, dtype=np.int32) if step else None)
        assert len(out) == 3 and g.last_replayed
        got.append(g.last)
        assert g.fed_ids(3) == ("fed0", "fed1")[g.last]
        g.copied(Event(f"copy{step}"))
    assert got == [1, 0, 1, 0, 1, 0]
    # Both twins captured at the first step; the warm-up's argmax writes the scratch target,
    # the captured one the twin's own buffer, over the bucket's 4 rows.
    assert log[:7] == [("capture", 0), ("argmax", 4, "warm"), ("argmax", 4, "fed0"),
                       ("capture", 1), ("argmax", 4, "warm"), ("argmax", 4, "fed1"),
                       ("replay", 1, None)]
    # Later replays wait for the copy of the ids their buffer held two steps back.
    assert log[7:] == [("replay", 0, None), ("replay", 1, "copy0"), ("replay", 0, "copy1"),
                       ("replay", 1, "copy2"), ("replay", 0, "copy3")]
    assert list(g.graphs) == [(4, 256)] and g.num_replays == 6
    assert g.fed_ids(cupy_graphs.BUCKETS[-1] + 1) is None  # more rows than a graph holds


# -- the runner's choice between the graph's argmax and the sampler's launch


class _Backend:
    def __init__(self, replayed: bool) -> None:
        self.replayed, self.copied = replayed, []

    def run_step(self, batch: Any, forward: Any, feed: Any = None) -> np.ndarray:
        return np.zeros((batch.final_rows.shape[0], VOCAB), np.float32)

    def fed_ids(self, rows: int) -> str:
        return "fed"

    def sampled_ids(self, rows: int) -> str | None:
        return f"argmax[:{rows}]" if self.replayed else None

    def ids_copied(self, event: Any) -> None:
        self.copied.append(event)


class _Sampler:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def rows_to_host(self, logits: Any, rows: Any) -> np.ndarray:
        return np.empty((0, VOCAB), np.float32)

    def sample_async(self, logits: Any, rows: Any, tokens_out: Any = None,
                     ready: bool = False) -> Any:
        self.calls.append((tokens_out, ready))
        return types.SimpleNamespace(event=f"copy{len(self.calls)}")


def _runner(replayed: bool) -> ModelRunner:
    r = ModelRunner.__new__(ModelRunner)
    r.model = types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=VOCAB,
                                                                 max_context=2048))
    r.backend, r.sampler, r.num_argmax_steps = _Backend(replayed), _Sampler(), 0
    return r


def _rows(n: int, **kw: Any) -> list:
    params = SamplingParams(**kw)
    return [row_sampling(i, params, prompt=(), output=(), seed=1, stop_ids=(), vocab_size=VOCAB)
            for i in range(n)]


@pytest.mark.parametrize("replayed, kw, ready", [
    (True, dict(temperature=0.0), True),
    (True, dict(temperature=0.0, logprobs=1), False),  # logprobs: the sampler's kernel
    (True, dict(temperature=0.7), False),
    (True, dict(temperature=0.0, repetition_penalty=1.3), False),  # entries
    (False, dict(temperature=0.0), False),  # an eager step: no argmax ran
])
def test_runner_takes_the_graph_argmax_only_for_plain_greedy_rows(
        replayed: bool, kw: dict, ready: bool) -> None:
    r = _runner(replayed)
    rows = _rows(3, **kw)
    if kw.get("repetition_penalty"):  # a penalty reaches the device only through entries
        rows = [row_sampling(i, SamplingParams(**kw), prompt=[5], output=[], seed=1,
                             stop_ids=(), vocab_size=VOCAB) for i in range(3)]
    r.launch_sample(_decode(3), rows)
    assert r.sampler.calls == [("argmax[:3]", True) if ready else ("fed", False)]
    assert r.num_argmax_steps == int(ready)
    assert r.backend.copied == ["copy1"]  # the next writer of that buffer waits for it


def test_greedy_rows_in_order() -> None:
    rows = _rows(3, temperature=0.0)
    assert greedy_rows_in_order(rows)
    assert not greedy_rows_in_order(rows[::-1])  # row i must sample logits row i
    assert not greedy_rows_in_order(rows[1:])
    assert not greedy_rows_in_order([])


def test_capacity_classes_are_coarse() -> None:
    """A decode graph is keyed by 2048 positions, then multiples of 1024 up to the context, so a
    history growing by one page never needs a new graph (only the score buffer is sized by it)."""
    cap = cupy_graphs.graph_capacity
    assert [cap(c, 8192) for c in (256, 512, 2048, 2304, 4096, 4352, 6400, 8192)] == \
        [2048, 2048, 2048, 3072, 4096, 5120, 7168, 8192]
    assert cap(256, 512) == 512 and cap(512, 512) == 512  # a short context is the ceiling
    assert cap(768, 512) == 768  # never below what the step needs


def test_start_up_captures_every_bucket_then_steps_only_replay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple] = []
    g = _graphs(monkeypatch, log)
    g.width, g.ceiling = 512, 8192  # an 8192-token context
    n = g.capture_all(lambda meta: None, max_rows=40)
    buckets = [b for b in cupy_graphs.BUCKETS if b <= 48]  # 40 rows fill the 48 bucket
    assert n == 2 * len(buckets) == g.num_captures
    assert list(g.graphs) == [(b, 2048) for b in reversed(buckets)]  # largest first
    def step(rows: int, pos: int) -> Any:
        return build_packed_batch([SegmentSpec(f"r{i}", [3], pos, [7 + i] * (pos // 16 + 1),
                                               [0]) for i in range(rows)])

    for rows, pos in ((3, 40), (17, 900), (40, 2000)):  # every history under 2048 replays
        g.run(step(rows, pos), -(-(pos + 1) // 256) * 256, None)
    assert g.num_captures == n and g.num_replays == 3
    g.run(step(3, 2100), 2304, None)  # past the first class: one new pair
    assert g.num_captures == n + 2 and (4, 3072) in g.graphs


def test_out_of_memory_stops_the_start_up_and_turns_a_step_eager(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture that finds no device memory never fails the engine: at start-up the
    captures stop there (what was captured stays); in a step every graph is dropped (their
    pools go back to the device) and the capture tried once more, then the step runs
    eagerly (None), or, fed by the previous step's ids on the device, raises."""
    log: list[tuple] = []
    g = _graphs(monkeypatch, log)
    g.width, g.ceiling, g.stream = 512, 8192, types.SimpleNamespace(synchronize=lambda: None)
    real = cupy_graphs.capture_forward
    budget = [7]  # captures the device has room for

    def capture(*a: Any, **k: Any) -> Any:
        if budget[0] == 0:
            raise MemoryError("out of memory")
        budget[0] -= 1
        return real(*a, **k)

    monkeypatch.setattr(cupy_graphs, "capture_forward", capture)
    # Buckets 64, 48 and 32 (largest first), then twin 0 of 24, whose pair is given up
    # with twin 1.
    assert g.capture_all(lambda meta: None, max_rows=64) == 7
    assert list(g.graphs) == [(64, 2048), (48, 2048), (32, 2048)] and g.num_out_of_memory == 1
    assert g.memory.sized == [(64, 32)]  # the logits buffer at the top bucket's size first
    assert g.run(_decode(40), 256, None) is not None  # bucket 48 is there: a replay
    assert g.run(_decode(6), 256, None) is None  # bucket 8: no room even after dropping all
    assert g.graphs == {} and g.num_out_of_memory == 2 and g.memory.released == 2
    budget[0] = 2  # room again: the next step captures its pair and replays
    assert g.run(_decode(6), 256, None) is not None and list(g.graphs) == [(8, 2048)]
    with pytest.raises(MemoryError):  # a fed step cannot run eagerly
        g.run(_decode(12), 256, None, np.zeros(12, np.int32))
