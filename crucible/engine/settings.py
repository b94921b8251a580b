"""Settings: every start-up choice in one frozen object, read once and passed down.

Entry points (the CLI, ``LLM(...)``, the server, the gpu-* checks) build it from their flags
or arguments and the environment (``Settings.from_env``); nothing below them reads an
environment variable. Every value is checked here, so a bad one is one clear error at
start-up that names the variable or argument, before a model loads.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from crucible.backend.cpu_ext import MAX_THREADS
from crucible.backend.options import DECODE_GRAPH_ROWS, GEMMS, MIXED_GRAPH_ROWS, BackendOptions
from crucible.engine.scheduler import SchedulerConfig
from crucible.engine.sizes import parse_bytes
from crucible.errors import ConfigError
from crucible.kernels.variants import DEFAULT_VARIANT, parse_variant

DEVICES = ("auto", "cpu", "cuda")
WEIGHTS = ("int8", "f32")
# The default max_running's ceiling: a running decode past the decode graphs' largest step
# makes eager decode steps (a 2,048-token budget with 1,024 running: 0.88x,
# bench/throughput-h200-token-budget.json).
RUNNING_CAP = DECODE_GRAPH_ROWS
DEFAULT_GPU_MEMORY_FRACTION = 0.9  # of the device memory left after weights and scratch


def _switch(name: str, raw: str) -> bool:
    value = raw.strip()
    if value not in ("0", "1"):
        raise ConfigError(f"{name} must be 0 or 1, got {raw!r}")
    return value == "1"


def _auto_switch(name: str, raw: str) -> bool | None:
    """0, 1 or auto (None: the backend decides from the hardware)."""
    value = raw.strip()
    if value == "auto":
        return None
    if value not in ("0", "1"):
        raise ConfigError(f"{name} must be 0, 1 or auto, got {raw!r}")
    return value == "1"


def _whole(value: str) -> bool:
    """ASCII digits only: str.isdigit() also passes superscripts ('²'), which int() refuses
    (a traceback, not this module's error), and other scripts' digits nobody means here."""
    return value.isascii() and value.isdigit()


def _threads(name: str, raw: str) -> int | None:
    value = raw.strip()
    if not value:
        return None
    if not _whole(value) or not 1 <= int(value) <= MAX_THREADS:
        raise ConfigError(f"{name} must be a whole number from 1 to {MAX_THREADS}, "
                          f"got {raw!r}")
    return int(value)


def _graph_rows(name: str, raw: str) -> int:
    value = raw.strip()
    if not _whole(value) or int(value) not in MIXED_GRAPH_ROWS:
        raise ConfigError(f"{name} must be one of {', '.join(map(str, MIXED_GRAPH_ROWS))}, "
                          f"got {raw!r}")
    return int(value)


def _gemm(name: str, raw: str) -> str:
    value = raw.strip()
    if value not in GEMMS:
        raise ConfigError(f"{name} must be one of {', '.join(GEMMS)}, got {raw!r}")
    return value


def _attention(name: str, raw: str) -> str:
    return parse_variant(raw).name if raw.strip() else DEFAULT_VARIANT


def parse_cache_size(name: str, raw: str) -> int | None:
    """The prefix cache's budget as CRUCIBLE_PREFIX_CACHE_SIZE, --prefix-cache-size and
    ``LLM(prefix_cache_size=...)`` spell it: ``0`` off, a size in GB or GiB, or auto / empty
    (None: the pool); anything else a ConfigError naming ``name``."""
    value = raw.strip()
    if value.lower() in ("", "auto"):
        return None
    if value == "0":
        return 0
    return parse_bytes(value, name, units=("GB", "GiB"))


def given_cache_size(name: str, raw: str) -> int:
    """A prefix-cache budget given as a flag or an argument: 0 or a size in GB or GiB. Left
    out it is the default (the environment's, else the pool), so "auto" is refused here
    rather than read as "not given"."""
    value = parse_cache_size(name, raw)
    if value is None:
        raise ConfigError(f"{name} must be 0 or a size in GB or GiB, got {raw!r}; leave it "
                          "out for the default")
    return value


def _positive(name: str, raw: str) -> int:
    value = raw.strip()
    if not _whole(value) or int(value) < 1:
        raise ConfigError(f"{name} must be a whole number >= 1, got {raw!r}")
    return int(value)


def _path(name: str, raw: str) -> Path | None:
    return _checked_path(name, raw) if raw.strip() else None


def _checked_path(name: str, value: Any) -> Path:
    """A path setting as a Path; a NUL in it would only fail at the first open (deep in a
    model load, or at exit for the profile) as a bare ValueError."""
    if not isinstance(value, (str, Path)) or "\0" in str(value):
        raise ConfigError(f"{name} must be a path (text without NUL), got {value!r}")
    return Path(value).expanduser()


# Environment variable -> (field, parser). The README's settings table lists the same.
ENV: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "CRUCIBLE_PREFILL_ATTN": ("attention", _attention),
    "CRUCIBLE_DECODE_GRAPHS": ("decode_graphs", _switch),
    "CRUCIBLE_PREFILL_GRAPHS": ("prefill_graphs", _switch),
    "CRUCIBLE_MIXED_GRAPHS": ("mixed_graphs", _switch),
    "CRUCIBLE_MIXED_GRAPH_ROWS": ("mixed_graph_rows", _graph_rows),
    "CRUCIBLE_GRAPH_WARMUP": ("graph_warmup", _switch),
    "CRUCIBLE_GEMM": ("gemm", _gemm),
    "CRUCIBLE_WGMMA": ("wgmma", _auto_switch),
    "CRUCIBLE_PDL": ("pdl", _switch),
    "CRUCIBLE_ATTENTION_FORK": ("attention_fork", _switch),
    "CRUCIBLE_LONGEST_FIRST": ("longest_first", _switch),
    "CRUCIBLE_DECODE_STACK": ("decode_stack", _switch),
    "CRUCIBLE_PIPELINE": ("pipeline", _switch),
    "CRUCIBLE_CPU_THREADS": ("cpu_threads", _threads),
    "CRUCIBLE_CACHE": ("cache_dir", _path),
    "CRUCIBLE_PREFIX_CACHE_SIZE": ("prefix_cache_size", parse_cache_size),
    "CRUCIBLE_PREFIX_CACHE_MAX_TOKENS": ("prefix_cache_max_tokens", _positive),
    "CRUCIBLE_PREFIX_CACHE_ENTRIES": ("prefix_cache_entries", _positive),
    "CRUCIBLE_CORE_PROFILE": ("core_profile", _path),
    "CRUCIBLE_LATE_PLANNING": ("late_planning", _switch),
}


@dataclass(frozen=True)
class Settings:
    device: str = "auto"  # auto | cpu | cuda
    weights: str = "int8"  # int8 | f32
    attention: str = DEFAULT_VARIANT  # the GPU's attention variant (kernels/variants.py)
    decode_graphs: bool = True
    prefill_graphs: bool = True
    mixed_graphs: bool = True
    mixed_graph_rows: int = 512  # the largest mixed step a graph replays
    # The CUDA int8 GEMMs' order: mma (linear_mma.cu, tensor cores; the default since its
    # batch-1 decode caught up: docs/throughput.md) or fma (linear.cu, the CPU's bits).
    gemm: str = "mma"
    # mma's GEMMs of 128 rows and more on the warpgroup MMA (kernels/linear_wgmma.py, the
    # same bits): None (auto) where the GPU is Hopper and NVRTC builds it, True insists.
    wgmma: bool | None = None
    graph_warmup: bool = True  # capture the decode graphs at start-up (engine factory)
    pdl: bool = True
    attention_fork: bool = True  # a mixed step's two attention launches on two streams
    longest_first: bool = True  # attn_decode's rows longest history first (same bits)
    decode_stack: bool = True
    pipeline: bool = True
    cpu_threads: int | None = None  # None: the available cores
    cache_dir: Path | None = None  # None: ~/.cache/crucible
    num_pages: int | None = None  # None: sized by kv_cache_memory / gpu_memory_fraction
    kv_cache_memory: int | None = None  # bytes for the KV pool (CUDA); parse_bytes("40GiB")
    gpu_memory_fraction: float | None = None  # of free memory after weights and scratch
    token_budget: int = 2048  # rows a step packs (serve's own default: 1,024; cli_serve)
    chunk_cap: int | None = None
    max_queue: int = 64
    max_running: int | None = None  # None: half the budget, at most RUNNING_CAP
    seed: int = 0
    prefix_cache_size: int | None = None  # bytes of cached pages; None: the pool; 0: off
    prefix_cache_max_tokens: int = 8192  # longest retained prefix per chain
    prefix_cache_entries: int = 4096  # most retained chains
    core_profile: Path | None = None  # the engine process's cProfile stats (a diagnostic)
    late_planning: bool = False  # serving loops plan step t+1 near t's end (engine/pacing.py)

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {', '.join(DEVICES)}; got {self.device!r}")
        if self.weights not in WEIGHTS:
            raise ConfigError(f"weights must be 'int8' or 'f32', got {self.weights!r}")
        object.__setattr__(self, "attention", parse_variant(self.attention).name)
        for name in ("decode_graphs", "prefill_graphs", "mixed_graphs", "graph_warmup", "pdl",
                     "attention_fork", "longest_first", "decode_stack", "pipeline",
                     "late_planning"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name, low in (("cpu_threads", 1), ("num_pages", 1), ("chunk_cap", 1),
                          ("kv_cache_memory", 1), ("max_running", 1)):
            self._check_int(name, low, optional=True)
        for name, low in (("token_budget", 1), ("max_queue", 1), ("seed", 0),
                          ("prefix_cache_max_tokens", 1), ("prefix_cache_entries", 1)):
            self._check_int(name, low)
        self._check_int("prefix_cache_size", 0, optional=True)
        r = self.mixed_graph_rows
        if isinstance(r, bool) or r not in MIXED_GRAPH_ROWS:
            raise ConfigError(f"mixed_graph_rows must be one of "
                              f"{', '.join(map(str, MIXED_GRAPH_ROWS))}, got {r!r}")
        if self.gemm not in GEMMS:
            raise ConfigError(f"gemm must be one of {', '.join(GEMMS)}, got {self.gemm!r}")
        if self.wgmma is not None and not isinstance(self.wgmma, bool):
            raise ConfigError(f"wgmma must be True, False or None (auto), got {self.wgmma!r}")
        if self.wgmma and self.gemm != "mma":
            raise ConfigError("wgmma (CRUCIBLE_WGMMA=1) runs the mma GEMM order; it needs "
                              f"gemm 'mma', got {self.gemm!r}")
        f = self.gpu_memory_fraction
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))
                              or not 0 < f <= 1):
            raise ConfigError(f"gpu_memory_fraction must be a number in (0, 1], got {f!r}")
        given = [n for n in ("num_pages", "kv_cache_memory", "gpu_memory_fraction")
                 if getattr(self, n) is not None]
        if len(given) > 1:
            raise ConfigError(f"give at most one of num_pages, kv_cache_memory and "
                              f"gpu_memory_fraction; got {' and '.join(given)}")
        if self.cpu_threads is not None and self.cpu_threads > MAX_THREADS:
            raise ConfigError(f"cpu_threads must be at most {MAX_THREADS}, got {self.cpu_threads}")
        for name in ("cache_dir", "core_profile"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _checked_path(name, getattr(self, name)))

    def _check_int(self, name: str, low: int, optional: bool = False) -> None:
        v = getattr(self, name)
        if v is None and optional:
            return
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(f"{name} must be a whole number >= {low}"
                              f"{' or None' if optional else ''}, got {v!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 defaults: Mapping[str, Any] | None = None, **given: Any) -> "Settings":
        """``defaults`` (an entry point's own, over the fields' defaults), then the
        environment's CRUCIBLE_* values over them, then ``given`` (flags or API arguments;
        a None value means "not given") over those."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = dict(defaults or {})
        for var, (field, parse) in ENV.items():
            raw = env.get(var)
            if raw is not None:
                parsed = parse(var, raw)
                if parsed is not None:
                    values[field] = parsed
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted((set(given) | set(values)) - names)
        if unknown:
            raise TypeError(f"Settings has no field {unknown[0]!r}")
        values.update({k: v for k, v in given.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)

    def backend_options(self) -> BackendOptions:
        return BackendOptions(attention=self.attention, decode_graphs=self.decode_graphs,
                              prefill_graphs=self.prefill_graphs,
                              mixed_graphs=self.mixed_graphs,
                              mixed_graph_rows=self.mixed_graph_rows, pdl=self.pdl,
                              attention_fork=self.attention_fork,
                              longest_first=self.longest_first,
                              decode_stack=self.decode_stack, gemm=self.gemm_order(),
                              wgmma=self.wgmma if self.gemm_order() == "mma" else False,
                              cpu_threads=self.cpu_threads)

    def gemm_order(self, device: str = "cuda") -> str:
        """The order the GEMMs really take: ``gemm`` for int8 weights on CUDA; f32 weights
        and the CPU have linear.cu's order only, so naming mma there would be untrue (and
        would split the prefix cache's namespace for nothing)."""
        return self.gemm if device == "cuda" and self.weights == "int8" else "fma"

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(token_budget=self.token_budget, chunk_cap=self.chunk_cap,
                               max_queue=self.max_queue, max_running=self.running_limit())

    def running_limit(self) -> int:
        """``max_running``, or half the token budget up to RUNNING_CAP: every running
        decode takes one row of a step, and half the budget stays for prefill slices."""
        return self.max_running if self.max_running is not None \
            else max(1, min(self.token_budget // 2, RUNNING_CAP))
