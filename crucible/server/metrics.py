"""Prometheus text metrics: counters and latency histograms kept on the event loop.

Latency observations come from ``RequestStream`` timing (step-completion times stamped by
the engine thread), so they measure the engine + hand-off, not the client's network.
Gauges (running, waiting, pages) are read from the engine loop's last snapshot; peaks are
kept by the loop because only it sees every admission and every step.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any, Sequence

from crucible.server.stream import RequestStream

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                    0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


# The engine's own figures (its stats: gauges, and counters it keeps step by step), as
# (series, kind, help, stats key); /metrics renders them in this order.
ENGINE_SERIES = (
    ("crucible_requests_running", "gauge", "Admitted requests holding pages.", "running"),
    ("crucible_requests_waiting", "gauge", "Requests in the waiting queue.", "waiting"),
    ("crucible_requests_waiting_preempted", "gauge",
     "Waiting requests that were preempted (re-queued beyond the bound).", "waiting_preempted"),
    ("crucible_queue_peak", "gauge",
     "Most new (never admitted) requests waiting at once; never above the bound.",
     "queue_peak"),
    ("crucible_requests_waiting_peak", "gauge",
     "Most requests waiting at once, preempted ones included.", "waiting_peak"),
    ("crucible_pages_total", "gauge", "Pages in the KV pool.", "pages_total"),
    ("crucible_pages_used", "gauge", "Pages held by requests now.", "pages_used"),
    ("crucible_pages_used_peak", "gauge", "Most pages ever held at once.", "pages_peak"),
    ("crucible_engine_steps_total", "counter", "Packed forward steps.", "steps"),
    ("crucible_engine_rows_total", "counter",
     "Rows the engine's steps computed (prompt positions and decode rows).", "rows_computed"),
    ("crucible_engine_generated_tokens_total", "counter",
     "Tokens the engine's steps sampled, counted as they are sampled.", "tokens_generated"),
    ("crucible_preemptions_total", "counter", "Requests preempted for pages.", "preemptions"),
    ("crucible_engine_failures_total", "counter", "Steps that raised.", "failures"),
)


PEAK_KEYS = ("queue_peak", "waiting_peak", "pages_peak")  # sampled by each front


class Histogram:
    def __init__(self, name: str, help_text: str,
                 buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> None:
        self.name = name
        self.help = help_text
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def observe_all(self, values: list[float]) -> None:
        """``observe`` each of ``values`` (a request's inter-token gaps: one call, not one
        per token)."""
        counts, buckets, where, total = self.counts, self.buckets, bisect.bisect_left, self.sum
        for v in values:
            counts[where(buckets, v)] += 1
            total += v  # in order, as observe adds
        self.sum = total
        self.count += len(values)

    def render(self, others: Sequence[list[float]] = ()) -> list[str]:
        """Prometheus lines; ``others``: other fronts' ``state()`` to add in."""
        counts, total, count = list(self.counts), self.sum, self.count
        for o in others:
            counts = [a + b for a, b in zip(counts, o[:-2])]
            total += o[-2]
            count += int(o[-1])
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        acc = 0
        for bound, n in zip(self.buckets, counts):
            acc += n
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {acc}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {count}')
        lines.append(f"{self.name}_sum {total:.6f}")
        lines.append(f"{self.name}_count {count}")
        return lines

    def state(self) -> list[float]:
        """Bucket counts (+Inf last), then the sum and the count: what another front adds."""
        return [*self.counts, self.sum, self.count]


class Metrics:
    def __init__(self) -> None:
        self.ttft = Histogram("crucible_time_to_first_token_seconds",
                              "Submit to first generated token.")
        self.itl = Histogram("crucible_inter_token_latency_seconds",
                             "Gap between consecutive generated tokens of one request.")
        self.e2e = Histogram("crucible_e2e_request_latency_seconds",
                             "Submit to the request's end (finished, aborted or failed).")
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: Counter[str] = Counter()  # by finish reason (stop/length/abort/error)
        self.rejected: Counter[str] = Counter()  # by cause (queue_full/invalid/unauthorized...)

    def observe(self, stream: RequestStream) -> None:
        """Record one request once it has ended (called by the adapter in a ``finally``)."""
        self.prompt_tokens += stream.num_prompt_tokens
        self.generation_tokens += stream.num_output_tokens
        reason = "error" if stream.error is not None else (stream.finish_reason or "abort")
        self.finished[reason] += 1
        if stream.t_first is not None:
            self.ttft.observe(stream.t_first - stream.t_submit)
        self.itl.observe_all(stream.inter_token)
        if stream.t_end is not None:
            self.e2e.observe(stream.t_end - stream.t_submit)

    def reject(self, cause: str) -> None:
        self.rejected[cause] += 1

    def snapshot(self, stats: dict[str, Any]) -> dict[str, Any]:
        """What this front has counted, for the other fronts' /metrics (JSON-able); ``stats``:
        its engine client's, whose peaks and failures are this front's own samples."""
        return {"prompt": self.prompt_tokens, "generation": self.generation_tokens,
                "finished": dict(self.finished), "rejected": dict(self.rejected),
                "hist": [h.state() for h in (self.ttft, self.itl, self.e2e)],
                "peaks": {k: stats.get(k, 0) for k in PEAK_KEYS},
                "failures": stats.get("failures", 0)}

    def render(self, stats: dict[str, Any], *, healthy: bool, queue_bound: int,
               others: Sequence[dict[str, Any]] = ()) -> str:
        """The text of /metrics; ``others``: the other fronts' snapshots (several fronts
        over one engine, server/fronts.py): counters and histograms add, peaks take the
        largest, the engine's gauges and counters are the engine's own."""
        out: list[str] = []
        if others:
            stats = dict(stats)
            for key in PEAK_KEYS:
                stats[key] = max([stats.get(key, 0)] + [o["peaks"][key] for o in others])
            stats["failures"] = stats.get("failures", 0) + sum(o["failures"] for o in others)
        finished, rejected = Counter(self.finished), Counter(self.rejected)
        prompt, generation = self.prompt_tokens, self.generation_tokens
        for o in others:
            finished.update(o["finished"])
            rejected.update(o["rejected"])
            prompt += o["prompt"]
            generation += o["generation"]

        def metric(name: str, kind: str, help_text: str, value: float,
                   labels: dict[str, str] | None = None) -> None:
            if not any(line.startswith(f"# TYPE {name} ") for line in out):
                out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            lab = ",".join(f'{k}="{v}"' for k, v in (labels or {}).items())
            out.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")

        metric("crucible_healthy", "gauge", "1 while the engine loop serves.", int(healthy))
        metric("crucible_queue_bound", "gauge", "Waiting-queue bound (429 beyond it).",
               queue_bound)
        for name, kind, text, key in ENGINE_SERIES:
            metric(name, kind, text, stats.get(key, 0))
        for how in ("decode", "prefill", "mixed"):  # the rest of the steps ran eagerly
            metric("crucible_graph_replays_total", "counter",
                   "Engine steps replayed from a CUDA graph, by graph kind.",
                   stats.get(f"graph_{how}_replays", 0), {"kind": how})
        metric("crucible_graph_captures_total", "counter", "CUDA graphs captured (decode "
               "graphs at start-up, prefill and mixed graphs when a shape recurs).",
               stats.get("graph_captures", 0))
        metric("crucible_graph_capture_seconds_total", "counter",
               "Engine host time in the prefill and mixed graphs' captures.",
               stats.get("graph_capture_ms", 0) / 1000)
        metric("crucible_graph_memory_drops_total", "counter", "CUDA graphs dropped for want "
               "of device memory (a smaller KV pool leaves them room).",
               stats.get("graph_memory_drops", 0))
        metric("crucible_graph_memory_retries_total", "counter", "Engine steps run again "
               "after running out of device memory.", stats.get("graph_memory_retries", 0))
        metric("crucible_graph_memory_bytes", "gauge", "Device bytes the CUDA graphs hold "
               "(each kind's shared pool and logits buffer).", stats.get("graph_memory_bytes", 0))
        metric("crucible_prompt_tokens_total", "counter", "Prompt tokens of ended requests.",
               prompt)
        metric("crucible_generation_tokens_total", "counter",
               "Generated tokens of ended requests.", generation)
        for key, kind, text in (
                ("queries", "counter", "Admissions that looked the prefix cache up."),
                ("hits", "counter", "Admissions that reused cached pages."),
                ("hit_tokens", "counter", "Prompt positions read from the prefix cache."),
                ("admissions", "counter", "Pages published to the prefix cache."),
                ("evictions", "counter", "Cached pages forgotten (reused or over budget)."),
                ("pages", "gauge", "Pages the prefix cache indexes."),
                ("resident_bytes", "gauge", "K/V bytes of the pages it indexes."),
                ("fill_waits", "counter",
                 "Admissions put off while another request computed their prefix.")):
            name = f"crucible_prefix_cache_{key}" + ("_total" if kind == "counter" else "")
            metric(name, kind, text, stats.get(f"cache_{key}", 0))
        for reason in sorted(set(finished) | {"stop", "length", "abort", "error"}):
            metric("crucible_requests_finished_total", "counter", "Ended requests by reason.",
                   finished[reason], {"reason": reason})
        for cause in sorted(set(rejected) | {"queue_full", "invalid"}):
            metric("crucible_requests_rejected_total", "counter",
                   "Requests refused before running, by cause.", rejected[cause],
                   {"cause": cause})
        for i, h in enumerate((self.ttft, self.itl, self.e2e)):
            out.extend(h.render([o["hist"][i] for o in others]))
        return "\n".join(out) + "\n"
