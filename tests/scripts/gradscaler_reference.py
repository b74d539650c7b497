#!/usr/bin/env python3
"""Replays a sequence of finite / overflowing steps through torch.amp.GradScaler and writes
what it did (scale, growth tracker, unscaled gradients, parameters after each step) as JSON.
tests/unit/test_precision.cpp replays the same sequence through leantrain's LossScaler and
must match step by step. Run from the project's virtualenv: .venv/bin/python THIS OUT.json"""
import json
import sys

import torch

CONFIG = dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
# 1 = an overflow (inf) is injected into one gradient before unscaling.
PATTERN = [0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]
WEIGHTS = [1.0, 2.0, 3.0, 4.0]


def main(out_path):
    scaler = torch.amp.GradScaler("cpu", **CONFIG)
    p = torch.nn.Parameter(torch.full((4,), 0.5))
    opt = torch.optim.SGD([p], lr=0.1)
    steps = []
    for i, overflow in enumerate(PATTERN):
        opt.zero_grad()
        loss = (p * torch.tensor(WEIGHTS)).sum() * (1.0 + i)
        scaler.scale(loss).backward()
        if overflow:
            p.grad[1] = float("inf")
        scale_before = scaler.get_scale()
        scaler.unscale_(opt)
        grad = [g if g == g and abs(g) != float("inf") else None for g in p.grad.tolist()]  # JSON has no inf
        scaler.step(opt)
        scaler.update()
        steps.append(dict(overflow=overflow, scale_before=scale_before, scale_after=scaler.get_scale(),
                          growth_tracker=int(scaler._growth_tracker.item()), grad=grad, param=p.tolist()))
    with open(out_path, "w") as f:
        json.dump(dict(torch=torch.__version__, config=CONFIG, weights=WEIGHTS, steps=steps), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
