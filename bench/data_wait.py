#!/usr/bin/env python3
"""Benchmark: the share of a ResNet-50 training step spent waiting for data, on an image folder.

    .venv/bin/python bench/data_wait.py build/bin/leantrain [--images 500] [--size 224]
        [--micro-batch 16] [--steps 8] [--workers 2] [--dir DIR]

Generates (once per --dir) the JPEG folder of bench/image_pipeline.py (375x500, 10 classes),
then trains ResNet-50 (3 channels, --size, 10 classes, fp32) on it with the image_folder kind
(RandomResizedCrop + flip, --workers decode threads) for --steps steps. The trainer builds the
next micro-batch on a background thread while the current one runs (Note [Prefetch] in
trainers/src/trainer.cpp), so data_time_s in metrics.jsonl is only the wait for a batch that
was not ready. Prints, over the steps after the first (whose batch nobody could prefetch), the
sum of data_time_s over the sum of step_time_s (target < 5 %), and the images/s the decode
threads would need. Timings only; no assertion.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from image_pipeline import make_folder  # noqa: E402

CONFIG = """
[model]
kind = "resnet"
depth = 50
in_channels = 3
image_size = {size}
num_classes = 10

[data]
kind = "image_folder"
train = "{root}"
workers = {workers}

[train]
global_batch = {micro}
micro_batch = {micro}
steps = {steps}
lr = 0.01
eval_batch = {micro}

[log]
every_steps = 1
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("leantrain")
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dir", default="/tmp/leantrain_data_wait_images")
    a = p.parse_args()
    make_folder(a.dir, a.images)
    with tempfile.TemporaryDirectory(prefix="data_wait_") as tmp:
        cfg = os.path.join(tmp, "resnet50_images.toml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(size=a.size, root=a.dir, workers=a.workers, micro=a.micro_batch, steps=a.steps))
        out = os.path.join(tmp, "run")
        r = subprocess.run([a.leantrain, "train", "--config", cfg, "--out", out], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr[-2000:], file=sys.stderr)
            return 1
        steps = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"event":"step"' in l]
    rest = steps[1:]
    data = sum(s["data_time_s"] for s in rest)
    step = sum(s["step_time_s"] for s in rest)
    need = a.micro_batch * len(rest) / step
    print(f"ResNet-50 {a.size}x{a.size}, micro-batch {a.micro_batch}, {a.workers} decode threads, "
          f"steps 2..{len(steps)}: step time {step / len(rest):.3f} s, waiting for data {data / len(rest) * 1e3:.3f} ms "
          f"per step = {100 * data / step:.3f} % of the step (target < 5 %); the model consumes {need:.1f} images/s; "
          f"first step's data time (no prefetch possible) {steps[0]['data_time_s'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
