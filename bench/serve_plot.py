"""Plots for the load generator: latency CDFs and throughput over time.

matplotlib is not a dependency. When it imports, it draws labelled figures; otherwise a
small stdlib rasterizer (zlib + struct PNG) draws the same curves: axes from zero with their
end values, and a legend of numbered colour swatches; the JSON names series 0, 1, ... in
``series_colour_order``.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]
Series = dict[str, list[tuple[float, float]]]
# A 3x5 bitmap font for axis numbers and legend indices (rows top to bottom, 3 bits each).
_GLYPHS = {"0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7),
           "3": (7, 1, 7, 1, 7), "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7),
           "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1), "8": (7, 5, 7, 5, 7),
           "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), " ": (0, 0, 0, 0, 0)}


def _png(path: Path, w: int, h: int, pixels: bytearray) -> None:
    rows = b"".join(b"\x00" + bytes(pixels[y * w * 3:(y + 1) * w * 3]) for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(
            ">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2,
                                                                        0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def _raster(path: Path, series: Series, w: int = 640, h: int = 400) -> dict[str, float]:
    px = bytearray(b"\xff" * (w * h * 3))
    pad = 30
    xs = [x for pts in series.values() for x, _ in pts] or [1.0]
    ys = [y for pts in series.values() for _, y in pts] or [1.0]
    xmax, ymax = max(xs) or 1.0, max(ys) or 1.0

    def put(x: int, y: int, c: tuple[int, int, int]) -> None:
        if 0 <= x < w and 0 <= y < h:
            i = (y * w + x) * 3
            px[i:i + 3] = bytes(c)

    def line(x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(n + 1):
            x, y = x0 + (x1 - x0) * k // n, y0 + (y1 - y0) * k // n
            put(x, y, c)
            put(x, y + 1, c)

    def to_px(x: float, y: float) -> tuple[int, int]:
        return (pad + int(x / xmax * (w - 2 * pad)), h - pad - int(y / ymax * (h - 2 * pad)))

    def text(x: int, y: int, s: str, c: tuple[int, int, int] = (0, 0, 0), k: int = 2) -> None:
        for ch in s:
            for row, bits in enumerate(_GLYPHS.get(ch, _GLYPHS[" "])):
                for col in range(3):
                    if bits >> (2 - col) & 1:
                        for dy in range(k):
                            for dx in range(k):
                                put(x + col * k + dx, y + row * k + dy, c)
            x += 4 * k

    line(pad, h - pad, w - pad, h - pad, (0, 0, 0))
    line(pad, pad, pad, h - pad, (0, 0, 0))
    text(w - pad - 40, h - pad + 8, f"{xmax:.6g}")  # x axis end value
    text(2, pad - 14, f"{ymax:.6g}")  # y axis end value
    for i, pts in enumerate(series.values()):
        c = COLOURS[i % len(COLOURS)]
        for dy in range(8):  # legend: series number i in its colour, top right
            for dx in range(8):
                put(w - 60 + dx, pad + 14 * i + dy, c)
        text(w - 48, pad + 14 * i - 1, str(i), c)
        for (a, b) in zip(pts, pts[1:]):
            line(*to_px(*a), *to_px(*b), c)
    _png(path, w, h, px)
    return {"x_max": xmax, "y_max": ymax}


def plot(path: Path, series: Series, title: str, xlabel: str, ylabel: str) -> dict:
    """Draw ``series`` into ``path`` (PNG); returns how it was drawn (for the JSON)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        ranges = _raster(path, series)
        return {"file": path.name, "renderer": "stdlib", "series_colour_order": list(series),
                **ranges, "x": xlabel, "y": ylabel, "title": title}
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {"file": path.name, "renderer": "matplotlib", "title": title}


def cdf(values_ms: list[float]) -> list[tuple[float, float]]:
    v = sorted(values_ms)
    return [(x, (i + 1) / len(v)) for i, x in enumerate(v)]


def throughput_over_time(chunk_times: list[float], bucket_s: float = 0.5
                         ) -> list[tuple[float, float]]:
    """Text chunks (about one token each) per second, in buckets of ``bucket_s``."""
    if not chunk_times:
        return []
    n = int(max(chunk_times) / bucket_s) + 1
    counts = [0] * n
    for t in chunk_times:
        counts[int(t / bucket_s)] += 1
    return [((i + 0.5) * bucket_s, c / bucket_s) for i, c in enumerate(counts)]
