"""Load a model by name or path into host weights + tokenizer (no backend yet)."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from crucible.backend.protocol import BackendWeights
from crucible.errors import ConfigError, ModelLoadError
from crucible.model import prepared as prep
from crucible.model.config import ModelConfig
from crucible.model.fetch import KNOWN_MODELS, resolve_model_path, sha256_file
from crucible.model.weights import WEIGHT_MODES, ModelWeights, backend_weights


@dataclass(frozen=True)
class LoadedModel:
    name: str
    config: ModelConfig
    weights: ModelWeights | None  # f32 host weights; None when loaded from a prepared file
    tokenizer: Any  # crucible.model.tokenizer.Tokenizer
    fingerprint: str  # sha256 over config + source weights
    weights_mode: str  # "int8" or "f32": how backends run the linear layers
    prepared: BackendWeights | None = None  # the backend tensors, when already made

    def __post_init__(self) -> None:
        # A padded vocabulary (more embedding rows than tokens) lets the model sample ids
        # the tokenizer has no token for; they must decode to no text, not fail the request.
        if self.tokenizer is not None and hasattr(self.tokenizer, "cover"):
            self.tokenizer.cover(self.config.vocab_size)

    def backend_tensors(self) -> BackendWeights:
        """What a backend uploads: the prepared tensors, or made now from the weights."""
        if self.prepared is not None:
            return self.prepared
        if self.weights is None:
            raise ModelLoadError(f"{self.name}: neither weights nor prepared tensors")
        return backend_weights(self.weights, self.weights_mode)


def check_weights_mode(mode: str) -> str:
    if mode not in WEIGHT_MODES:
        raise ConfigError(f"weights must be one of {', '.join(WEIGHT_MODES)}; got {mode!r}")
    return mode


def load_model(spec: str, weights: str = "int8", cache: Path | None = None,
               use_prepared: bool = True) -> LoadedModel:
    """``spec``: a known model name, a ``.gguf`` path or an HF-format directory; ``cache``:
    where known models are downloaded to (model/fetch.py). A model is prepared once per
    weight mode (model/prepared.py); later loads read that file (``use_prepared=False``:
    always parse the source, and keep the f32 weights)."""
    check_weights_mode(weights)
    path = resolve_model_path(spec, cache)
    name = spec if not Path(spec).exists() else Path(spec).name
    if path.is_dir():
        key = dir_key(path)
    else:
        key = KNOWN_MODELS[spec].sha256 if spec in KNOWN_MODELS else sha256_file(path)
    target = prep.prepared_path(cache, key, weights)
    if use_prepared:
        got = prep.load(target, key, weights)
        if got is not None:
            _, cfg, fp, tok, bw = got
            return LoadedModel(name, cfg, None, tok, fp, weights, prepared=bw)
        print(f"crucible: preparing {name} ({weights}) for quick starts; once, a few "
              "seconds", file=sys.stderr, flush=True)
    cfg, w, fp, tok = _parse(path)
    _check_vocab(path, tok, cfg)
    model = LoadedModel(name, cfg, w, tok, fp, weights)
    if not use_prepared:
        return model
    bw = backend_weights(w, weights)
    try:
        prep.save(target, name=name, sha256=key, config=cfg, fingerprint=fp, tokenizer=tok,
                  weights=bw)
    except OSError as exc:  # a read-only cache still serves, just without quick starts
        print(f"crucible: could not write {target} ({exc})", file=sys.stderr)
    return replace(model, prepared=bw)


def dir_key(path: Path) -> str:
    """An HF directory's identity for the prepared cache: its resolved path and every file's
    name, size and modification time. (Hashing its tensors would cost as much as the load
    the cache saves; any rewrite of a file changes its time.)"""
    h = hashlib.sha256(f"hf-dir\0{path.resolve()}\0".encode())
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        st = f.stat()
        h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def _parse(path: Path) -> tuple[ModelConfig, ModelWeights, str, Any]:
    """(config, f32 weights, fingerprint, tokenizer) from the source itself."""
    from crucible.model.tokenizer_load import load_gguf_tokenizer, load_hf_tokenizer

    if path.is_dir():
        from crucible.model.hf_loader import load_hf_dir

        cfg, w, fp = load_hf_dir(path)
        return cfg, w, fp, load_hf_tokenizer(path)
    from crucible.model.gguf_loader import load_gguf, open_gguf

    reader = open_gguf(path)  # parsing metadata is slow: read it once for both
    cfg, w, fp = load_gguf(path, reader)
    return cfg, w, fp, load_gguf_tokenizer(path, reader)


def _check_vocab(path: Path, tok: Any, cfg: ModelConfig) -> None:
    if tok.vocab_size > cfg.vocab_size:
        raise ModelLoadError(f"{path}: tokenizer has {tok.vocab_size} tokens but the model's "
                             f"vocabulary is {cfg.vocab_size}")
