"""One RoPE table for every backend: computed in float64, rounded once to f32.

Indexing by absolute position (never by row or chunk offset) is what makes a row's rotation
independent of how the prompt was split.
"""

from __future__ import annotations

import numpy as np


def rope_table(max_positions: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [max_positions, head_dim // 2], f32."""
    half = head_dim // 2
    inv_freq = 1.0 / (float(theta) ** (np.arange(half, dtype=np.float64) * 2.0 / head_dim))
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
