#!/usr/bin/env python3
"""The Llama peers leantrain's `llama` kind is compared with, each as its users run it:

  --impl hf              Hugging Face transformers: LlamaForCausalLM from a LlamaConfig
                         (attn_implementation="sdpa", use_cache=False), the model's own loss
                         (labels with shift_labels: leantrain's targets are already shifted, the
                         path the HF Trainer takes for shifted labels), and for recompute "full"
                         model.gradient_checkpointing_enable(use_reentrant=False): what most
                         fine-tuners run.
  --impl titan           a torchtitan-style Llama in plain PyTorch (titan_llama.py: RMSNorm,
                         complex RoPE, SDPA with enable_gqa, SwiGLU); recompute "full" wraps
                         every block in torch's checkpoint_wrapper (non-reentrant,
                         preserve_rng_state=False), as torchtitan's apply_ac does.
  --impl titan-compiled  the same, and then each block compiled with
                         torch.compile(fullgraph=True) (default inductor backend: C++ on the CPU)
                         and the loss compiled, as torchtitan's apply_compile and its compiled
                         loss do, after the checkpoint wrapping and before DDP.

    torchrun --nproc_per_node N bench/peers/llama_recipe.py --impl hf --config RUN/config.json \\
        --init CKPT.h5 --out DIR

Everything around the model is peer_loop.py's, the same loop as ddp_recipe.py's (DDP with
no_sync, autocast, AdamW(fused=True) with leantrain's groups and schedule, leantrain's samples
in leantrain's order). --config is leantrain's resolved config.json (model.kind "llama");
--init a leantrain checkpoint with the initial weights (Note [Same start] in compare.py): the
HF model takes them under its own names (model. prefix, layers for blocks), the titan model
through torchtitan's from_hf conversion (titan_llama.py).

If torch.compile cannot compile the model on this machine, the run writes DIR/unavailable.json
({"impl", "error"}: the exception's type and message) and exits 3, so that compare.py reports
the column as unavailable with that error instead of failing the whole bench.
Exit codes: 0 done, 2 bad arguments or config, 3 the implementation cannot run here (above).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import peer_loop  # noqa: E402  (puts tools/ on sys.path)
import torch  # noqa: E402

import titan_llama  # noqa: E402
from leantrain_py.checkpoint import load_checkpoint  # noqa: E402

IMPLS = ("hf", "titan", "titan-compiled")
EXIT_UNAVAILABLE = 3


def hf_config(s: titan_llama.LlamaShape):
    """The LlamaConfig of the shape: what a config.json of this model says, plus use_cache=False."""
    from transformers import LlamaConfig

    rope = {"rope_type": "default", "rope_theta": s.rope_theta}
    if s.rope_scaling == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": s.rope_theta, "factor": s.rope_factor,
                "low_freq_factor": s.rope_low_freq_factor, "high_freq_factor": s.rope_high_freq_factor,
                "original_max_position_embeddings": s.rope_original_max_position_embeddings}
    return LlamaConfig(vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                       num_hidden_layers=s.num_hidden_layers, num_attention_heads=s.num_attention_heads,
                       num_key_value_heads=s.num_key_value_heads, head_dim=s.head_dim, hidden_act="silu",
                       max_position_embeddings=s.max_position_embeddings, rms_norm_eps=s.rms_norm_eps,
                       tie_word_embeddings=s.tie_word_embeddings, attention_bias=False, mlp_bias=False,
                       attention_dropout=0.0, rope_parameters=rope, use_cache=False)


def build_hf(s: titan_llama.LlamaShape, state_dict) -> torch.nn.Module:
    """LlamaForCausalLM with SDPA attention in fp32, leantrain's tensors copied in."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config(s), attn_implementation="sdpa", dtype=torch.float32)
    have = {titan_llama.leantrain_to_hf_name(k): v for k, v in state_dict.items()}
    params = dict(model.named_parameters())  # a tied lm_head.weight is listed once, as embed_tokens
    missing = sorted(set(params) - set(have))
    if missing:
        raise titan_llama.LlamaShapeError(f"no leantrain tensor for parameter(s) {', '.join(missing[:5])}")
    extra = sorted(set(have) - set(params) - ({"lm_head.weight"} if s.tie_word_embeddings else set()))
    if extra:
        raise titan_llama.LlamaShapeError(f"leantrain tensor(s) {', '.join(extra[:5])}: LlamaForCausalLM has no such "
                                          "parameter")
    with torch.no_grad():
        for name, p in params.items():
            if tuple(have[name].shape) != tuple(p.shape):
                raise titan_llama.LlamaShapeError(f"{name}: the checkpoint has shape {list(have[name].shape)}, "
                                                  f"the model {list(p.shape)}")
            p.copy_(have[name])
    return model


def hf_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=y, shift_labels=y).loss


def apply_ac(model: titan_llama.Transformer) -> None:
    """torchtitan's full activation checkpointing: each block in checkpoint_wrapper."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for layer_id, block in model.layers.named_children():
        model.layers.register_module(layer_id, checkpoint_wrapper(block, preserve_rng_state=False))


def apply_compile(model: titan_llama.Transformer) -> None:
    """torchtitan's apply_compile: each block on its own (the repeated structure compiles once)."""
    for layer_id, block in model.layers.named_children():
        model.layers.register_module(layer_id, torch.compile(block, fullgraph=True))


def build(impl: str, run: peer_loop.Run, state_dict) -> Tuple[torch.nn.Module, peer_loop.LossFn, str]:
    s = titan_llama.LlamaShape.from_config(run.model_cfg)
    full = run.policy == "full"
    if impl == "hf":
        model = build_hf(s, state_dict).to(run.device).train()
        if full:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model, hf_loss, f"transformers LlamaForCausalLM (sdpa{', gradient checkpointing' if full else ''})"
    model = titan_llama.Transformer(s)
    titan_llama.load_leantrain_weights(model, state_dict)
    model.to(run.device).train()
    loss = titan_llama.cross_entropy_loss
    if full:
        apply_ac(model)
    if impl == "titan-compiled":
        apply_compile(model)
        loss = torch.compile(titan_llama.cross_entropy_loss)
    what = f"torchtitan-style Llama ({'compiled per block' if impl == 'titan-compiled' else 'eager'}" \
           f"{', checkpoint_wrapper per block' if full else ''})"
    return model, (lambda m, x, y: loss(m(x), y)), what


def is_compile_failure(e: BaseException) -> bool:
    """An error raised by torch.compile's machinery (dynamo, AOTAutograd, inductor, the C++
    compiler it runs), as opposed to one in the model or the loop."""
    names = {c.__module__ for c in type(e).__mro__}
    return any(n.startswith(("torch._dynamo", "torch._inductor", "torch._functorch")) for n in names)


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", required=True, choices=IMPLS)
    ap.add_argument("--config", required=True, help="leantrain's resolved config.json (model.kind = llama)")
    ap.add_argument("--init", required=True, help="leantrain checkpoint with the initial weights")
    ap.add_argument("--out", required=True, help="directory for metrics.jsonl (rank 0)")
    args = ap.parse_args(argv)
    run = peer_loop.setup(args.config, args.out)
    info = load_checkpoint(args.init)
    try:
        model, loss_fn, what = build(args.impl, run, info["state_dict"])
    except titan_llama.LlamaShapeError as e:
        peer_loop.usage_error(f"--config {args.config} / --init {args.init}: {e}")
    del info
    # leantrain's synthetic stream depends on the model's input contract only (tokens with
    # next-token targets: data/src/datasets.cpp make_synthetic), so a llama model draws the
    # samples a GPT of the same vocabulary and sequence length draws.
    stream = {"kind": "gpt", "seq_len": run.model_cfg["seq_len"], "vocab_size": run.model_cfg["vocab_size"]}
    try:
        return peer_loop.train(run, model, loss_fn, what, data_model_cfg=stream)
    except Exception as e:  # noqa: BLE001 -- only compile failures are kept; the rest re-raised
        if args.impl != "titan-compiled" or not is_compile_failure(e):
            raise
        msg = f"{type(e).__module__}.{type(e).__name__}: {e}"
        print(f"llama_recipe.py: torch.compile failed on this machine (torch {torch.__version__}):\n"
              f"{traceback.format_exc()}", file=sys.stderr)
        if run.rank == 0:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "unavailable.json"), "w") as fh:
                json.dump({"impl": args.impl, "torch": torch.__version__, "error": msg[:4000]}, fh, indent=1)
        return EXIT_UNAVAILABLE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
