"""One way to build an engine, shared by the CLI, the Python API and the server, so the
same settings give the same engine (pool size, scheduler limits, backend) everywhere."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from crucible.backend.select import make_backend, resolve_device
from crucible.backend.protocol import Backend
from crucible.engine.engine import LLMEngine
from crucible.engine.pacing import Pacer
from crucible.engine.pool_size import PoolSize, page_bytes, pool_size
from crucible.engine.prefix_cache import PrefixCache
from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.errors import ConfigError
from crucible.kernels.variants import cuda_geometry_problem
from crucible.model.loader import LoadedModel, load_model

CACHE_FORMAT = "crucible-prefix-v1"  # the arithmetic policy id: bump when kernels change bits
TINY_MODEL = "tiny-random"  # the hidden test model (model/tiny.py): no download, context 2048


@dataclass(frozen=True)
class EngineInfo:
    """What was built, for start-up lines, ``/health`` and the server's metrics."""

    model: str
    device: str
    backend: str
    weights: str
    context: int
    pages: int
    pool: str  # how the pool was sized, for the start-up report
    token_budget: int
    chunk_cap: int | None
    max_queue: int
    max_running: int
    attention: str
    graphs: str = ""  # what was captured at start-up, for the start-up report
    gemm: str = "fma"  # the order the int8 GEMMs take (Settings.gemm_order)
    note: str = ""  # why --device auto chose the CPU beside a GPU, for the start-up report


def load(model: str | LoadedModel, settings: Settings) -> LoadedModel:
    """A model by name, path or the tiny test model, in the settings' weight mode."""
    if isinstance(model, LoadedModel):
        if model.weights_mode != settings.weights:
            raise ConfigError(f"weights={settings.weights!r} but the given model was loaded "
                              f"as {model.weights_mode!r}")
        return model
    if model == TINY_MODEL:
        from crucible.model.tiny import tiny_random_model

        return tiny_random_model(seed=0, weights=settings.weights, max_context=2048)
    return load_model(model, settings.weights, settings.cache_dir)


def prefix_cache(settings: Settings, model: LoadedModel, backend: Backend,
                 num_pages: int) -> PrefixCache | None:
    """The prefix cache the settings ask for (None: off), its namespace this model, its
    weight mode and the backend's arithmetic, so no other configuration can hit it."""
    size = settings.prefix_cache_size
    if size == 0:
        return None
    pages = num_pages if size is None else min(num_pages, size // page_bytes(model.config))
    if pages < 1:
        return None
    return PrefixCache((CACHE_FORMAT, model.fingerprint, model.weights_mode),
                       backend.arithmetic, pages, settings.prefix_cache_max_tokens,
                       settings.prefix_cache_entries, page_bytes(model.config))


def build_engine(model: str | LoadedModel, settings: Settings) -> tuple[LLMEngine, EngineInfo]:
    """The device is resolved and the backend built before the model loads, so a bad device
    fails in milliseconds, not after a load of several seconds."""
    device = resolve_device(settings.device)
    backend = make_backend(device, settings.backend_options())
    loaded = load(model, settings)
    note = ""
    problem = cuda_geometry_problem(loaded.config) if device == "cuda" else None
    if problem and settings.device == "auto":  # an explicit cuda is refused at the upload
        device, note = "cpu", f"device auto chose the CPU: {problem}"
        backend = make_backend(device, settings.backend_options())
    sized: list[PoolSize] = []

    def pages(be: Backend) -> int:  # once the weights are on the device
        sized.append(pool_size(settings, loaded.config, device, be.memory_info()))
        return sized[0].num_pages

    runner = ModelRunner(loaded, num_pages=pages, device=device, settings=settings,
                         backend=backend)
    engine = LLMEngine(runner, loaded.tokenizer, settings.scheduler_config(),
                       seed=settings.seed,
                       prefix_cache=prefix_cache(settings, loaded, backend, runner.num_pages))
    if settings.late_planning:  # a serving loop sets the arrivals it drains
        engine.pacer = Pacer(arrivals=lambda: None)
    cfg = engine.config
    graphs = ""
    if settings.graph_warmup and device == "cuda":
        # Before any request, within the start-up report: every decode bucket the running
        # limit can fill, so no step someone waits for pays a capture (docs/gpu-engine.md).
        t0 = time.perf_counter()
        n = runner.capture_graphs(cfg.max_running)
        if n:
            graphs = (f"{n} decode graphs captured at start-up in "
                      f"{time.perf_counter() - t0:.2f} s")
    info = EngineInfo(model=loaded.name, device=runner.device, backend=backend.name,
                      weights=loaded.weights_mode, context=loaded.config.max_context,
                      pages=runner.num_pages, pool=sized[0].summary,
                      token_budget=cfg.token_budget, chunk_cap=cfg.chunk_cap,
                      max_queue=cfg.max_queue, max_running=cfg.max_running,
                      attention=settings.attention if device == "cuda"
                      else "numpy reference order", graphs=graphs,
                      gemm=settings.gemm_order(device), note=note)
    return engine, info


def freeze_startup() -> None:
    """For a process that owns its engine (the CLI, the server), once it is built: the
    model, tokenizer and tables are long-lived objects that every full collection would
    walk again; frozen, the collector sees only what steps allocate. Not done for an
    embedded ``LLM``: frozen objects in reference cycles are never freed, so an
    application that drops an engine would keep its memory (its GPU pool included)."""
    gc.collect()
    gc.freeze()
