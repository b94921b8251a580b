"""A model the CUDA kernels cannot run (their attention takes head_dim 64 only): an explicit
--device cuda is refused when the weights upload, naming the head size, and --device auto
on a machine with a GPU runs it on the CPU and says why, instead of failing at the first
step with a kernel's argument error (found on the GPU machine: CPU tests whose engines had
no device set picked the GPU for the tiny model and died in paged_attention)."""

from __future__ import annotations

import pytest

from crucible import SamplingParams
from crucible.backend.cupy_backend import CupyBackend
from crucible.backend.numpy_backend import NumpyBackend
from crucible.engine import factory
from crucible.engine.settings import Settings
from crucible.errors import ConfigError
from crucible.kernels.variants import cuda_geometry_problem
from crucible.model.tiny import tiny_random_model

CUDA_SHAPE = dict(hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_size=512)


class FakeGpu(NumpyBackend):
    """The numpy kernels standing in for a GPU backend (this machine may have none)."""

    device = "cuda"


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """resolve_device answers as on a machine with a GPU; records each backend built."""
    built: list[str] = []

    def make(device: str, options: object) -> NumpyBackend:
        built.append(device)
        return FakeGpu() if device == "cuda" else NumpyBackend()

    monkeypatch.setattr(factory, "resolve_device", lambda d: "cpu" if d == "cpu" else "cuda")
    monkeypatch.setattr(factory, "make_backend", make)
    return built


def test_the_problem_names_the_head_size() -> None:
    assert cuda_geometry_problem(tiny_random_model(0, **CUDA_SHAPE).config) is None
    problem = cuda_geometry_problem(tiny_random_model(0).config)
    assert problem is not None and "head_dim 64" in problem and "is 16" in problem


def test_auto_runs_an_unsupported_shape_on_the_cpu_and_says_why(gpu_machine: list[str]
                                                                ) -> None:
    settings = Settings(num_pages=64, weights="f32")
    engine, info = factory.build_engine(tiny_random_model(0), settings)
    assert gpu_machine == ["cuda", "cpu"] and info.device == "cpu"
    assert info.note.startswith("device auto chose the CPU:") and "head_dim is 16" in info.note
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0))
    tokens = [t for _ in range(16) if engine.has_unfinished()
              for d in engine.step() for t in d.new_token_ids]
    assert len(tokens) == 4 and not engine.has_unfinished()


def test_auto_keeps_the_gpu_for_a_shape_it_runs(gpu_machine: list[str]) -> None:
    """The negative control: head_dim 64 stays on the (stand-in) GPU with no note."""
    _, info = factory.build_engine(tiny_random_model(0, **CUDA_SHAPE),
                                   Settings(num_pages=64, weights="f32", graph_warmup=False))
    assert gpu_machine == ["cuda"] and info.device == "cuda" and info.note == ""


def test_explicit_cuda_is_refused_at_the_upload_naming_the_head_size() -> None:
    """The check comes before any CuPy call, so it runs on a machine without CuPy too."""
    with pytest.raises(ConfigError, match=r"--device cuda: the CUDA kernels take head_dim 64; "
                                          r"this model's head_dim is 16"):
        CupyBackend().load_weights(tiny_random_model(0).config, None)  # type: ignore[arg-type]


def test_generate_says_at_start_why_auto_chose_the_cpu(gpu_machine: list[str],
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    from crucible.cli import main

    code = main(["generate", "--prompt", "the cat", "--max-tokens", "2", "--temperature", "0",
                 "--weights", "f32", "--model", factory.TINY_MODEL])
    err = capsys.readouterr().err
    assert code == 0, err
    assert ("crucible: device auto chose the CPU: the CUDA kernels take head_dim 64; this "
            "model's head_dim is 16") in err
    assert "GEMMs on the tensor cores" not in err  # the CUDA lines stay out: it runs on the CPU
