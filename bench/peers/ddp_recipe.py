#!/usr/bin/env python3
"""The PyTorch recipe leantrain is compared with on GPT, BERT and ResNet: DistributedDataParallel
+ torch.autocast + torch.utils.checkpoint + no_sync() gradient accumulation, written as a
careful user would.

    torchrun --nproc_per_node N bench/peers/ddp_recipe.py --config RUN/config.json \\
        --init CKPT.h5 --out DIR

--config is leantrain's fully resolved config.json (what `leantrain train` writes into its
run directory), so every hyper-parameter is the one leantrain ran with: the model (the same
definitions, tools/leantrain_py/reference_models.py), and through peer_loop.py (the loop the
peer recipes share) the synthetic data, AdamW or SGD with leantrain's parameter groups, the
warmup + cosine schedule, gradient clipping, precision (fp32; bf16 autocast; fp16 autocast
with torch.amp.GradScaler), global batch = world x micro x accumulation. Activation recompute
"full": every block through torch.utils.checkpoint with use_reentrant=False.
--init is a leantrain checkpoint holding the initial weights (compare.py writes one with
leantrain at step 0); its parameters are loaded, buffers keep their fresh values.

Rank 0 writes DIR/metrics.jsonl (peer_loop.py says what is in it and what a step's time covers).
Exit codes: 0 done, 2 bad arguments or config.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import peer_loop  # noqa: E402  (puts tools/ on sys.path)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from leantrain_py.checkpoint import load_checkpoint  # noqa: E402
from leantrain_py.reference_models import build_model  # noqa: E402

usage_error = peer_loop.usage_error


def checkpoint_blocks(model: torch.nn.Module) -> int:
    """Every repeated block runs through torch.utils.checkpoint (non-reentrant): its
    activations are recomputed in backward. Overriding forward on the instance keeps the
    module tree, and so the state_dict names, unchanged."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return 0
    for block in blocks:
        inner = block.forward

        def wrapped(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = wrapped
    return len(blocks)


def lm_or_class_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Token or image-class cross entropy on fp32 logits (-100: no target, BERT's unmasked tokens)."""
    logits = model(x).float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="leantrain's resolved config.json")
    ap.add_argument("--init", required=True, help="leantrain checkpoint with the initial weights")
    ap.add_argument("--out", required=True, help="directory for metrics.jsonl (rank 0)")
    args = ap.parse_args(argv)
    run = peer_loop.setup(args.config, args.out)

    model = build_model(run.model_cfg)
    info = load_checkpoint(args.init)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(info["state_dict"]))
    if missing:
        usage_error(f"--init {args.init}: no tensor for parameter(s) {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, p in params.items():
            src = info["state_dict"][name]
            if tuple(src.shape) != tuple(p.shape):
                usage_error(f"--init {args.init}: {name} has shape {list(src.shape)}, the model {list(p.shape)}")
            p.copy_(src)
    del info
    model.to(run.device).train()
    n_ckpt = checkpoint_blocks(model) if run.policy == "full" else 0
    return peer_loop.train(run, model, lm_or_class_loss, f"{run.model_cfg['kind']} ({n_ckpt} blocks checkpointed)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
