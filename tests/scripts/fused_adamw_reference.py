#!/usr/bin/env python3
"""The recipe a careful PyTorch user writes for the end of a step, replayed over 20 steps and
written as JSON: torch.optim.AdamW(fused=True) over two groups (weight decay on matrices only),
torch.amp.GradScaler (fp16 dynamic loss scaling, overflow steps injected), unscale_, then
clip_grad_norm_, then scaler.step / update. Three cases: fp16 with clipping, fp16 without,
fp32 (no scaler) with clipping. tests/unit/test_optimizer.cpp feeds the same scaled gradients
to leantrain's FusedAdamW through apply_update and must match every step within 1e-6.
Run from the project's virtualenv: .venv/bin/python THIS OUT.json"""
import json
import sys

import torch

SHAPES = {"w1": [8, 16], "b1": [16], "w2": [4, 8]}
SCALER = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
OPT = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
PATTERN = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
CASES = {"fp16_clip": (True, 1.0), "fp16": (True, 0.0), "fp32_clip": (False, 1.0)}


def run(fp16, clip):
    torch.manual_seed(0)
    params = {n: torch.nn.Parameter(torch.randn(s)) for n, s in SHAPES.items()}
    init = {n: p.tolist() for n, p in params.items()}
    opt = torch.optim.AdamW([{"params": [params["w1"], params["w2"]], "weight_decay": OPT["weight_decay"]},
                             {"params": [params["b1"]], "weight_decay": 0.0}],
                            lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"], fused=True)
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
                          step=int(opt.state[params["w1"]]["step"].item())))
    return dict(fp16=fp16, clip=clip, init=init, steps=steps)


def main(out_path):
    out = dict(torch=torch.__version__, scaler=SCALER, optimizer=dict(OPT, betas=list(OPT["betas"])),
               cases={name: run(*c) for name, c in CASES.items()})
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
