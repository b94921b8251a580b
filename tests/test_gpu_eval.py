"""gpu-eval on the CPU backend with a tiny saved model: runs, is page-invariant, and its
cross-entropy matches a direct float64 computation from the oracle's logits."""

from __future__ import annotations

import json

import numpy as np

from crucible.cli import main
from crucible.checks.eval import heldout_text
from crucible.model.tiny import save_hf_dir, tiny_random_model
from tests.oracle_llama import oracle_logits


def test_gpu_eval_on_cpu(tmp_path) -> None:
    model = tiny_random_model(seed=2)
    save_hf_dir(model, tmp_path / "tiny")
    out = tmp_path / "eval.json"
    rc = main(["gpu-eval", "--model", str(tmp_path / "tiny"), "--weights", "f32", "--device",
               "cpu", "--ctx", "64", "--tokens", "150", "--paged", "--compare-attn",
               "reference", "--json", str(out)])
    assert rc == 0
    runs = json.loads(out.read_text())["runs"]
    assert runs["shuffled pages"]["bit_identical_to_selected"] is True
    assert runs["attention reference"]["bit_identical_to_selected"] is True
    ce = runs["selected"]["cross_entropy"]
    assert runs["selected"]["tokens"] == 150
    # Independent check: float64 oracle over the same 64-token windows.
    tokens = model.tokenizer.encode(heldout_text())[:151]
    nll = 0.0
    for s in range(0, 150, 64):
        w = tokens[s : s + 65]
        x = oracle_logits(model.config, model.weights, w[:-1])
        x = x - x.max(axis=1, keepdims=True)
        lp = x[np.arange(len(w) - 1), w[1:]] - np.log(np.exp(x).sum(axis=1))
        nll -= lp.sum()
    assert abs(ce - nll / 150) < 1e-4
