"""Crucible: a paged-KV LLM generation runtime with bit-for-bit reproducible output."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "Settings", "__version__"]


def __getattr__(name: str) -> Any:
    """``from crucible import LLM`` loads the engine on first use, so importing one
    submodule (the CLI's argument parsing, a tokenizer) does not load all of it."""
    if name in ("LLM", "SamplingParams"):
        from crucible import api

        return getattr(api, name)
    if name == "Settings":
        from crucible.engine.settings import Settings

        return Settings
    raise AttributeError(f"module 'crucible' has no attribute {name!r}")
