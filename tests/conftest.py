"""Shared fixtures. GPU tests skip without CuPy + a GPU; model tests use the cached model."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The host-run kernel tests import tests/cuda_host/host_driver.py.
sys.path.insert(0, str(Path(__file__).resolve().parent / "cuda_host"))
from hypothesis import settings

# CI replays the same property-test examples every run (a landing must not depend on luck);
# local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


def _gpu_ok() -> bool:
    from crucible.backend.select import gpu_available

    return gpu_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _gpu_ok():
        skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model_path():
    """The default GGUF, downloaded into the cache once (the only network the tests use)."""
    from crucible.model.fetch import resolve_model_path

    return resolve_model_path("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def default_model(default_model_path):
    from crucible.model.loader import load_model

    return load_model(str(default_model_path), "int8")


@pytest.fixture(scope="session")
def tiny_model():
    from crucible.model.tiny import tiny_random_model

    return tiny_random_model(seed=0)


@pytest.fixture
def generate_settings(monkeypatch: pytest.MonkeyPatch):
    """``llm-engine generate``'s flags -> the Settings its engine would be built with (the
    factory stubbed out, so no model loads): a function of the argv after ``--prompt x``."""
    from crucible import cli_generate
    from crucible.engine import factory

    got: list = []

    def build(model: str, settings) -> None:
        got.append(settings)
        raise RuntimeError("stop after the settings")

    monkeypatch.setattr(factory, "build_engine", build)
    parser = cli_generate.generate_parser()

    def settings_of(argv: list[str]):
        with pytest.raises(RuntimeError, match="stop after the settings"):
            cli_generate.build_engine(parser.parse_args(["--prompt", "x", *argv]))
        return got[-1]

    return settings_of
