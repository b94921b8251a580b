"""Peer benchmark: HF transformers generating with the same dequantized weights as Crucible.

    python3 bench/hf_peer.py --model smollm2.gguf [--weights f32] [--batches 1,32]
                             [--rounds 3] [--json PATH]

torch and transformers are peers only: this script imports them, crucible never does. The
weights come from Crucible's own loader (GGUF dequantized to f32, Q/K already in HF
rotate-half order), so both engines run the same model. First, an agreement check: the
largest logit difference on one prompt, HF f32 vs Crucible. Then decode throughput, greedy,
with 128-token prompts and 64 new tokens, at each batch size. HF's decode rate is
(batch x 63) / (time of 64 new tokens - time of 1), so its prefill is excluded. Crucible's
rate comes from bench/gpu_generate.py's decode loop (graphs on, pipelined, as the engine
runs decode). The two alternate in order between rounds; the figures are the median and
min-max, and ours/theirs is paired per round.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from crucible.model.layout import HF_EMBED, HF_FINAL_NORM, HF_LAYER, HF_LM_HEAD, LAYER_FIELDS, hf_prefix


def hf_model(loaded, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    c = loaded.config
    cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                      intermediate_size=c.ffn_size, num_hidden_layers=c.n_layers,
                      num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
                      head_dim=c.head_dim, max_position_embeddings=c.max_context,
                      rope_theta=c.rope_theta, rms_norm_eps=c.rms_eps,
                      tie_word_embeddings=c.tie_embeddings, torch_dtype="float32")
    model = LlamaForCausalLM(cfg).eval()
    w = loaded.weights
    sd = {HF_EMBED: w.embed, HF_FINAL_NORM: w.final_norm}
    if w.lm_head is not None:
        sd[HF_LM_HEAD] = w.lm_head
    for i, lw in enumerate(w.layers):
        sd.update({hf_prefix(i) + HF_LAYER[f]: getattr(lw, f) for f in LAYER_FIELDS})
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"weight mapping: missing {missing}, unexpected {unexpected}")
    if c.tie_embeddings:
        model.tie_weights()
    return model.to(device)


def hf_decode_rate(model, batch: int, prompt: int, new: int, vocab: int, device: str) -> float:
    import torch

    ids = torch.randint(0, vocab, (batch, prompt), device=device)
    mask = torch.ones_like(ids)

    def run(n: int) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, pad_token_id=0)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    run(2)  # warm-up
    return batch * (new - 1) / (run(new) - run(1))


def agreement(loaded, runner, model, device: str) -> float:
    import torch

    from crucible.step.batch import SegmentSpec, build_packed_batch

    ids = loaded.tokenizer.encode("The capital of France is Paris, and the capital of Italy is")
    pages = list(range(-(-len(ids) // 16)))
    batch = build_packed_batch([SegmentSpec("a", ids, 0, pages, list(range(len(ids))))])
    ours = runner.forward(batch)
    with torch.no_grad():
        theirs = model(torch.tensor([ids], device=device)).logits[0].float().cpu().numpy()
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def main(argv: list[str] | None = None) -> int:
    import torch

    from crucible.model.loader import load_model
    from crucible.engine.runner import ModelRunner
    from common import stat, write_json
    from gpu_generate import decode_rate

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--weights", default="f32", choices=("int8", "f32"))
    p.add_argument("--batches", default="1,32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--json", default="bench/hf-peer.json")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = load_model(args.model, args.weights, use_prepared=False)  # it reads the f32 weights
    model = hf_model(loaded, device)
    runner = ModelRunner(loaded, num_pages=max(64, 32 * 16 + 16),
                         device="cuda" if device == "cuda" else "cpu")
    agree = agreement(loaded, runner, model, device)
    print(f"agreement: max |ours - HF| / max |HF| logit = {agree:.2e}", file=sys.stderr)
    rng = np.random.default_rng(0)
    res: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for b in (int(x) for x in args.batches.split(",")):
            order = ("ours", "hf") if r % 2 == 0 else ("hf", "ours")
            got = {}
            for who in order:
                if who == "ours":
                    got[who] = decode_rate(runner, b, args.new, rng,
                                           pipelined=runner.device == "cuda")
                else:
                    got[who] = hf_decode_rate(model, b, 128, args.new,
                                              loaded.config.vocab_size, device)
            res.setdefault(f"b{b}_ours_tok_s", []).append(got["ours"])
            res.setdefault(f"b{b}_hf_tok_s", []).append(got["hf"])
            res.setdefault(f"b{b}_ours_over_hf", []).append(got["ours"] / got["hf"])
        print(f"round {r}: " + ", ".join(f"{k}={v[-1]:.4g}" for k, v in res.items()),
              file=sys.stderr, flush=True)
    out = {"command": "python3 bench/hf_peer.py " + " ".join(argv or sys.argv[1:]),
           "device": device, "weights": args.weights, "torch": torch.__version__,
           "agreement_max_rel_logit_diff": agree,
           "results": {k: stat(v) for k, v in res.items()}}
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
