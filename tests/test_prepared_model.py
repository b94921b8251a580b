"""The prepared-model cache: a second start reads one file instead of parsing the GGUF,
and the engine computes exactly the same bits from it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from crucible.engine.runner import ModelRunner
from crucible.model import gguf_loader, prepared
from crucible.model.fetch import sha256_file
from crucible.model.loader import load_model
from crucible.model.tiny import tiny_random_model
from crucible.step.batch import SegmentSpec, build_packed_batch
from gguf_writer import save_gguf


@pytest.fixture()
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    save_gguf(tiny_random_model(seed=2), path, "F32")
    return path


def logits(model) -> np.ndarray:
    runner = ModelRunner(model, num_pages=8)
    batch = build_packed_batch([SegmentSpec("a", list(range(3, 40)), 0, [4, 1, 6], [36]),
                                SegmentSpec("b", [7, 8, 9], 0, [2], [0, 1, 2])])
    return runner.forward(batch)


@pytest.mark.parametrize("mode", ["int8", "f32"])
def test_second_load_reads_the_prepared_file(gguf: Path, tmp_path: Path, mode: str,
                                             monkeypatch, capsys) -> None:
    cache = tmp_path / "cache"
    fresh = load_model(str(gguf), mode, cache, use_prepared=False)
    first = load_model(str(gguf), mode, cache)
    assert "preparing tiny.gguf" in capsys.readouterr().err
    target = prepared.prepared_path(cache, sha256_file(gguf), mode)
    assert target.is_file() and first.prepared is not None

    def no_parse(*a, **k):
        raise AssertionError("the GGUF was parsed again")

    monkeypatch.setattr(gguf_loader, "open_gguf", no_parse)
    again = load_model(str(gguf), mode, cache)
    assert capsys.readouterr().err == ""
    assert again.weights is None and again.config == fresh.config
    assert again.fingerprint == fresh.fingerprint and again.name == fresh.name
    tok, ref = again.tokenizer, fresh.tokenizer
    text = "Hello, wörld <|im_end|> 123"
    assert tok.encode(text) == ref.encode(text) and tok.stop_token_ids == ref.stop_token_ids
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == ref.apply_chat_template(msgs)
    want = logits(fresh)
    assert np.array_equal(logits(again), want) and np.array_equal(logits(first), want)


def test_modes_have_their_own_files(gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_model(str(gguf), "int8", cache)
    load_model(str(gguf), "f32", cache)
    assert len(list((cache / "prepared").glob("*.safetensors"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other source"])
def test_a_damaged_or_stale_file_is_rebuilt(gguf: Path, tmp_path: Path, damage: str,
                                            capsys) -> None:
    cache = tmp_path / "cache"
    want = logits(load_model(str(gguf), "int8", cache))
    target = prepared.prepared_path(cache, sha256_file(gguf), "int8")
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:1000])
    elif damage == "garbage":
        target.write_bytes(b"\x00" * 64)
    else:  # a file prepared from another source, under this one's name
        other = tmp_path / "other.gguf"
        save_gguf(tiny_random_model(seed=3), other, "F32")
        load_model(str(other), "int8", cache)
        prepared.prepared_path(cache, sha256_file(other), "int8").replace(target)
    capsys.readouterr()
    model = load_model(str(gguf), "int8", cache)
    err = capsys.readouterr().err
    assert "is unusable" in err and "rebuilding" in err
    assert np.array_equal(logits(model), want)
    assert prepared.load(target, sha256_file(gguf), "int8") is not None  # rebuilt whole


def test_an_hf_directory_is_prepared_once_and_rebuilt_when_a_file_changes(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """An HF directory gets the same quick start: the second load reads the prepared file
    (the safetensors are not read again) with the same bits; rewriting a file (its time
    changes) makes the next load prepare again."""
    import os

    from crucible.model import hf_loader
    from crucible.model.tiny import save_hf_dir

    src = tmp_path / "hf"
    save_hf_dir(tiny_random_model(seed=4), src)
    cache = tmp_path / "cache"
    fresh = load_model(str(src), "int8", cache, use_prepared=False)
    first = load_model(str(src), "int8", cache)
    assert "preparing hf (int8)" in capsys.readouterr().err and first.prepared is not None
    real = hf_loader.load_hf_dir

    def no_parse(*a, **k):
        raise AssertionError("the directory was parsed again")

    monkeypatch.setattr(hf_loader, "load_hf_dir", no_parse)
    again = load_model(str(src), "int8", cache)
    assert capsys.readouterr().err == "" and again.weights is None
    assert again.config == fresh.config and again.fingerprint == fresh.fingerprint
    assert (logits(again).view(np.uint32) == logits(fresh).view(np.uint32)).all()
    st = (src / "config.json").stat()
    os.utime(src / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(AssertionError, match="parsed again"):
        load_model(str(src), "int8", cache)  # stale: it must go back to the source
    monkeypatch.setattr(hf_loader, "load_hf_dir", real)
    assert load_model(str(src), "int8", cache).fingerprint == fresh.fingerprint
