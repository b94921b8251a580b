"""Bad model input gets a clear ModelLoadError naming the file and the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crucible.errors import ConfigError, ModelLoadError
from gguf_writer import save_gguf
from crucible.model.loader import load_model
from crucible.model.tiny import save_hf_dir, tiny_random_model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    save_gguf(tiny_random_model(seed=1), path, "F32")
    return path


def test_unknown_model_name() -> None:
    with pytest.raises(ModelLoadError, match="unknown model 'no-such-model'"):
        load_model("no-such-model")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such model file"):
        load_model(str(tmp_path / "missing.gguf"))


def test_not_a_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="x.gguf"):
        load_model(str(bad))


@pytest.mark.parametrize("keep", [0.3, 0.9, 0.999])
def test_truncated_gguf(tiny_gguf: Path, tmp_path: Path, keep: float) -> None:
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        load_model(str(cut))


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "q5.gguf"
    save_gguf(tiny_random_model(seed=1, hidden_size=64, ffn_size=128), path, "Q5_0")
    with pytest.raises(ModelLoadError, match="Q5_0"):
        load_model(str(path))


def test_bad_weights_mode(tiny_gguf: Path) -> None:
    with pytest.raises(ConfigError, match="weights must be one of"):
        load_model(str(tiny_gguf), "int4")


def test_hf_dir_errors(tmp_path: Path) -> None:
    d = tmp_path / "hf"
    save_hf_dir(tiny_random_model(seed=2), d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 3}))
    with pytest.raises(ModelLoadError, match="not a multiple"):
        load_model(str(d))
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "hidden_size"}))
    with pytest.raises(ModelLoadError, match="hidden_size"):
        load_model(str(d))
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(d))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(empty))
