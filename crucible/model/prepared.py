"""The prepared-model cache: a model's backend-ready tensors, tokenizer and config in one
safetensors file beside the download, so later starts skip the slow parts.

A start from a GGUF parses all of its metadata (the 49,152-entry vocabulary: most of the
time), dequantizes every tensor and quantizes the linear layers to int8 again. The prepared
file holds the result of all that for one weight mode: the tensors under the names the
forward uses (``BackendWeights``), the tokenizer as its JSON plus the fields Crucible adds,
and the model config. It is keyed by the source file's sha256 (an HF directory: a digest
of its files' names, sizes and times, model/loader.py ``dir_key``), the weight mode and
``FORMAT``; written to a temporary file and renamed, so a crash never leaves half a file; a
file that cannot be read, or says another format or source, is rebuilt with a message.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
from tokenizers import Tokenizer as HFTokenizer

from crucible.backend.protocol import BackendWeights, LinearWeight
from crucible.model.config import ModelConfig
from crucible.model.fetch import cache_dir
from crucible.model.tokenizer import Tokenizer
from crucible.model.weights import check_backend_weights

FORMAT = 1  # bump when what is stored, or how the tensors are computed, changes


def prepared_path(cache: Path | None, sha256: str, mode: str) -> Path:
    return cache_dir(cache) / "prepared" / f"{sha256[:32]}-{mode}-v{FORMAT}.safetensors"


def save(path: Path, *, name: str, sha256: str, config: ModelConfig, fingerprint: str,
         tokenizer: Tokenizer, weights: BackendWeights) -> None:
    tensors = {"embedding": weights.embedding}
    for key, lw in weights.linears.items():
        tensors[f"linear.{key}"] = np.ascontiguousarray(lw.w)
        if lw.scale is not None:
            tensors[f"scale.{key}"] = lw.scale
    tensors.update({f"norm.{key}": v for key, v in weights.norms.items()})
    tok = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id,
           "add_bos": tokenizer.add_bos, "byte_level": tokenizer.byte_level,
           "stops": list(tokenizer.stop_token_ids),
           "chat_template": tokenizer.chat_template.source if tokenizer.has_chat_template
           else None}
    meta = {"format": str(FORMAT), "sha256": sha256, "mode": weights.mode, "name": name,
            "config": config.to_json(), "fingerprint": fingerprint,
            "tokenizer": tokenizer.backend.to_str(), "tokenizer_fields": json.dumps(tok)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: Path, sha256: str, mode: str) -> tuple | None:
    """(name, config, fingerprint, tokenizer, weights), or None when there is no usable
    prepared file (absent: silently; unreadable or stale: with a message)."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), "np") as f:
            meta = f.metadata() or {}
            if (meta.get("format"), meta.get("sha256"), meta.get("mode")) != \
                    (str(FORMAT), sha256, mode):
                raise ValueError("it was made for another source, mode or format")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        config = ModelConfig(**json.loads(meta["config"]))
        tok = json.loads(meta["tokenizer_fields"])
        tokenizer = Tokenizer(HFTokenizer.from_str(meta["tokenizer"]),
                              bos_token_id=tok["bos"], eos_token_id=tok["eos"],
                              add_bos=tok["add_bos"], chat_template=tok["chat_template"],
                              extra_stop_ids=tok["stops"], byte_level=tok["byte_level"],
                              source=str(path))
        linears = {k.split(".", 1)[1]: LinearWeight(v, tensors.get("scale." + k.split(".", 1)[1]))
                   for k, v in tensors.items() if k.startswith("linear.")}
        norms = {k[len("norm."):]: v for k, v in tensors.items() if k.startswith("norm.")}
        weights = BackendWeights(mode, tensors["embedding"], linears, norms)
        # The file is ours, but a disk, a copy or a hand can damage it: a bad geometry or
        # tensor must mean "rebuild", not a failure in the first forward.
        config.validate(str(path))
        check_backend_weights(weights, config)
    except Exception as exc:  # noqa: BLE001 - any damage means: build it again
        print(f"crucible: the prepared model {path} is unusable ({exc}); rebuilding it",
              file=sys.stderr)
        return None
    return meta["name"], config, meta["fingerprint"], tokenizer, weights
