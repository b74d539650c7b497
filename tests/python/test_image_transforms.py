#!/usr/bin/env python3
"""The image_folder transforms against torchvision's on the same crop boxes.

Writes a few images with PIL (RGB and gray, PNG and JPEG, landscape, portrait, smaller than the
output), runs leantrain_image_transform (tests/tools/image_transform.cpp) on them, and checks:

- decoding: the C++ decode (libjpeg-turbo, libpng) equals PIL's pixels (PNG exactly; JPEG within
  JPEG_TOL levels, PIL bundling its own libjpeg-turbo);
- training transform: on the crop box and flip the C++ side drew, the C++ output equals
  torchvision.transforms.v2.functional.resized_crop(uint8 tensor, top, left, h, w, [S, S],
  antialias=True) (then hflip) within TOL uint8 levels, on the C++ decoded pixels (so decoding
  differences do not enter);
- eval transform: equals center_crop(resize(t, round(S / 0.875), antialias=True), [S, S]);
- the boxes follow RandomResizedCrop's rules (inside the image, area share and ratio in range
  up to rounding).

TOL = 1 level is the documented tolerance (data/include/leantrain/data/image_folder.h); on CPUs
where torchvision takes the native uint8 kernel (AVX2) the outputs are expected to be equal, and
the test prints how many values differ.

    .venv/bin/python tests/python/test_image_transforms.py build/bin/leantrain_image_transform
Exit codes: 0 pass, 1 fail, 77 skipped (no tool given or found)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

SIZE = 224
SEED, EPOCH = 1234, 3
TOL = 1
JPEG_TOL = 1


def make_images(d: str) -> list[str]:
    rng = np.random.default_rng(0)
    files = []
    for k, (h, w, mode, ext) in enumerate([(375, 500, "RGB", "jpg"), (500, 333, "RGB", "png"), (240, 320, "L", "png"),
                                           (333, 500, "L", "jpg"), (120, 90, "RGB", "png"), (375, 500, "RGB", "png"),
                                           (300, 300, "RGB", "jpg"), (64, 481, "RGB", "png")]):
        # Smooth gradients plus noise: resampling errors show on both.
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 3) % 256], -1)
        img = np.clip(base + rng.integers(-40, 41, size=(h, w, 3)), 0, 255).astype(np.uint8)
        pil = Image.fromarray(img, "RGB").convert(mode)
        path = os.path.join(d, f"img{k}.{ext}")
        pil.save(path, quality=90) if ext == "jpg" else pil.save(path)
        files.append(path)
    return files


def main() -> int:
    tool = sys.argv[1] if len(sys.argv) > 1 else ""
    if not tool or not os.path.exists(tool):
        print("skipped: leantrain_image_transform not given or not built")
        return 77
    torch.set_num_threads(1)
    failures = []
    with tempfile.TemporaryDirectory() as d:
        files = make_images(d)
        out = subprocess.run([tool, d, str(SIZE), str(SEED), str(EPOCH)] + files, capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr)
            return 1
        rows = [json.loads(line) for line in out.stdout.splitlines()]
        assert len(rows) == len(files)
        print(f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}")
        for r in rows:
            k, H, W, C = r["index"], r["height"], r["width"], r["channels"]
            name = os.path.basename(r["file"])
            dec = np.fromfile(os.path.join(d, f"{k}_decoded.bin"), np.uint8).reshape(H, W, C)
            pil = np.asarray(Image.open(r["file"]))
            pil = pil.reshape(H, W, -1)
            dd = np.abs(dec.astype(int) - pil.astype(int)).max()
            tol = 0 if name.endswith(".png") else JPEG_TOL
            if pil.shape[2] != C or dd > tol:
                failures.append(f"{name}: decode differs from PIL's by {dd} (allowed {tol})")
            t = torch.from_numpy(dec).permute(2, 0, 1).contiguous()
            # The box follows RandomResizedCrop's rules.
            top, left, h, w = r["top"], r["left"], r["h"], r["w"]
            if not (0 <= top and 0 <= left and top + h <= H and left + w <= W and h > 0 and w > 0):
                failures.append(f"{name}: box {top, left, h, w} outside {H}x{W}")
            ref = F.resized_crop(t, top, left, h, w, [SIZE, SIZE], antialias=True)
            if r["flip"]:
                ref = F.horizontal_flip(ref)
            got = torch.from_numpy(np.fromfile(os.path.join(d, f"{k}_train.bin"), np.uint8).reshape(C, SIZE, SIZE))
            diff = (got.int() - ref.int()).abs()
            ev_ref = F.center_crop(F.resize(t, [r["resize"]], antialias=True), [SIZE, SIZE])
            ev = torch.from_numpy(np.fromfile(os.path.join(d, f"{k}_eval.bin"), np.uint8).reshape(C, SIZE, SIZE))
            ediff = (ev.int() - ev_ref.int()).abs()
            print(f"{name} {H}x{W}x{C}: box top={top} left={left} h={h} w={w} flip={r['flip']}; "
                  f"train max diff {diff.max().item()} ({(diff > 0).sum().item()} of {diff.numel()} differ), "
                  f"eval max diff {ediff.max().item()} ({(ediff > 0).sum().item()} differ); decode vs PIL {dd}")
            if diff.max().item() > TOL:
                failures.append(f"{name}: train transform differs from torchvision's by {diff.max().item()} > {TOL}")
            if ediff.max().item() > TOL:
                failures.append(f"{name}: eval transform differs from torchvision's by {ediff.max().item()} > {TOL}")
        # Negative control: another box must not match (the comparison can fail).
        r = rows[0]
        dec = np.fromfile(os.path.join(d, "0_decoded.bin"), np.uint8).reshape(r["height"], r["width"], r["channels"])
        t = torch.from_numpy(dec).permute(2, 0, 1).contiguous()
        wrong = F.resized_crop(t, r["top"] + 7, r["left"], r["h"], r["w"], [SIZE, SIZE], antialias=True)
        if r["flip"]:
            wrong = F.horizontal_flip(wrong)
        got = torch.from_numpy(np.fromfile(os.path.join(d, "0_train.bin"), np.uint8).reshape(-1, SIZE, SIZE))
        if (got.int() - wrong.int()).abs().max().item() <= TOL:
            failures.append("negative control: a box moved by 7 rows still matched")
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
