#!/usr/bin/env python3
"""The two Llama peers of bench/peers compute the same model (no leantrain binary needed, ~10 s).

From one set of random weights under leantrain's `llama` names:
  1. logits, fp32: the torchtitan-style module (titan_llama.py, complex RoPE on permuted q/k
     rows) against transformers' LlamaForCausalLM (llama_recipe.build_hf), on a batch at two
     sequence lengths: max |a - b| / max |b| <= 1e-5; for a tied model with GQA and llama3
     RoPE scaling, and an untied multi-head one with plain RoPE;
  2. training, fp32: three AdamW(fused=True) steps of both on the same batches: the losses
     within 1e-5 relative at every step (the permutation is invisible to AdamW);
  3. a config the peers cannot reproduce is refused with the key named.

    .venv/bin/python bench/peers/test_llama_peers.py
Exit codes: 0 pass, 1 fail."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import llama_recipe  # noqa: E402
import titan_llama  # noqa: E402

TIED_GQA_LLAMA3 = dict(kind="llama", vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=0, rms_norm_eps=1e-5, rope_theta=10000.0,
                       rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                       rope_original_max_position_embeddings=16, max_position_embeddings=64, seq_len=32,
                       tie_word_embeddings=True, attention_bias=False, qk_norm=False, dropout=0.0, hidden_act="silu")
UNTIED_MHA = dict(TIED_GQA_LLAMA3, num_key_value_heads=4, head_dim=24, rope_scaling="none", rope_theta=500000.0,
                  tie_word_embeddings=False, num_hidden_layers=3)


def leantrain_weights(s: titan_llama.LlamaShape, seed: int):
    """Random tensors under leantrain's `llama` names (norm weights away from 1, so a norm
    mix-up shows)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    d, kv, f = s.hidden_size, s.num_key_value_heads * s.head_dim, s.intermediate_size
    sd = {"embed_tokens.weight": w(s.vocab_size, d), "norm.weight": 1 + w(d) * 4}
    if not s.tie_word_embeddings:
        sd["lm_head.weight"] = w(s.vocab_size, d)
    for i in range(s.num_hidden_layers):
        b = f"blocks.{i}."
        sd.update({b + "input_layernorm.weight": 1 + w(d) * 4, b + "post_attention_layernorm.weight": 1 + w(d) * 4,
                   b + "self_attn.q_proj.weight": w(s.num_attention_heads * s.head_dim, d),
                   b + "self_attn.k_proj.weight": w(kv, d), b + "self_attn.v_proj.weight": w(kv, d),
                   b + "self_attn.o_proj.weight": w(d, s.num_attention_heads * s.head_dim),
                   b + "mlp.gate_proj.weight": w(f, d), b + "mlp.up_proj.weight": w(f, d),
                   b + "mlp.down_proj.weight": w(d, f)})
    return sd


def main() -> int:
    torch.set_num_threads(1)
    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    for name, m in (("tied, GQA 4/2, llama3 RoPE", TIED_GQA_LLAMA3), ("untied, MHA, head_dim 24", UNTIED_MHA)):
        s = titan_llama.LlamaShape.from_config(m)
        sd = leantrain_weights(s, seed=7)
        hf = llama_recipe.build_hf(s, sd).eval()
        ti = titan_llama.Transformer(s)
        titan_llama.load_leantrain_weights(ti, sd)
        ti.eval()
        check(sum(p.numel() for p in hf.parameters()) == titan_llama.n_params(ti),
              f"{name}: both peers have {titan_llama.n_params(ti)} parameters")
        gen = torch.Generator().manual_seed(1)
        for t in (s.seq_len, 17):
            x = torch.randint(0, s.vocab_size, (3, t), generator=gen)
            with torch.no_grad():
                a, b = ti(x), hf(input_ids=x).logits
            rel = ((a - b).abs().max() / b.abs().max()).item()
            check(rel <= 1e-5, f"{name}, seq {t}: logits max|titan - hf| / max|hf| = {rel:.2e} <= 1e-5")

        # Three AdamW steps of both, same batches.
        hf.train()
        ti.train()
        opts = [torch.optim.AdamW(mdl.parameters(), lr=3e-3, weight_decay=0.1, fused=True) for mdl in (hf, ti)]
        worst = 0.0
        losses = []
        for step in range(3):
            x = torch.randint(0, s.vocab_size, (2, s.seq_len), generator=gen)
            y = torch.randint(0, s.vocab_size, (2, s.seq_len), generator=gen)
            pair = []
            for mdl, opt, fn in ((hf, opts[0], llama_recipe.hf_loss),
                                 (ti, opts[1], lambda mm, xx, yy: titan_llama.cross_entropy_loss(mm(xx), yy))):
                opt.zero_grad(set_to_none=True)
                loss = fn(mdl, x, y)
                loss.backward()
                opt.step()
                pair.append(loss.item())
            losses.append(pair)
            worst = max(worst, abs(pair[0] - pair[1]) / abs(pair[0]))
        check(worst <= 1e-5, f"{name}: 3 AdamW steps, losses hf/titan {[f'{a:.6f}/{b:.6f}' for a, b in losses]} "
                             f"(worst rel diff {worst:.1e} <= 1e-5)")

    for key, value in (("qk_norm", True), ("attention_bias", True), ("rope_scaling", "yarn"),
                       ("num_key_value_heads", 3)):
        try:
            titan_llama.LlamaShape.from_config(dict(TIED_GQA_LLAMA3, **{key: value}))
            check(False, f"model.{key} = {value!r} is refused")
        except titan_llama.LlamaShapeError as e:
            check(f"model.{key}" in str(e), f"model.{key} = {value!r} is refused: {e}")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
