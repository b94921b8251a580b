"""Crucible: a paged-KV LLM generation runtime with bit-for-bit reproducible output."""

__version__ = "0.1.0"
