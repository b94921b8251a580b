"""gpu-sampling's harness on the CPU, with the numpy twin standing in for the device.

The twin is the host sampler, so every section must pass; negative controls give the
harness a sampler with a realistic bug and the check must count failures.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

FIRST_TIER = 256  # cuda/sampling_block.cuh: the candidates sorted first

from crucible.step.rows import SampleOutput
from crucible.checks.batch_check import Counts
from crucible.checks.sampling_cases import chi_square_p
from crucible.checks.sampling_check import (Harness, check_batch, check_matrix, check_narrow,
                                            check_rng, run)
from crucible.engine.runner import ModelRunner
from crucible.model.tiny import tiny_random_model
from sampler_twin import NumpyTwinSampler, one_rank_late

ARGS = argparse.Namespace(seed=0, quick=True, vocab=2049, rows=16)


def harness(sampler=None) -> Harness:
    s = sampler or NumpyTwinSampler()
    return Harness(s, s.to_device, s.draws, on_gpu=False)


def make_runner(device_sampling: bool) -> ModelRunner:
    r = ModelRunner(tiny_random_model(seed=3), num_pages=64, device="cpu")
    if device_sampling:
        r.sampler = NumpyTwinSampler()
    return r


def test_harness_passes_with_the_twin(capsys) -> None:
    assert run(harness(), ARGS, make_runner) == 0
    out = capsys.readouterr().out
    for section in ("rng:", "greedy:", "matrix tied:", "paths:", "batch:", "chi2 T=1.0",
                    "negative control", "engine:"):
        assert section in out
    assert " 0 failed, 0 boundary mismatches allowed" in out


class OffByOneSeed(NumpyTwinSampler):
    def sample(self, logits, rows):
        return super().sample(logits, [dataclasses.replace(r, seed=r.seed ^ 1) for r in rows])


class BatchDependent(NumpyTwinSampler):
    """Perturbs rows by their position in the batch: what a shared reduction would do."""

    def sample(self, logits, rows):
        out = super().sample(logits, rows)
        lps = [None if lp is None else {k: v + 1e-12 * i for k, v in lp.items()}
               for i, lp in enumerate(out.logprobs)]
        return SampleOutput(out.token_ids, tuple(lps))


class SloppyLogprobs(NumpyTwinSampler):
    def sample(self, logits, rows):
        out = super().sample(logits, rows)
        lps = [None if lp is None else {k: v * (1 + 1e-8) for k, v in lp.items()}
               for lp in out.logprobs]
        return SampleOutput(out.token_ids, tuple(lps))


class LateDeepDraws(NumpyTwinSampler):
    """Draws that land past the first 256 candidates come out one rank late: what a
    narrowing that misplaced the crossing inside its window would give."""

    def sample(self, logits, rows):
        out = super().sample(logits, rows)
        ids = [one_rank_late(logits[row.logits_row], row.temperature, t, FIRST_TIER)
               if row.temperature > 0 else t for row, t in zip(rows, out.token_ids)]
        return SampleOutput(tuple(ids), out.logprobs)


def test_narrow_section_catches_a_late_deep_draw() -> None:
    """check_narrow's rows do land past the first 256 (else it tests nothing of the
    narrowing), and a draw one rank late there is counted as a failure."""
    c = Counts()
    check_narrow(harness(), c, np.random.default_rng(5), 4096, quick=False)
    assert c.failed == 0 and c.passed > 0
    c = Counts()
    check_narrow(harness(LateDeepDraws()), c, np.random.default_rng(5), 4096, quick=False)
    assert c.failed > 20


def test_negative_controls_are_counted() -> None:
    rng = np.random.default_rng(0)
    c = Counts()
    check_matrix(harness(OffByOneSeed()), c, rng, 2049, 16, quick=True)
    assert c.failed > 10  # other draws
    c = Counts()
    check_matrix(harness(SloppyLogprobs()), c, rng, 2049, 16, quick=True)
    assert c.failed > 5  # logprobs off by 1e-8 relative
    c = Counts()
    check_batch(harness(BatchDependent()), c, rng, 2049, [1, 2, 17])
    assert c.failed > 0  # a row's bits moved with its position
    bad = harness()
    bad.draws = lambda seeds, ns: (lambda b, u: (b ^ np.uint64(1), u))(*harness().draws(seeds, ns))
    c = Counts()
    check_rng(bad, c, rng, 500)
    assert c.failed == c.passed + c.failed > 0


@pytest.mark.parametrize("stat, dof, want", [(9.87, 7, 0.19606093787809), (2.55, 2, 0.2794309682214),
                                             (30.0, 7, 9.495972508134e-05), (0.5, 3, 0.91889141165468),
                                             (100.0, 50, 3.454931382985e-05), (0.0, 4, 1.0)])
def test_chi_square_p_values(stat, dof, want) -> None:
    assert chi_square_p(stat, dof) == pytest.approx(want, rel=1e-9)
