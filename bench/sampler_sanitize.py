"""A small device-sampler case to run under compute-sanitizer (memcheck, racecheck, synccheck).

    compute-sanitizer --tool racecheck python3 bench/sampler_sanitize.py

Four rows each of flat logits (draws past the first 256: the narrowing, route 32), tied
logits (ranges of equal keys past 2048: narrowing, then the full-row sort, route 33) and
chat-like logits (decided in the first 256, route 0); T 0.7-1.7, top_k off or 3,000
(route 4). Prints each kind's ids and routes.
"""
import numpy as np
import cupy as cp

from crucible.backend.cupy_sampling import CupySampler
from crucible.checks.sampling_cases import case, make_logits

rng = np.random.default_rng(1)
V = 49152
s = CupySampler()
for kind in ("random", "tied", "chatlike"):
    logits = make_logits(kind, 3, V, rng)
    cases = [case(kind, r % 3, logits, rng, temperature=t, top_k=k)
             for r, (t, k) in enumerate([(1.0, None), (0.7, None), (1.7, 3000), (1.0, None)])]
    got = s.sample(cp.asarray(logits), [c.sampling(V) for c in cases])
    print(kind, got.token_ids, s.last_paths().tolist())
