"""Where each weight of a Llama checkpoint lives, and its shape: one table per format.

The HF (safetensors) and GGUF names, the per-layer fields of ``LayerWeights`` and their
shapes are spelled here once; the loaders, the writers (``tiny.save_hf_dir``,
tests/gguf_writer.py) and the HF peer benchmark all read these tables, so a format's names
cannot drift between the code that reads it and the code that writes it.

GGUF stores Q and K rows in llama.cpp's interleaved RoPE order; ``QK_HEADS`` names the two
fields whose rows are (un)permuted on the way in and out, with the head count of each.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from crucible.model.config import ModelConfig
from crucible.model.weights import LayerWeights

LAYER_FIELDS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
NORM_FIELDS = frozenset({"attn_norm", "ffn_norm"})  # vectors, never quantized

HF_LAYER = {"attn_norm": "input_layernorm.weight", "wq": "self_attn.q_proj.weight",
            "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
            "wo": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
            "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
            "w_down": "mlp.down_proj.weight"}
HF_EMBED, HF_FINAL_NORM, HF_LM_HEAD = ("model.embed_tokens.weight", "model.norm.weight",
                                       "lm_head.weight")

GGUF_LAYER = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
              "wv": "attn_v.weight", "wo": "attn_output.weight", "ffn_norm": "ffn_norm.weight",
              "w_gate": "ffn_gate.weight", "w_up": "ffn_up.weight", "w_down": "ffn_down.weight"}
GGUF_EMBED, GGUF_FINAL_NORM, GGUF_LM_HEAD = "token_embd.weight", "output_norm.weight", "output.weight"


def hf_prefix(i: int) -> str:
    return f"model.layers.{i}."


def gguf_prefix(i: int) -> str:
    return f"blk.{i}."


def qk_heads(cfg: ModelConfig) -> dict[str, int]:
    """The fields stored in llama.cpp's Q/K row order, with their head counts."""
    return {"wq": cfg.n_heads, "wk": cfg.n_kv_heads}


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, q, kv, f = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.ffn_size
    return {"attn_norm": (d,), "wq": (q, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, q),
            "ffn_norm": (d,), "w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}


def read_layers(cfg: ModelConfig, get: Callable[[str, tuple[int, ...]], np.ndarray],
                names: dict[str, str], prefix: Callable[[int], str],
                fix: Callable[[str, np.ndarray], np.ndarray] | None = None,
                ) -> tuple[LayerWeights, ...]:
    """Every layer's weights, read field by field in LAYER_FIELDS order with ``get(name,
    shape)`` (which checks the shape); ``fix(field, array)`` adjusts a field after reading."""
    shapes, layers = layer_shapes(cfg), []
    for i in range(cfg.n_layers):
        values = {}
        for field in LAYER_FIELDS:
            a = get(prefix(i) + names[field], shapes[field])
            values[field] = fix(field, a) if fix is not None else a
        layers.append(LayerWeights(**values))
    return tuple(layers)
