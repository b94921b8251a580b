"""Counter-based randomness: the draw for a request's n-th token is a pure function of (seed, n).

Nothing is carried from one step to the next, so batch composition, chunking, packing order
and preemption (which recomputes a request from scratch) can never change a draw.

The exact definition (a GPU sampler must reproduce it bit for bit; all arithmetic is
unsigned 64-bit, wrapping):

    GOLDEN = 0x9E3779B97F4A7C15
    def mix(z):                      # SplitMix64 finaliser
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)
    bits(seed, n)    = mix(seed + (n + 1) * GOLDEN)   # the n-th output of SplitMix64(seed)
    uniform(seed, n) = (bits(seed, n) >> 11) * 2**-53  # an f64 in [0, 1), 53 random bits

``seed`` is first reduced to 64 bits (``seed & (2**64 - 1)``; negative seeds wrap the same
way). ``n`` counts the request's generated tokens from 0: the first output token uses n = 0.

Requests without a seed get one from ``derive_seed(base, counter)`` =
``bits(base, counter)``, where ``counter`` is the engine's running count of requests added:
reproducible for the same arrival sequence in a fresh engine, different for each request.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
_INV_2_53 = 1.0 / (1 << 53)


def mix64(z: int) -> int:
    """SplitMix64's finaliser on a 64-bit integer."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def random_bits(seed: int, n: int) -> int:
    """The n-th (0-based) 64-bit output of a SplitMix64 stream started at ``seed``."""
    if n < 0:
        raise ValueError(f"draw counter must be >= 0, got {n}")
    return mix64((seed & MASK64) + (n + 1) * GOLDEN)


def uniform(seed: int, n: int) -> float:
    """The uniform draw in [0, 1) for a request's n-th generated token."""
    return (random_bits(seed, n) >> 11) * _INV_2_53


def derive_seed(base: int, counter: int) -> int:
    """A per-request seed for requests that did not ask for one (see module docstring)."""
    return random_bits(base, counter)
