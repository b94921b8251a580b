"""The multi-CTA greedy sampler (cuda/sampling_greedy.cu, crucible/kernels/sampling_greedy.py).

On the CPU: greedy_only, the kernel's constants against sampling_meta, its 32-bit key against
sampling_block.cuh's okey, and a numpy model of its slicing (every element seen exactly once
for every alignment head). On a GPU: tokens bit for bit against the one-block sample_rows
and numpy's argmax (lowest id on ties), plus a negative control that must differ.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from crucible.kernels.sampling_greedy import SLICE, THREADS, greedy_only, slices_for
from crucible.step.row_buffer import ROW_WORDS
from crucible.step.rows import MASK, REP, RowSampling, plain_row_sampling, row_sampling
from crucible.engine.sampling import SamplingParams
from crucible.kernels.source import cuda_source_dir

SOURCE = cuda_source_dir() / "sampling_greedy.cu"
VOCABS = (1, 3, 1000, 4097, 49152)


def greedy_row(logits_row: int, **kw) -> RowSampling:
    row = plain_row_sampling(logits_row, SamplingParams(temperature=0.0, **kw), num_output=0,
                             seed=7)
    assert row is not None
    return row


# ---- CPU ------------------------------------------------------------------------------------
def test_greedy_only_true_cases() -> None:
    assert greedy_only([greedy_row(0)])
    assert greedy_only([greedy_row(i, top_k=5, top_p=0.5) for i in range(3)])
    # Penalty fields without entries (nothing in the history): sample_rows' plain branch.
    params = SamplingParams(temperature=0.0, repetition_penalty=1.3)
    assert greedy_only([row_sampling(0, params, prompt=[], output=[], seed=1, stop_ids=(),
                                     vocab_size=10)])


def test_greedy_only_false_cases() -> None:
    assert not greedy_only([])
    assert not greedy_only([greedy_row(0), plain_row_sampling(
        1, SamplingParams(temperature=0.7), num_output=0, seed=1)])
    assert not greedy_only([greedy_row(0, logprobs=0)])
    pen = row_sampling(0, SamplingParams(temperature=0.0, repetition_penalty=1.3),
                       prompt=[3, 4], output=[], seed=1, stop_ids=(), vocab_size=10)
    assert pen.entry_flags.tolist() == [REP, REP] and not greedy_only([greedy_row(1), pen])
    masked = row_sampling(0, SamplingParams(temperature=0.0, min_tokens=2), prompt=[1],
                          output=[], seed=1, stop_ids=(2,), vocab_size=10)
    assert masked.entry_flags.tolist() == [MASK] and not greedy_only([masked])


def test_kernel_constants_match_the_python_side() -> None:
    src = SOURCE.read_text()
    define = {m[1]: int(m[2]) for m in re.finditer(r"#define (\w+) (\d+)", src)}
    assert define["GREEDY_ROW_WORDS"] == ROW_WORDS
    assert define["GREEDY_LOGITS_ROW"] == 12  # sampling_meta's record: word 12, logits row
    assert define["GREEDY_THREADS"] == THREADS
    assert SLICE == THREADS * 4 * define["GREEDY_ITEMS"]
    assert slices_for(49152) == 24 and slices_for(1) == slices_for(2048) == 1
    assert slices_for(2049) == 2


def pack32(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """greedy_pack: the folded, sign-flipped f32 pattern over ~id."""
    b = np.asarray(x, np.float32).view(np.uint32).copy()
    b[b == 0x80000000] = 0
    k = np.where(b >> 31 == 1, ~b, b | np.uint32(0x80000000)).astype(np.uint64)
    return (k << np.uint64(32)) | (~ids.astype(np.uint32)).astype(np.uint64)


def okey64(x: np.ndarray) -> np.ndarray:
    """sampling_block.cuh's okey of (double)x."""
    b = (np.asarray(x, np.float32).astype(np.float64) + 0.0).view(np.uint64)
    return np.where(b >> np.uint64(63) == 1, ~b, b | np.uint64(1 << 63))


def special_values() -> np.ndarray:
    tiny = np.float32(1e-45)  # the smallest denormal: must not tie with zero
    return np.array([0.0, -0.0, tiny, -tiny, 1e-38, -1e-38, 1.0, -1.0, np.inf, -np.inf,
                     3.4e38, -3.4e38, np.nextafter(np.float32(1), np.float32(2))], np.float32)


def test_key_orders_as_okey() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([special_values(), rng.standard_normal(4000).astype(np.float32),
                        rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32)])
    x = x[~np.isnan(x)]
    k32 = pack32(x, np.zeros(x.size, np.int64)) >> np.uint64(32)
    k64 = okey64(x)
    i, j = rng.integers(0, x.size, (2, 50_000))
    assert np.array_equal(k32[i] < k32[j], k64[i] < k64[j])
    assert np.array_equal(k32[i] == k32[j], k64[i] == k64[j])


def emulate(row: np.ndarray, mis: int, pack=None, slice_len: int = SLICE) -> int:
    """The kernel's partition and combine for a row starting `mis` bytes past 16: the max
    packed word (decode the token as ~low half)."""
    pack = pack or pack32
    V = row.size
    head = min(V, ((16 - mis) & 15) >> 2)
    seen = np.zeros(V, np.int64)
    parts = []
    for s in range(slices_for(V, slice_len)):
        lo = head + s * slice_len
        hi = min(V, lo + slice_len)
        nq = (hi - lo) >> 2 if hi > lo else 0
        idx = [np.arange(lo, lo + 4 * nq), np.arange(lo + 4 * nq, max(hi, lo + 4 * nq))]
        if s == 0:
            idx.append(np.arange(head))
        ids = np.concatenate(idx).astype(np.int64)
        seen[ids] += 1
        parts.append(pack(row[ids], ids).max(initial=np.uint64(0)))
    assert (seen == 1).all(), "every element exactly once"
    return int(max(parts))


def token(packed: int) -> int:
    return (~packed) & 0xFFFFFFFF if packed else -1


@pytest.mark.parametrize("vocab", VOCABS + (4, 2047, 2048, 2049, 6150))
def test_slicing_model_equals_argmax(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    for trial in range(6):
        row = rng.standard_normal(vocab).astype(np.float32)
        if trial >= 2:  # ties at the max, spread over slices and the tail
            row[rng.integers(0, vocab, 1 + vocab // 500)] = row.max()
        if trial == 4:
            row[:] = -np.inf
        if trial == 5:
            row[:] = np.where(rng.random(vocab) < 0.5, -0.0, 0.0).astype(np.float32)
        for mis in (0, 4, 8, 12):
            assert token(emulate(row, mis)) == int(np.argmax(row.astype(np.float64) + 0.0))


def test_slicing_model_negative_control() -> None:
    """A highest-id tie-break (the id itself in the low half, not ~id) gives another token
    on a tied row; an unfolded -0.0 too: the checks above can tell these bugs apart."""
    row = np.zeros(4097, np.float32)
    row[[5, 3000, 4096]] = 2.0

    def pack_hi(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return (pack32(x, ids) & np.uint64(0xFFFFFFFF00000000)) | ids.astype(np.uint64)

    assert token(emulate(row, 4)) == 5
    assert emulate(row, 4, pack_hi) & 0xFFFFFFFF == 4096
    zeros = np.array([-0.0, 0.0, -1.0], np.float32)

    def pack_unfolded(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        k = np.where(x.view(np.uint32) >> 31 == 1, ~x.view(np.uint32),
                     x.view(np.uint32) | np.uint32(0x80000000)).astype(np.uint64)
        return (k << np.uint64(32)) | (~ids.astype(np.uint32)).astype(np.uint64)

    assert token(emulate(zeros, 0)) == 0 and token(emulate(zeros, 0, pack_unfolded)) == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_nvcc_sm90_no_spills(tmp_path: Path) -> None:
    result = subprocess.run(
        ["nvcc", "-arch=sm_90", "-Xptxas", "-v", "-std=c++17", f"-I{cuda_source_dir()}", "-c",
         str(SOURCE), "-o", str(tmp_path / "g.o")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Compiling entry function 'greedy_rows'" in result.stderr
    assert re.search(r" 0 bytes spill stores, 0 bytes spill loads", result.stderr), result.stderr
    assert "bytes stack frame" in result.stderr and " 0 bytes stack frame" in result.stderr


# ---- GPU ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu():
    from crucible.kernels.sampling_greedy import GreedyLauncher
    from crucible.backend.cupy_sampling import CupySampler

    return GreedyLauncher(), CupySampler(split_greedy=False)  # the one-block path as reference


def check_rows(gpu, logits: np.ndarray, order: list[int], device_logits=None) -> np.ndarray:
    import cupy as cp

    launcher, sampler = gpu
    rows = [greedy_row(i) for i in order]
    d = cp.asarray(logits) if device_logits is None else device_logits
    got = launcher.tokens(d, rows)
    # The lowest id of the largest order key, in integer arithmetic: a float compare on the
    # host would follow the CPU's denormal mode (flush-to-zero libraries set it process-wide).
    def first_max(row: np.ndarray) -> int:
        k = pack32(row, np.zeros(row.size, np.int64)) >> np.uint64(32)
        return int(np.flatnonzero(k == k.max())[0])

    ref = np.array([first_max(logits[i]) for i in order])
    one_block = np.array(sampler.sample(d, rows).token_ids)
    assert np.array_equal(got, ref), (got, ref)
    # The one-block path flushes f32 denormals to zero on the H200 (its f64 keys tie a
    # denormal with 0.0); this kernel orders them as the host's f64 values do. Real logits are
    # never denormal: compare the paths on the other rows.
    normal = [k for k, i in enumerate(order)
              if not ((logits[i] != 0) & (np.abs(logits[i]) < np.finfo(np.float32).tiny)).any()]
    assert np.array_equal(got[normal], one_block[normal]), (got, one_block)
    assert not cp.asnumpy(launcher._counters).any(), "counters must be back at zero"
    return got


def planted(vocab: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random rows, then rows whose max sits where slicing could lose it."""
    x = rng.standard_normal((n, vocab)).astype(np.float32)
    spots = [0, vocab - 1, max(0, vocab - 3), (slices_for(vocab) - 1) * SLICE % vocab]
    for k in range(1, n):
        j = spots[k % len(spots)] if k % 5 else int(rng.integers(0, vocab))
        x[k, j] = 10.0 + k
        if k % 3 == 0:  # many exact ties at the max: the lowest id must win
            x[k, rng.integers(0, vocab, 1 + vocab // 300)] = 10.0 + k
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("nrows", (1, 3, 64))
def test_gpu_equals_one_block_and_argmax(gpu, vocab: int, nrows: int) -> None:
    rng = np.random.default_rng(vocab * 100 + nrows)
    logits = planted(vocab, nrows + 2, rng)
    order = list(rng.permutation(nrows + 2)[:nrows])  # meta rows point at other logits rows
    check_rows(gpu, logits, order)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", VOCABS)
def test_gpu_signed_zeros_specials_and_misaligned_rows(gpu, vocab: int) -> None:
    import cupy as cp

    rng = np.random.default_rng(vocab)
    x = -np.abs(rng.standard_normal((6, vocab))).astype(np.float32) - 1
    x[0, -1], x[0, 0] = 0.0, -0.0  # -0.0 ties +0.0: element 0 wins
    x[1, :] = np.where(rng.random(vocab) < 0.5, -0.0, 0.0).astype(np.float32)
    x[2, :] = -np.inf
    x[3, -1], x[3, vocab // 2] = 1e-45, 0.0  # a denormal beats zero
    x[4, :] = np.inf
    x[5, rng.integers(0, vocab, 3)] = 3.4e38
    order = [5, 4, 3, 2, 1, 0]
    check_rows(gpu, x, order)
    # A view one element into a buffer: every row starts off the 16-byte grid.
    buf = cp.empty(x.size + 1, cp.float32)
    view = buf[1:].reshape(x.shape)
    view[...] = cp.asarray(x)
    assert view.flags.c_contiguous and view.data.ptr % 16 == 4
    check_rows(gpu, x, order, device_logits=view)


@pytest.mark.gpu
def test_gpu_relaunch_and_growth(gpu) -> None:
    rng = np.random.default_rng(9)
    for vocab, n in ((49152, 3), (49152, 3), (1000, 64), (4097, 130), (49152, 1)):
        x = planted(vocab, n, rng)
        check_rows(gpu, x, list(range(n))[::-1])


@pytest.mark.gpu
def test_gpu_negative_control_highest_id_differs(gpu) -> None:
    x = np.zeros((1, 49152), np.float32)
    x[0, [17, 20000, 49151]] = 5.0
    got = check_rows(gpu, x, [0])
    highest = int(np.flatnonzero(x[0] == x[0].max())[-1])
    assert got[0] == 17 and highest == 49151 and got[0] != highest


@pytest.mark.gpu
def test_gpu_without_metadata_reads_row_i() -> None:
    """meta = None (a decode step: row i samples logits row i) == the same rows spelled out."""
    import cupy as cp

    from crucible.kernels.sampling_greedy import GreedyLauncher
    from crucible.step.row_buffer import pack_rows

    x = planted(49152, 5, np.random.default_rng(3))
    d = cp.asarray(x)
    g = GreedyLauncher()
    with_meta, without = cp.empty(5, cp.int32), cp.empty(5, cp.int32)
    g.launch(d, cp.asarray(pack_rows([greedy_row(i) for i in range(5)], 5, 49152)), 5, with_meta)
    g.launch(d, None, 5, without)
    assert cp.asnumpy(without).tolist() == cp.asnumpy(with_meta).tolist() \
        == [int(np.argmax(r)) for r in x]
