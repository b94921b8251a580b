"""The one settings object: environment + arguments, parsed strictly, read once."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.backend import cpu_ext
from crucible.backend.numpy_backend import NumpyBackend
from crucible.engine.settings import ENV, Settings
from crucible.errors import ConfigError

SWITCHES = ("CRUCIBLE_DECODE_GRAPHS", "CRUCIBLE_PREFILL_GRAPHS", "CRUCIBLE_MIXED_GRAPHS",
            "CRUCIBLE_PDL", "CRUCIBLE_DECODE_STACK", "CRUCIBLE_PIPELINE",
            "CRUCIBLE_GRAPH_WARMUP", "CRUCIBLE_ATTENTION_FORK")


def test_defaults_without_environment() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert s.attention == "exact-q4-k64" and s.weights == "int8" and s.device == "auto"
    assert s.decode_graphs and s.prefill_graphs and s.pdl and s.decode_stack and s.pipeline
    assert s.attention_fork and s.backend_options().attention_fork
    assert s.cpu_threads is None and s.cache_dir is None and s.num_pages is None
    assert (s.token_budget, s.chunk_cap, s.max_queue, s.max_running) == (2048, None, 64, None)
    assert s.kv_cache_memory is None and s.gpu_memory_fraction is None


def test_an_entry_points_defaults_sit_under_the_environment_and_arguments() -> None:
    """``defaults`` (serve's 1,024 graph rows) replace the fields' defaults only: the
    environment and the arguments still win; an unknown or invalid one is refused."""
    d = {"mixed_graph_rows": 1024}
    assert Settings.from_env({}, defaults=d).mixed_graph_rows == 1024
    assert Settings.from_env({"CRUCIBLE_MIXED_GRAPH_ROWS": "256"}, defaults=d
                             ).mixed_graph_rows == 256
    assert Settings.from_env({}, defaults=d, mixed_graph_rows=640).mixed_graph_rows == 640
    with pytest.raises(TypeError, match="no field 'rows'"):
        Settings.from_env({}, defaults={"rows": 1024})
    with pytest.raises(ConfigError, match="mixed_graph_rows"):
        Settings.from_env({}, defaults={"mixed_graph_rows": 1000})


def test_attention_variable_and_alias() -> None:
    assert Settings.from_env({"CRUCIBLE_PREFILL_ATTN": "  "}).attention == "exact-q4-k64"
    assert Settings.from_env({"CRUCIBLE_PREFILL_ATTN": "exact"}).attention == "exact-q4-k64"
    got = Settings.from_env({"CRUCIBLE_PREFILL_ATTN": "online-q2-k32"}).attention
    assert got == "online-q2-k32"
    with pytest.raises(ConfigError, match="unknown CRUCIBLE_PREFILL_ATTN value 'fastest'"):
        Settings.from_env({"CRUCIBLE_PREFILL_ATTN": "fastest"})


@pytest.mark.parametrize("var", SWITCHES)
def test_switches(var: str) -> None:
    field = ENV[var][0]
    assert getattr(Settings.from_env({}), field) is True  # default on
    assert getattr(Settings.from_env({var: "0"}), field) is False
    assert getattr(Settings.from_env({var: " 1 "}), field) is True
    for bad in ("off", "yes", "", "2"):
        with pytest.raises(ConfigError, match=f"{var} must be 0 or 1"):
            Settings.from_env({var: bad})


@pytest.mark.parametrize("raw,want", [("1", 1), ("3", 3), (" 2 ", 2), ("256", 256), ("", None)])
def test_threads_setting(raw: str, want: int | None) -> None:
    assert Settings.from_env({"CRUCIBLE_CPU_THREADS": raw}).cpu_threads == want


@pytest.mark.parametrize("raw", ["0", "-2", "two", "2.5", "257", "1e3"])
def test_bad_threads_setting_is_a_startup_error(raw: str) -> None:
    with pytest.raises(ConfigError, match="CRUCIBLE_CPU_THREADS must be a whole number"):
        Settings.from_env({"CRUCIBLE_CPU_THREADS": raw})


def test_threads_default_is_the_available_cores() -> None:
    want = min(cpu_ext.default_threads(), cpu_ext.MAX_THREADS)
    assert want >= 1
    assert NumpyBackend(threads=Settings().cpu_threads).threads == want
    assert NumpyBackend(threads=3).threads == 3
    for bad in (0, 257, True, 2.0):
        with pytest.raises(ConfigError, match="cpu threads must be a whole number"):
            NumpyBackend(threads=bad)


def test_cache_dir(tmp_path: Path) -> None:
    assert Settings.from_env({"CRUCIBLE_CACHE": str(tmp_path)}).cache_dir == tmp_path
    assert Settings.from_env({"CRUCIBLE_CACHE": ""}).cache_dir is None


def test_arguments_override_the_environment() -> None:
    env = {"CRUCIBLE_PIPELINE": "0", "CRUCIBLE_PREFILL_ATTN": "reference"}
    s = Settings.from_env(env, pipeline=True, num_pages=None, token_budget=7)
    assert s.pipeline is True and s.attention == "reference" and s.token_budget == 7
    assert s.num_pages is None  # None means "not given"
    with pytest.raises(TypeError, match="no field 'pages'"):
        Settings.from_env({}, pages=3)


@pytest.mark.parametrize("kw,match", [
    (dict(device="gpu"), "device must be one of auto, cpu, cuda"),
    (dict(weights="fp16"), "weights must be 'int8' or 'f32'"),
    (dict(attention="flash"), "unknown CRUCIBLE_PREFILL_ATTN value 'flash'"),
    (dict(num_pages=0), "num_pages must be a whole number >= 1"),
    (dict(token_budget=0), "token_budget must be a whole number >= 1"),
    (dict(chunk_cap=-1), "chunk_cap must be a whole number >= 1"),
    (dict(max_queue=1.5), "max_queue must be a whole number"),
    (dict(max_running=True), "max_running must be a whole number"),
    (dict(seed=-1), "seed must be a whole number >= 0"),
    (dict(pdl=1), "pdl must be True or False"),
    (dict(cpu_threads=999), "cpu_threads must be at most 256"),
])
def test_bad_arguments_name_the_problem(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Settings(**kw)


def test_max_running_defaults_to_half_the_budget_up_to_the_decode_graphs() -> None:
    from crucible.backend.options import DECODE_GRAPH_ROWS
    from crucible.engine.settings import RUNNING_CAP

    assert RUNNING_CAP == DECODE_GRAPH_ROWS == 512
    assert Settings().running_limit() == 512  # half of 2,048 would pass the decode graphs
    assert Settings(token_budget=1024).running_limit() == 512
    assert Settings(token_budget=1000).running_limit() == 500
    assert Settings(token_budget=8192, max_running=2000).running_limit() == 2000
    assert Settings(token_budget=64).scheduler_config().max_running == 32
    assert Settings(token_budget=1).running_limit() == 1
    assert Settings(max_running=7).scheduler_config().max_running == 7


def test_one_way_to_size_the_pool() -> None:
    with pytest.raises(ConfigError, match="at most one of num_pages, kv_cache_memory"):
        Settings(num_pages=8, kv_cache_memory=1 << 30)
    with pytest.raises(ConfigError, match="kv_cache_memory and gpu_memory_fraction"):
        Settings(kv_cache_memory=1 << 30, gpu_memory_fraction=0.5)
    for bad in (0, 1.5, -0.1, True, "0.5"):
        with pytest.raises(ConfigError, match="gpu_memory_fraction must be a number in"):
            Settings(gpu_memory_fraction=bad)
    with pytest.raises(ConfigError, match="kv_cache_memory must be a whole number >= 1"):
        Settings(kv_cache_memory=0)


def test_backend_options_carry_the_settings() -> None:
    s = Settings(attention="online-q1-k16", pdl=False, decode_stack=False,
                 decode_graphs=False, prefill_graphs=True, cpu_threads=2)
    o = s.backend_options()
    assert (o.attention, o.pdl, o.decode_stack, o.decode_graphs, o.prefill_graphs,
            o.cpu_threads) == ("online-q1-k16", False, False, False, True, 2)
    assert s.scheduler_config().token_budget == 2048


def test_nothing_below_the_entry_points_reads_the_environment() -> None:
    """Settings are read once: only engine/settings.py names os.environ in the product."""
    root = Path(__file__).resolve().parent.parent / "crucible"
    readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if "os.environ" in p.read_text() or "getenv(" in p.read_text())
    assert readers == ["engine/settings.py"], readers


@pytest.mark.parametrize("warmup", [True, False])
def test_factory_captures_graphs_at_start_up_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                        warmup: bool) -> None:
    """On CUDA the engine factory has the backend capture its graphs for the running limit
    before any request and reports it; CRUCIBLE_GRAPH_WARMUP=0 leaves them to the steps."""
    from crucible.engine import factory

    calls: list[int] = []

    class Graphs(NumpyBackend):  # the numpy kernels, standing in for a device with graphs
        device = "cuda"

        def capture_graphs(self, forward: object, max_rows: int) -> int:
            calls.append(max_rows)
            return 38

    monkeypatch.setattr(factory, "resolve_device", lambda d: "cuda")
    monkeypatch.setattr(factory, "make_backend", lambda d, o: Graphs())
    settings = Settings(device="cuda", num_pages=64, max_running=40, graph_warmup=warmup)
    engine, info = factory.build_engine(factory.TINY_MODEL, settings)
    assert calls == ([40] if warmup else [])
    assert (info.graphs.startswith("38 decode graphs captured at start-up in ")
            if warmup else info.graphs == "")
    monkeypatch.undo()
    cpu_engine, cpu_info = factory.build_engine(factory.TINY_MODEL, Settings(device="cpu"))
    assert cpu_info.graphs == "" and calls == ([40] if warmup else [])  # nothing on the CPU
