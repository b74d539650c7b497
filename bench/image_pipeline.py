#!/usr/bin/env python3
"""Benchmark: leantrain's image pipeline against torchvision's ImageFolder + DataLoader, in one run.

    .venv/bin/python bench/image_pipeline.py build/bin/leantrain_bench_image [--images 500]
        [--workers 2] [--batch 32] [--epochs 2] [--dir DIR] [--out results.jsonl]

Generates (once per --dir) a folder of --images JPEGs of 375x500 (quality 90, 10 classes;
gradients, shapes and noise, so they neither compress to nothing nor decode trivially), then
measures, alternating leantrain / torchvision / leantrain / torchvision:

- leantrain: build/bin/leantrain_bench_image (bench/image_pipeline.cpp): the image_folder kind
  with `workers` decode threads, RandomResizedCrop(224) + flip + normalise, batches of --batch in
  the epoch's permutation; one untimed warm-up epoch, then --epochs timed epochs;
- torchvision: datasets.ImageFolder (PIL decode) + DataLoader(num_workers=workers,
  batch_size=batch, shuffle=True, persistent_workers=True) with transforms.v2
  RandomResizedCrop(224, antialias=True), RandomHorizontalFlip(), ToImage(),
  ToDtype(float32, scale=True), Normalize(ImageNet); one untimed warm-up epoch (starts the
  workers), then --epochs timed epochs.

Prints images/s of each (the better of the two rounds) and the ratio leantrain / torchvision
(target >= 1.0). Timings only; no assertion.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def make_folder(root: str, n: int) -> None:
    from PIL import Image, ImageDraw

    marker = os.path.join(root, f".complete_{n}")
    if os.path.exists(marker):
        return
    rng = np.random.default_rng(0)
    h, w = 375, 500
    y, x = np.mgrid[0:h, 0:w]
    for i in range(n):
        cls = os.path.join(root, f"class{i % 10}")
        os.makedirs(cls, exist_ok=True)
        a, b = rng.uniform(0.005, 0.05, 2)
        base = np.stack([127 + 120 * np.sin(a * x + i), 127 + 120 * np.cos(b * y), (x + y + 7 * i) % 256], -1)
        img = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        pil = Image.fromarray(img, "RGB")
        d = ImageDraw.Draw(pil)
        for _ in range(6):
            x0, y0 = int(rng.integers(0, w - 60)), int(rng.integers(0, h - 60))
            d.ellipse([x0, y0, x0 + int(rng.integers(20, 120)), y0 + int(rng.integers(20, 120))],
                      fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        pil.save(os.path.join(cls, f"{i:05d}.jpg"), quality=90)
    open(marker, "w").close()


def bench_leantrain(tool: str, root: str, args) -> dict:
    out = subprocess.run([tool, root, "--workers", str(args.workers), "--batch", str(args.batch), "--epochs",
                          str(args.epochs)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_torchvision(root: str, args) -> dict:
    import torch
    from torchvision import datasets
    from torchvision.transforms import v2

    tf = v2.Compose([
        v2.RandomResizedCrop(224, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(root, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                         persistent_workers=args.workers > 0)
    checksum = 0.0
    for x, _ in loader:  # warm-up: starts the workers
        checksum += float(x[0, 0, 0, 0])
    t0 = time.perf_counter()
    n = 0
    for _ in range(args.epochs):
        for x, _ in loader:
            checksum += float(x[0, 0, 0, 0])
            n += x.shape[0]
    s = time.perf_counter() - t0
    del loader
    return {"pipeline": "torchvision", "images_per_s": n / s, "images": n, "seconds": s, "workers": args.workers,
            "batch": args.batch, "torch": torch.__version__}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("tool")
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--dir", default="/tmp/leantrain_bench_images")
    p.add_argument("--out", default="")
    args = p.parse_args()
    root = os.path.join(args.dir, f"jpeg_{args.images}")
    os.makedirs(root, exist_ok=True)
    make_folder(root, args.images)
    ours, theirs = [], []
    for _ in range(2):
        ours.append(bench_leantrain(args.tool, root, args))
        theirs.append(bench_torchvision(root, args))
    a = max(ours, key=lambda r: r["images_per_s"])
    b = max(theirs, key=lambda r: r["images_per_s"])
    ratio = a["images_per_s"] / b["images_per_s"]
    print(f"{args.images} JPEGs 375x500 -> RandomResizedCrop 224 + flip + normalise, {args.workers} workers, "
          f"batch {args.batch}, {args.epochs} timed epochs (best of 2 rounds)")
    print(f"  leantrain image_folder:          {a['images_per_s']:8.1f} images/s  "
          f"(rounds: {', '.join('%.1f' % r['images_per_s'] for r in ours)})")
    print(f"  torchvision ImageFolder+DataLoader: {b['images_per_s']:8.1f} images/s  "
          f"(rounds: {', '.join('%.1f' % r['images_per_s'] for r in theirs)})")
    print(f"  ratio leantrain / torchvision: {ratio:.2f}x (target >= 1.0x)")
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps({"bench": "image_pipeline", "leantrain": a, "torchvision": b, "ratio": ratio}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
