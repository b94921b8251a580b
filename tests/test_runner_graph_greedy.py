"""ModelRunner.launch_sample's in-graph greedy route on the CPU, through stand-ins for the
CuPy backend and sampler (the ids' bits are gpu-graph-check's: a decode graph's argmax ==
the sampler's kernel, on all-greedy engine runs). A step whose rows are all plain greedy,
row i on logits row i, asks the backend for the greedy graph (after the sampler's last
copy); when the backend says the ids are in ``fed``, only their copy is queued; anything
else goes to the sampler's own kernel."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np
import pytest

from crucible.backend.sampling_meta import plain_row_sampling
from crucible.engine.batch import SegmentSpec, build_packed_batch
from crucible.engine.sampling import SamplingParams
from crucible.model.runner import ModelRunner
from crucible.model.tiny import tiny_random_model

VOCAB = 64


class FakeBackend:
    name = "cupy"

    def __init__(self, decode: bool = True) -> None:
        self.decode, self.calls, self.ids_in_fed = decode, [], False

    def run_step(self, batch: Any) -> np.ndarray:
        raise AssertionError("launch_sample must use run_step_device")

    def run_step_device(self, batch: Any, feed: Any = None, greedy: bool = False,
                        after: Any = None) -> np.ndarray:
        self.calls.append({"feed": feed, "greedy": greedy, "after": after})
        self.ids_in_fed = greedy and self.decode  # the graphs ran only for decode steps
        return np.zeros((batch.final_rows.shape[0], VOCAB), np.float32)

    def fed_ids(self, rows: int) -> np.ndarray:
        return np.arange(64, dtype=np.int32)

    @contextlib.contextmanager
    def on_step_stream(self) -> Iterator[None]:
        yield


class FakeSampler:
    def __init__(self) -> None:
        self.copies, self.samples, self.last_copy = [], [], "event-0"

    def rows_to_host(self, logits: Any, host_rows: Any) -> np.ndarray:
        return np.zeros((0, VOCAB), np.float32)

    def copy_ids_async(self, tokens: Any, rows: Any) -> str:
        self.copies.append(len(rows))
        self.last_copy = f"event-{len(self.copies) + len(self.samples)}"
        return "copy"

    def sample_async(self, logits: Any, rows: Any, tokens_out: Any) -> str:
        self.samples.append(len(rows))
        self.last_copy = f"event-{len(self.copies) + len(self.samples)}"
        return "kernel"


def _runner(decode: bool = True) -> ModelRunner:
    runner = ModelRunner(tiny_random_model(seed=1, vocab_size=VOCAB), num_pages=8)
    runner.backend, runner.sampler = FakeBackend(decode), FakeSampler()
    return runner


def _step(runner: ModelRunner, params: list[SamplingParams], rows_at: list[int] | None = None,
          feed: np.ndarray | None = None) -> Any:
    n = len(params)
    batch = build_packed_batch([SegmentSpec(f"r{i}", [3], 5, [i], [0]) for i in range(n)])
    rows = [plain_row_sampling(i if rows_at is None else rows_at[i], p, num_output=1, seed=i)
            for i, p in enumerate(params)]
    return runner.launch_sample(batch, rows, feed=feed)


GREEDY = SamplingParams(temperature=0.0)


@pytest.mark.parametrize("feed", [None, np.arange(3, dtype=np.int32)])
def test_plain_greedy_decode_takes_the_graphs_argmax(feed: Any) -> None:
    runner = _runner()
    pending = _step(runner, [GREEDY] * 3, feed=feed)
    call = runner.backend.calls[-1]
    assert call["greedy"] and call["after"] == "event-0"  # after the sampler's last copy
    assert runner.sampler.copies == [3] and runner.sampler.samples == []
    assert pending._pending == "copy" and runner.num_graph_greedy == 1
    _step(runner, [GREEDY] * 3, feed=feed)
    assert runner.backend.calls[-1]["after"] == "event-1" and runner.num_graph_greedy == 2


@pytest.mark.parametrize("params, rows_at", [
    ([GREEDY, SamplingParams(temperature=0.8)], None),  # one row samples
    ([GREEDY, SamplingParams(temperature=0.0, logprobs=2)], None),  # logprobs asked
    ([GREEDY, GREEDY], [1, 0]),  # rows not on logits rows 0, 1, ...
])
def test_other_steps_use_the_samplers_kernel(params: list, rows_at: Any) -> None:
    runner = _runner()
    _step(runner, params, rows_at)
    assert not runner.backend.calls[-1]["greedy"] and runner.backend.calls[-1]["after"] is None
    assert runner.sampler.samples == [2] and runner.sampler.copies == []


def test_greedy_step_the_graphs_did_not_run_is_sampled() -> None:
    runner = _runner(decode=False)  # e.g. a prefill step: no decode graph ran
    _step(runner, [GREEDY] * 2)
    assert runner.backend.calls[-1]["greedy"]
    assert runner.sampler.samples == [2] and runner.sampler.copies == []
    assert runner.num_graph_greedy == 0


def test_switched_off_by_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRUCIBLE_GRAPH_GREEDY", "0")
    runner = _runner()
    assert not runner.graph_greedy_on
    _step(runner, [GREEDY] * 2)
    assert not runner.backend.calls[-1]["greedy"] and runner.sampler.samples == [2]
    monkeypatch.setenv("CRUCIBLE_GRAPH_GREEDY", "2")
    with pytest.raises(Exception, match="CRUCIBLE_GRAPH_GREEDY must be 0 or 1"):
        _runner()
