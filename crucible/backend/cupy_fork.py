"""A mixed step's two attention launches side by side, on two streams.

A mixed step's attention is two launches (kernels/attention.py, ``paged_attention_mixed``):
the tiled kernel over the prefill slices, then attn_decode over the decode rows. On one
stream the second waits for the first: attn_decode is a PDL launch, so its CTAs may start
once the first launch's last wave is resident, but each stops at its PDL wait until that
launch has finished. So the decode rows' bandwidth-bound work and the slices'
latency-bound work never share the machine, and each launch's last, partly filled wave
leaves SMs idle. Under chat load both are large (bench/mixed-step-chat-h100.json: ~250 decode
rows beside ~600 prompt tokens a step, attention ~60% of the step).

``Fork`` puts the slices' launch on a side stream, forked from the step's stream after
the K/V store and joined back before O reads the output; the decode launch stays on the
step's stream, its PDL wait now on the K/V store alone. Inside a CUDA graph capture the
fork and join are edges, so a replay runs the two as sibling nodes.

Bits: each launch writes only its own segments' rows of ``out`` and both read only K/V
stored before the fork, so their order changes no value; tests/test_gpu_attention_fork.py
compares graphs and eager steps with the fork on and off bit for bit.
On by default (``Settings.attention_fork``, ``CRUCIBLE_ATTENTION_FORK=0`` turns it off).
Measured in mixed-graph replays (bench/attention_fork.py, H100, random weights of the
default model's shapes, logits identical): chat steps of 250 decode rows beside ~600
prompt tokens 0.88-0.92x the one-stream time, cohorts 0.93x, a lone joiner 0.74x. Through
HTTP, the chat mix at 256 streaming clients (bench/attention-fork-serve-ab-h100.json, A B
B A in fresh servers): 1.138x the output tok/s [1.128-1.149], gap p50 0.85x.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

A = TypeVar("A")
B = TypeVar("B")


class Fork:
    """A side stream and the two events that fork it from, and join it to, the caller's
    current stream. One per backend; reused by every layer (a wait takes the event's last
    record at the time it is enqueued, so reuse orders nothing wrongly)."""

    def __init__(self) -> None:
        import cupy as cp

        self.side = cp.cuda.Stream(non_blocking=True)
        self._go = cp.cuda.Event(disable_timing=True)
        self._done = cp.cuda.Event(disable_timing=True)
        self.forks = 0  # how many times it ran (tests: the fork was taken)

    def __call__(self, side_work: Callable[[], A], main_work: Callable[[], B]) -> tuple[A, B]:
        """``side_work`` on the side stream after everything queued so far on the current
        one, ``main_work`` on the current stream; the current stream then waits for both."""
        import cupy as cp

        main = cp.cuda.get_current_stream()
        self._go.record(main)
        self.side.wait_event(self._go)
        with self.side:
            a = side_work()
        b = main_work()
        self._done.record(self.side)
        main.wait_event(self._done)
        self.forks += 1
        return a, b


def fork_for(backend: Any, meta: Any) -> Fork | None:
    """The backend's Fork for a mixed step (``meta.mixed``) where its options ask for one
    (made on first use), else None. Read at each step's attention, and so when a mixed
    graph is captured."""
    if meta.mixed is None or not backend.options.attention_fork:
        return None
    fork = backend.__dict__.get("_fork")
    if fork is None:
        fork = backend._fork = Fork()
    return fork
