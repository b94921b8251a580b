"""One decode step's graph captured under several variants of the backend, then replayed in
alternating order: what bench/launch_bound.py (a kind of launch made free) and
bench/route_forms.py (other GEMM forms) share. Random weights of the default model's shapes,
int8, the mma order; each variant has its own ModelRunner (its own graph cache and pool,
the same random histories: stream_overlap.fill_pools) and its graph is captured inside the
context ``setup(name, runner)`` returns.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager

from common import SMOLLM2
from stream_overlap import PAGES, fill_pools, graph_of, replayed_logits, specs, timed

from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model
from crucible.step.batch import build_packed_batch


class Variants:
    """Graphs of one ``rows``-row decode step, one per name, on one stream."""

    def __init__(self, rows: int, names: tuple[str, ...],
                 setup: Callable[[str, ModelRunner], ContextManager[Any]], who: str) -> None:
        import cupy as cp

        model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
        settings = Settings(device="cuda")
        runners = {n: ModelRunner(model, num_pages=PAGES * rows + 1, device="cuda",
                                  settings=settings) for n in names}
        if not runners[names[0]].backend.mma:
            raise SystemExit(f"{who}: the backend is not in the mma order")
        fill_pools(list(runners.values()))
        batch = build_packed_batch(specs(rows, model.config.vocab_size, seed=rows))
        self.graphs: dict[str, Any] = {}
        for n, runner in runners.items():
            with setup(n, runner):
                self.graphs[n] = graph_of(runner, batch)
        self.rows, self.names = rows, names
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()

    def logits(self, name: str) -> Any:
        """The step's logits bits after one replay of ``name``'s graph."""
        return replayed_logits(self.graphs[name], self.stream, self.rows)

    def time(self, rounds: int, replays: int,
             check: Callable[[], None] = lambda: None) -> dict[str, list[float]]:
        """ms per step of every graph, ``replays`` back to back, the order reversed every
        other round; ``check`` after each round (the bench's bit check)."""
        times: dict[str, list[float]] = {n: [] for n in self.names}
        for r in range(rounds):
            for n in self.names if r % 2 == 0 else self.names[::-1]:
                times[n].append(timed([(self.graphs[n], self.stream)], [self.stream], replays))
            check()
        return times
