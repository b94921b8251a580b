"""Hostile HF-format directories and prepared files: config.json, safetensors tensors,
tokenizer_config.json and generation_config.json with wrong types or values.

Each is one ModelLoadError naming the file and the field or tensor, never a traceback or
a value silently coerced (bool("false") is True); a damaged prepared file is rebuilt.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from crucible.errors import ModelLoadError
from crucible.model import prepared
from crucible.model.loader import dir_key, load_model
from crucible.model.tiny import save_hf_dir, tiny_random_model


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "base"
    save_hf_dir(tiny_random_model(seed=2), path)
    return path


@pytest.fixture()
def hf(base: Path, tmp_path: Path) -> Path:
    path = tmp_path / "model"
    shutil.copytree(base, path)
    return path


def edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.update(changes)
    path.write_text(json.dumps(data))


def refused(path: Path, message: str) -> None:
    with pytest.raises(ModelLoadError) as exc:
        load_model(str(path), "f32", use_prepared=False)
    assert message in str(exc.value), str(exc.value)


@pytest.mark.parametrize("text, message", [
    (b"[1, 2]", "config.json: expected a JSON object, got list"),
    (b"\xff\xfe{}", "config.json: unreadable config ('utf-8' codec"),
])
def test_config_that_is_not_an_object(hf: Path, text: bytes, message: str) -> None:
    (hf / "config.json").write_bytes(text)
    refused(hf, message)


@pytest.mark.parametrize("changes, message", [
    ({"num_attention_heads": 0, "head_dim": None}, "hidden_size=64 is not a multiple of "
                                                   "num_attention_heads=0"),
    ({"num_attention_heads": 3, "num_key_value_heads": 3, "head_dim": None},
     "hidden_size=64 is not a multiple of num_attention_heads=3, and head_dim is not given"),
    ({"hidden_size": 64.7}, "hidden_size must be a whole number, got 64.7"),
    ({"hidden_size": "64"}, "hidden_size must be a whole number, got '64'"),
    ({"hidden_size": True}, "hidden_size must be a whole number, got True"),
    ({"rms_norm_eps": "inf"}, "rms_norm_eps must be a finite number, got 'inf'"),
    ({"rope_theta": float("inf")}, "rope_theta must be a finite number, got inf"),
    ({"max_position_embeddings": 10**12}, "max_context=1,000,000,000,000 is more than"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
])
def test_bad_config_fields(hf: Path, changes: dict, message: str) -> None:
    edit_json(hf / "config.json", **changes)
    refused(hf, f"config.json: {message}")


def test_integral_floats_still_load(hf: Path) -> None:
    edit_json(hf / "config.json", max_position_embeddings=1024.0)
    assert load_model(str(hf), "f32", use_prepared=False).config.max_context == 1024


def rewrite(hf: Path, name: str, value: np.ndarray, extra: str | None = None) -> None:
    tensors = load_file(str(hf / "model.safetensors"))
    if extra is None:
        tensors[name] = value
    else:  # a second shard holding another copy
        save_file({name: value}, str(hf / extra))
    save_file(tensors, str(hf / "model.safetensors"))


def test_integer_tensor_is_refused(hf: Path) -> None:
    # An I32 embedding was cast to f32 without a word.
    rewrite(hf, "model.embed_tokens.weight", np.ones((272, 64), np.int32))
    refused(hf, "tensor model.embed_tokens.weight has dtype I32; supported: F32, F16, BF16")


def test_non_finite_tensor_is_refused(hf: Path) -> None:
    rewrite(hf, "model.norm.weight", np.full(64, np.nan, np.float32))
    refused(hf, "tensor model.norm.weight holds 64 NaN or infinite values")


def test_tensor_in_two_shards_is_refused(hf: Path) -> None:
    rewrite(hf, "model.norm.weight", np.ones(64, np.float32), extra="a-first.safetensors")
    refused(hf, "tensor model.norm.weight is in both a-first.safetensors and model.safetensors")


@pytest.mark.parametrize("changes, message", [
    ({"add_bos_token": "false"}, "tokenizer_config.json: add_bos_token must be true or false"),
    ({"chat_template": 5}, "tokenizer_config.json: chat_template must be a string"),
])
def test_bad_tokenizer_config(hf: Path, changes: dict, message: str) -> None:
    edit_json(hf / "tokenizer_config.json", **changes)
    refused(hf, message)


@pytest.mark.parametrize("eos, message", [
    ("abc", "eos_token_id must be a whole number, got 'abc'"),
    ({"a": 1}, "eos_token_id must be a whole number, got {'a': 1}"),
    (1.5, "eos_token_id must be a whole number, got 1.5"),
    ([1, "x"], "eos_token_id must be a whole number, got 'x'"),
    (10**9, "eos_token_id 1000000000 is outside the vocabulary of 272 tokens"),
    ([-1], "eos_token_id -1 is outside the vocabulary"),
])
def test_bad_generation_config(hf: Path, eos: object, message: str) -> None:
    edit_json(hf / "generation_config.json", eos_token_id=eos)
    refused(hf, f"generation_config.json: {message}")


def test_generation_config_ids_still_stop(hf: Path) -> None:
    edit_json(hf / "generation_config.json", eos_token_id=[5, 7])
    model = load_model(str(hf), "f32", use_prepared=False)
    assert {5, 7} <= set(model.tokenizer.stop_token_ids)


@pytest.mark.parametrize("damage", ["shape", "dtype", "missing", "config"])
def test_damaged_prepared_file_is_rebuilt(hf: Path, tmp_path: Path, capsys,
                                          damage: str) -> None:
    cache = tmp_path / "cache"
    first = load_model(str(hf), "int8", cache)
    target = prepared.prepared_path(cache, dir_key(hf), "int8")
    with safe_open(str(target), "np") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if damage == "shape":
        tensors["linear.l0.qkv"] = tensors["linear.l0.qkv"][:5]
    elif damage == "dtype":
        tensors["linear.l1.down"] = tensors["linear.l1.down"].astype(np.float32)
    elif damage == "missing":
        del tensors["norm.final_norm"]
    else:
        meta["config"] = json.dumps({**json.loads(meta["config"]), "max_context": 2**40})
    save_file(tensors, str(target), metadata=meta)
    capsys.readouterr()
    again = load_model(str(hf), "int8", cache)
    assert "is unusable" in capsys.readouterr().err
    assert again.config == first.config
    assert np.array_equal(again.prepared.linears["l0.qkv"].w, first.prepared.linears["l0.qkv"].w)
