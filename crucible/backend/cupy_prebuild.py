"""Build the CUDA kernels a backend will use at start-up, side by side, while the model loads.

On a host whose kernel caches are empty (a fresh install, a new CUDA or a changed source),
NVRTC builds each module the first time one of its kernels is wanted, one after another on
the thread that wants it: a fresh H100 host answered its first ``/health`` after 65.4 s,
where a warm one takes 6-7 s (docs/first-minute.md). NVRTC's compile releases the GIL
(CuPy calls ``nvrtcCompileProgram`` without it), so the builds can run on a thread pool;
modules of many templates are split into parts (``source.SPLIT_NAMES``) so that one long
build does not bound the rest. With warm caches every job is a disk read and a module load.

``start(options)`` is called where the backend is made (``select.make_backend``), before the
model loads, and ``CupyBackend.load_weights`` waits for the same builds (memoized per options
and device), so the first launch finds every module built. A build error is not raised
here: the kernel's own getter raises it with NVRTC's log when the kernel is first used
(the warpgroup GEMMs' auto mode falls back on it with a warning).

Modules built only for the shapes a run meets (linear_chunks.cu and linear_wide.cu, one
program per form, in the fma order) stay lazy: their forms depend on the step shapes.
"""

from __future__ import annotations

import functools
import queue
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from typing import Any, Callable

from crucible.backend.cores import available_cores
from crucible.backend.options import BackendOptions

SLOW_WAIT_S = 1.0  # a wait longer than this says so on stderr, as the model's preparation does


def jobs(options: BackendOptions) -> list[Callable[[], Any]]:
    """One call per NVRTC program that a backend built with ``options`` uses."""
    from crucible.backend import cupy_sampling
    from crucible.kernels import decode_stack, linear, linear_mma, linear_rows, loader
    from crucible.kernels import linear_wgmma, model_ops, sampling_greedy

    modules = [loader.attention_module(), loader.decode_module(), model_ops.module(),
               cupy_sampling.module(), sampling_greedy.module()]
    if options.decode_stack:
        modules.append(decode_stack.module())
    mma = options.gemm == "mma"
    modules += list(linear_mma.modules()) if mma else [linear_rows.module(), linear.module()]
    out = [build for m in modules for build in m.builds()]
    if mma and options.decode_stack:  # the stack's QKV in the mma order, of the fma rows' module
        out += linear_rows.module().builds((linear_rows.MMA_QKV,))
    if mma and options.wgmma is not False and _compute_capability() == "90":
        out += linear_wgmma.builds()
    return out


def _compute_capability() -> str:
    import cupy

    return str(cupy.cuda.Device().compute_capability)


def _threads(n_jobs: int) -> int:
    """One thread a build, up to the cores this process may use (a container's CPU quota
    included): each NVRTC build holds its own memory while it runs."""
    return max(1, min(n_jobs, available_cores()))


class Prebuild:
    """The builds of one options set, running on a pool of their own."""

    def __init__(self, builds: list[Callable[[], Any]], device: int) -> None:
        self.threads = _threads(len(builds))
        self.started = time.perf_counter()
        self.done_s: float | None = None
        self.futures: list[Future] = [Future() for _ in builds]
        todo = queue.SimpleQueue()
        for item in zip(self.futures, builds):
            todo.put(item)
        # Daemon threads, not an executor's: a process that stops early (a bad model path
        # right after the backend was made) exits at once instead of waiting out the builds.
        for i in range(self.threads):
            threading.Thread(target=_work, args=(todo, device), daemon=True,
                             name=f"crucible-nvrtc-{i}").start()

    def wait(self, say: Callable[[str], None] | None = None) -> float:
        """Block until every build has ended; seconds waited. A wait longer than
        SLOW_WAIT_S prints what it is doing (``say``: stderr unless given)."""
        say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        t0 = time.perf_counter()
        pending = wait_for(self.futures, timeout=SLOW_WAIT_S).not_done
        if pending:
            say(f"crucible: building the CUDA kernels on {self.threads} threads "
                f"({len(pending)} of {len(self.futures)} programs left); once per install")
            wait_for(pending)
        waited = time.perf_counter() - t0
        if self.done_s is None:
            self.done_s = time.perf_counter() - self.started
            if pending:
                say(f"crucible: CUDA kernels built in {self.done_s:.1f} s")
        return waited

    def errors(self) -> list[BaseException]:
        """The builds that failed (their getters raise again, with context, when used)."""
        return [e for f in self.futures if f.done() and (e := f.exception()) is not None]


def _work(todo: queue.SimpleQueue, device: int) -> None:
    """A pool thread: the device's primary context made current first (loading a module is
    a driver call, and a new thread has no current context), then builds until none is left."""
    try:
        import cupy

        cupy.cuda.runtime.setDevice(device)
        failed: BaseException | None = None
    except BaseException as e:  # noqa: BLE001 - handed to every future this thread takes
        failed = e
    while True:
        try:
            future, build = todo.get_nowait()
        except queue.Empty:
            return
        if failed is not None:
            future.set_exception(failed)
            continue
        try:
            future.set_result(build())
        except BaseException as e:  # noqa: BLE001 - kept for errors(); the getter raises it
            future.set_exception(e)


def start(options: BackendOptions) -> Prebuild:
    """The builds for ``options`` on the current device, started once per process."""
    import cupy

    return _start(options, int(cupy.cuda.runtime.getDevice()))


@functools.cache
def _start(options: BackendOptions, device: int) -> Prebuild:
    return Prebuild(jobs(options), device)
