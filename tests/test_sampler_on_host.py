"""The device sampler's own source (cuda/sampling.cu and its headers) run on the CPU under
tests/cuda_host/prelude.h, checked against the host sampler with gpu-sampling's sections.

Each ``sample()`` call writes the logits and ``pack_rows``'s metadata to a file, runs
``sampling_driver`` (sample_rows over a few CTAs of 512 threads, one after another) and
reads back the ids, route flags and logprob words, so the same harness that checks the
GPU checks the kernel's index arithmetic, radix selects, sorts, banded decisions and the
narrowing (cuda/sampling_narrow.cuh) here, without a GPU. A vocabulary of 4,096 keeps
every route reachable (K > CAP = 2,048) and the run short. What the host cannot show (the
GPU's exp, memory ordering, speed) is gpu-sampling's on the H200.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from host_driver import build
from sampler_twin import one_rank_late

from crucible.backend.cupy_sampling import unpack_logprobs
from crucible.checks.batch_check import Counts
from crucible.checks.sampling_check import Harness, check_batch, check_narrow
from crucible.step.row_buffer import LP_WORDS, pack_rows
from crucible.step.rows import RowSampling, SampleOutput

VOCAB = 4096


class ShimSampler:
    """CupySampler's ``sample``/``last_paths`` surface over the host-run kernel."""

    name = "host-shim"

    def __init__(self, exe: Path, work: Path, slots: int = 3) -> None:
        self.exe, self.work, self.slots = exe, work, slots
        self._paths = np.zeros(0, np.int32)

    def sample(self, logits: Any, rows: Sequence[RowSampling]) -> SampleOutput:
        logits = np.ascontiguousarray(logits, np.float32)
        meta = pack_rows(rows, logits.shape[0], logits.shape[1]).astype(np.int64)
        r = len(rows)
        src, dst = self.work / "in.bin", self.work / "out.bin"
        head = np.array([logits.shape[1], r, logits.shape[0], meta.size], np.int32)
        src.write_bytes(head.tobytes() + logits.tobytes() + meta.tobytes())
        run = subprocess.run([str(self.exe), str(src), str(dst), str(self.slots)],
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        raw = dst.read_bytes()
        ids = np.frombuffer(raw, np.int32, r)
        self._paths = np.frombuffer(raw, np.int32, r, 4 * r).copy()
        lp = np.frombuffer(raw, np.int64, r * LP_WORDS, 8 * r).reshape(r, LP_WORDS)
        return SampleOutput(tuple(int(t) for t in ids), tuple(unpack_logprobs(lp, rows)))

    def last_paths(self) -> np.ndarray:
        return self._paths


def shim_harness(sampler: ShimSampler) -> Harness:
    """gpu-sampling's harness over the host-run kernel (no rng section: no draws hook)."""
    return Harness(sampler, lambda x: x, lambda *a: (None, None), on_gpu=False)


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    work = tmp_path_factory.mktemp("sampling_driver")
    return shim_harness(ShimSampler(build("sampling_driver.cpp", work), work))


def test_narrowed_draws_equal_the_host_sampler(shim: Harness, capsys) -> None:
    """One row per grid point (T x top_k x min_p, flat and tied logits): the section fails
    unless some row was decided by narrowing, so the route ran."""
    c = Counts()
    check_narrow(shim, c, np.random.default_rng(4), VOCAB, quick=True, per_point=1)
    out = capsys.readouterr().out
    assert c.failed == 0 and c.passed > 0 and "decided by narrowing" in out, out[-3000:]


def test_a_row_alone_equals_it_inside_batches(shim: Harness) -> None:
    """gpu-sampling's needles (greedy with logprobs, penalties with top-k/top-p, T = 1,
    ties, top_k 3000, min_p with logprobs) alone and inside batches of 3 over 3 CTAs."""
    c = Counts()
    check_batch(shim, c, np.random.default_rng(3), VOCAB, [1, 3])
    assert c.failed == 0 and c.passed > 0



class LateNarrowed(ShimSampler):
    """The host-run kernel's narrowed rows (route 32) answered one rank late, in the host's
    candidate order: what a window off by one would give."""

    def sample(self, logits: Any, rows: Sequence[RowSampling]) -> SampleOutput:
        out = super().sample(logits, rows)
        ids = list(out.token_ids)
        for i in np.nonzero(self._paths & 32)[0]:
            ids[i] = one_rank_late(logits[rows[i].logits_row], rows[i].temperature, ids[i])
        return SampleOutput(tuple(ids), out.logprobs)


def test_negative_control_a_late_narrowed_draw_fails(shim: Harness) -> None:
    """The same check over the kernel's narrowed answers moved one rank late counts them
    as failures, so the check above can fail."""
    s = shim.sampler
    late = shim_harness(LateNarrowed(s.exe, s.work, s.slots))
    c = Counts()
    check_narrow(late, c, np.random.default_rng(4), VOCAB, quick=True, per_point=1)
    assert c.failed >= 5
