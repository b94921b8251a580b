"""Crucible: a paged-KV LLM generation runtime with bit-for-bit reproducible output."""

__version__ = "0.1.0"

from crucible.api import LLM, SamplingParams  # noqa: E402  (the embedded API)
