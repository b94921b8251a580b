"""Write a model as a llama.cpp-style GGUF (for tests and tools, not the runtime path).

Q and K rows are permuted into llama.cpp's interleaved-RoPE order, as llama.cpp's own
converter does, so reading the file back exercises the loader's inverse permutation.
Linear weights may be stored as F32, F16, Q8_0 or Q4_1 (quantized with the gguf package).
``meta`` and ``tensors`` replace or drop (None) single entries, so tests can write the
malformed files a loader must refuse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from crucible.model.loader import LoadedModel
from crucible.model.layout import (
    GGUF_EMBED,
    GGUF_FINAL_NORM,
    GGUF_LAYER,
    GGUF_LM_HEAD,
    LAYER_FIELDS,
    NORM_FIELDS,
    gguf_prefix,
    qk_heads,
)
from crucible.model.weights import permute_llama_qk


def save_gguf(model: LoadedModel, path: Path, linear_type: str = "F32",
              meta: Mapping[str, tuple[Any, Any] | None] | None = None,
              tensors: Mapping[str, np.ndarray | None] | None = None) -> None:
    """``meta``: key -> (value, GGUFValueType) or None (the key left out); ``tensors``:
    name -> the array stored instead (as is, no permutation) or None (left out)."""
    import gguf

    from crucible.model.tiny_tokenizer import tiny_vocab

    cfg, w = model.config, model.weights
    qtype = gguf.GGMLQuantizationType[linear_type]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.n_layers)
    writer.add_context_length(cfg.max_context)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.ffn_size)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_vocab_size(cfg.vocab_size)
    tokens, merges, types = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    tok = model.tokenizer
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    writer.add_add_bos_token(False)

    def put(name: str, value: np.ndarray, linear: bool) -> None:
        if tensors and name in tensors:
            if tensors[name] is not None:
                writer.add_tensor(name, tensors[name])
            return
        value = np.ascontiguousarray(value, dtype=np.float32)
        if not linear or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, value)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, value.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)

    put(GGUF_EMBED, w.embed, True)
    put(GGUF_FINAL_NORM, w.final_norm, False)
    if w.lm_head is not None:
        put(GGUF_LM_HEAD, w.lm_head, True)
    heads = qk_heads(cfg)
    for i, lw in enumerate(w.layers):
        for field in LAYER_FIELDS:
            value = getattr(lw, field)
            if field in heads:
                value = permute_llama_qk(value, heads[field])
            put(gguf_prefix(i) + GGUF_LAYER[field], value, field not in NORM_FIELDS)
    for key, entry in (meta or {}).items():
        writer.kv_data[0].pop(key, None)
        if entry is not None:
            writer.kv_data[0][key] = gguf.GGUFValue(value=entry[0], type=entry[1])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
