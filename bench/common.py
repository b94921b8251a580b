"""What every benchmark script writes the same way: median/min-max summaries and the JSON."""

from __future__ import annotations

import json
import statistics

# The default model's geometry (SmolLM2-135M), for benches on random weights of its shapes.
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, n_layers=30, n_heads=9, n_kv_heads=3,
               head_dim=64, ffn_size=1536, max_context=8192, rope_theta=100000.0)


def stat(values: list[float]) -> dict[str, float]:
    """Median and min-max over rounds (the figures the docs quote)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def write_json(path: str, result: dict) -> None:
    """Write the result where asked and echo it, so a remote run's log holds it too."""
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
