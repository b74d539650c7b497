#!/usr/bin/env python3
"""The recipe a careful PyTorch user writes for the end of a step, replayed over 20 steps and
written as JSON: torch.optim.AdamW(fused=True) or SGD(momentum=0.9, fused=True) over two groups
(weight decay on matrices only),
torch.amp.GradScaler (fp16 dynamic loss scaling, overflow steps injected), unscale_, then
clip_grad_norm_, then scaler.step / update. Three cases: fp16 with clipping, fp16 without,
fp32 (no scaler) with clipping, for AdamW; fp16 with clipping and fp32 for SGD.
tests/unit/test_optimizer.cpp feeds the same scaled gradients to leantrain's FusedAdamW /
FusedSGD through apply_update and must match every step within 1e-6.
Run from the project's virtualenv: .venv/bin/python THIS OUT.json"""
import json
import sys

import torch

SHAPES = {"w1": [8, 16], "b1": [16], "w2": [4, 8]}
SCALER = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
OPT = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
SGD = dict(lr=5e-2, momentum=0.9, weight_decay=1e-2)
PATTERN = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
CASES = {"fp16_clip": ("adamw", True, 1.0), "fp16": ("adamw", True, 0.0), "fp32_clip": ("adamw", False, 1.0),
         "sgd_fp16_clip": ("sgd", True, 1.0), "sgd_fp32": ("sgd", False, 0.0)}


def run(kind, fp16, clip):
    torch.manual_seed(0)
    params = {n: torch.nn.Parameter(torch.randn(s)) for n, s in SHAPES.items()}
    init = {n: p.tolist() for n, p in params.items()}
    decay = SGD["weight_decay"] if kind == "sgd" else OPT["weight_decay"]
    groups = [{"params": [params["w1"], params["w2"]], "weight_decay": decay},
              {"params": [params["b1"]], "weight_decay": 0.0}]
    if kind == "sgd":
        opt = torch.optim.SGD(groups, lr=SGD["lr"], momentum=SGD["momentum"], fused=True)
    else:
        opt = torch.optim.AdamW(groups, lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"], fused=True)
    scaler = torch.amp.GradScaler("cpu", enabled=fp16, **SCALER)
    gen = torch.Generator().manual_seed(1)
    steps = []
    for i, overflow in enumerate(PATTERN):
        overflow = overflow and fp16
        scaler.scale(torch.zeros(()))  # the scaler's state starts at its first scale()
        scale = scaler.get_scale() if fp16 else 1.0
        grads = {n: (torch.randn(s, generator=gen) * 0.05 * (1 + i % 3) * scale).float() for n, s in SHAPES.items()}
        for n, p in params.items():
            p.grad = grads[n].clone()
        if overflow:
            params["w1"].grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        scaler.step(opt)
        scaler.update()
        steps.append(dict(overflow=int(overflow), scale_before=scale,
                          scale_after=scaler.get_scale() if fp16 else 1.0,
                          grads={n: g.tolist() for n, g in grads.items()},
                          params={n: p.tolist() for n, p in params.items()},
                          step=int(opt.state[params["w1"]]["step"].item()) if kind == "adamw" else 0))
    return dict(optimizer=kind, fp16=fp16, clip=clip, init=init, steps=steps)


def main(out_path):
    out = dict(torch=torch.__version__, scaler=SCALER, optimizer=dict(OPT, betas=list(OPT["betas"])), sgd=SGD,
               cases={name: run(*c) for name, c in CASES.items()})
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
