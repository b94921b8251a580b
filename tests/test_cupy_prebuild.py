"""The start-up prebuild (backend/cupy_prebuild.py) and the split modules it runs on
(kernels/source.py): without a GPU, on stand-ins for CuPy and NVRTC."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from crucible.backend import cupy_prebuild
from crucible.backend.options import BackendOptions
from crucible.kernels import source

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("n, sizes", [(0, [0]), (1, [1]), (8, [8]), (9, [5, 4]),
                                      (29, [8, 7, 7, 7]), (33, [7, 7, 7, 6, 6])])
def test_split_names_keeps_every_name_once_in_order(n: int, sizes: list[int]) -> None:
    names = tuple(f"k<{i}>" for i in range(n))
    parts = source.split_names(names)
    assert [len(p) for p in parts] == sizes
    assert tuple(x for p in parts for x in p) == names
    assert all(len(p) <= source.SPLIT_NAMES for p in parts)


class _Compiled:
    def __init__(self, name: str, names: tuple[str, ...]) -> None:
        self.name, self.names, self.compiled = name, names, 0

    def get_function(self, kernel: str) -> tuple[str, tuple[str, ...], str]:
        assert kernel in self.names or not self.names, (kernel, self.names)
        return self.name, self.names, kernel

    def compile(self) -> None:
        self.compiled += 1


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[str, ...]]]:
    seen: list[tuple[str, tuple[str, ...]]] = []

    def compile_module(name: str, names: tuple[str, ...] = ()) -> _Compiled:
        seen.append((name, names))
        return _Compiled(name, names)

    monkeypatch.setattr(source, "compile_module", compile_module)
    source._part.cache_clear()
    yield seen
    source._part.cache_clear()


def test_kernel_module_finds_each_kernel_in_its_part_and_builds_a_part_once(
        compiles: list[tuple[str, tuple[str, ...]]]) -> None:
    names = tuple(f"t<{i}>" for i in range(20))
    mod = source.KernelModule("x.cu", source.split_names(names))
    assert mod.get_function("t<0>") == ("x.cu", names[:7], "t<0>")
    assert mod.get_function("t<19>") == ("x.cu", names[14:], "t<19>")
    assert mod.get_function("t<3>")[1] == names[:7]
    assert compiles == [("x.cu", names[:7]), ("x.cu", names[14:])]
    with pytest.raises(KeyError, match="t<20>"):
        mod.get_function("t<20>")
    built = [b() for b in mod.builds()]  # the prebuild's jobs: every part, compiled now
    assert [m.names for m in built] == list(mod.parts) and all(m.compiled == 1 for m in built)
    assert len(compiles) == 3  # the two parts already built are not built again
    plain = source.KernelModule("c.cu", source.split_names(()))  # extern "C" kernels
    assert plain.get_function("rows")[2] == "rows"


def pool_threads_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in CuPy with what a pool thread asks of it: setDevice."""
    fake = type(sys)("cupy")
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(setDevice=lambda d: None))
    monkeypatch.setitem(sys.modules, "cupy", fake)


def test_wait_reports_a_slow_build_once_and_swallows_build_errors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cupy_prebuild, "SLOW_WAIT_S", 0.05)
    gate = threading.Event()
    done: list[int] = []

    def slow() -> None:
        gate.wait(5)
        done.append(1)

    def broken() -> None:
        raise RuntimeError("NVRTC could not build x.cu")

    pool_threads_cupy(monkeypatch)
    said: list[str] = []
    pre = cupy_prebuild.Prebuild([slow, broken, slow], device=0)
    threading.Timer(0.2, gate.set).start()
    waited = pre.wait(said.append)
    assert done == [1, 1] and waited >= 0.1
    assert len(said) == 2 and "building the CUDA kernels" in said[0] and "built in" in said[1]
    assert [str(e) for e in pre.errors()] == ["NVRTC could not build x.cu"]
    assert pre.wait(said.append) < 0.05 and len(said) == 2  # done: no more lines


def test_builds_run_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs that each hold a thread for 0.3 s (as NVRTC does, without the GIL) end together."""
    pool_threads_cupy(monkeypatch)
    monkeypatch.setattr(cupy_prebuild, "_threads", lambda n: n)
    t0 = time.perf_counter()
    pre = cupy_prebuild.Prebuild([lambda: time.sleep(0.3)] * 4, device=0)
    pre.wait(lambda msg: None)
    assert time.perf_counter() - t0 < 1.0  # one after another: 1.2 s


def test_a_process_that_stops_early_does_not_wait_for_the_builds() -> None:
    """A bad model path right after the backend was made: the error, then exit, not a wait
    for NVRTC (the pool's threads are daemons)."""
    code = ("import sys, time, types; from crucible.backend import cupy_prebuild as p; "
            "cupy = types.ModuleType('cupy'); sys.modules['cupy'] = cupy; "
            "cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace("
            "setDevice=lambda d: None)); p.Prebuild([lambda: time.sleep(60)] * 2, 0); "
            "time.sleep(0.2); raise SystemExit('no such model')")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=50, cwd=ROOT)
    assert out.returncode == 1 and "no such model" in out.stderr
    assert time.perf_counter() - t0 < 20  # an executor's threads would hold it for 60 s


# Run in a fresh process: the kernel getters' caches would otherwise hold another test's
# stand-ins, and a cached kernel compiles nothing.
_RECORD = r"""
import json, sys
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/bench"]
import numpy as np, fake_cupy
fake_cupy.install()
from crucible.kernels import source
seen = set()
def compile_module(name, names=()):
    seen.add((name, names))
    return fake_cupy._Module()
def arch_module(name, arch):
    seen.add((name, arch))
    return fake_cupy._Module()
source.compile_module, source.cached_arch_module = compile_module, arch_module
from mixed_step import CASES, PAGES_PER_ROW, make_batch
from common import SMOLLM2
from crucible.backend import cupy_prebuild
from crucible.backend.cupy_backend import CupyBackend
from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model
model = tiny_random_model(seed=1, weights="int8", **{**SMOLLM2, "max_context": 2048})
settings = Settings(device="cuda", gemm=sys.argv[1], graph_warmup=False)
options = settings.backend_options()
planned = {build.args for build in cupy_prebuild.jobs(options)}  # (source, names or arch)
runner = ModelRunner(model, num_pages=PAGES_PER_ROW * 600, device="cuda", settings=settings,
                     backend=CupyBackend(options))
rng = np.random.default_rng(0)
cases = list(CASES) + [("one decode row", 1, (300, 400), ())]  # the decode stack's
for name, d, h, c in cases:
    runner._forward_meta(runner.backend.prepare(make_batch(rng, d, h, c, model.config.vocab_size)))
print(json.dumps({"planned": sorted(map(list, planned)), "used": sorted(map(list, seen))}))
"""


@pytest.mark.parametrize("gemm", ["mma", "fma"])
def test_the_prebuild_covers_every_module_a_forward_compiles(gemm: str) -> None:
    """Eager forwards of the default model's shapes (mixed, prefill, decode, chat steps and
    one decode row), on the stand-in CuPy: every NVRTC program they compile is one the
    prebuild builds, except the fma order's per-shape forms, which stay lazy by design."""
    out = subprocess.run([sys.executable, "-c", _RECORD, gemm, str(ROOT)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    planned = {(n, tuple(x) if isinstance(x, list) else x) for n, x in got["planned"]}
    used = {(n, tuple(x) if isinstance(x, list) else x) for n, x in got["used"]}
    lazy = {u for u in used if u[0] in ("linear_chunks.cu", "linear_wide.cu")}
    assert used, "the forwards compiled nothing: the recorder is broken"
    assert not used - planned - lazy, sorted(used - planned - lazy)
    assert (gemm == "fma") == bool(lazy)  # the fma order's GEMMs are shape forms
    files = {n for n, _ in used}
    assert {"attention.cu", "attention_decode.cu", "model_ops.cu"} <= files
    assert ("linear_wgmma.cu" in files) == (gemm == "mma")  # the stand-in is an sm_90 card


def test_every_cuda_source_is_prebuilt_by_some_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new .cu file must join the prebuild (or the lazy list), or it builds mid-run."""
    fake = type(sys)("cupy")
    fake.cuda = type(sys)("cupy.cuda")
    fake.cuda.Device = lambda *a: type("D", (), {"compute_capability": "90"})()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    files: set[str] = set()
    for gemm in ("mma", "fma"):
        for build in cupy_prebuild.jobs(BackendOptions(gemm=gemm, wgmma=None)):
            files.add(build.args[0])
    lazy = {"linear_chunks.cu", "linear_wide.cu"}
    on_disk = {p.name for p in source.cuda_source_dir().glob("*.cu")}
    assert on_disk - lazy == files
