#!/usr/bin/env python3
"""Convert a torchvision state dict (.pth, a pickle) into safetensors for leantrain.

LibTorch cannot read Python pickles, so `leantrain train --init-from` takes torchvision
weights as safetensors, converted once with this tool:

    .venv/bin/python tools/torchvision_to_safetensors.py resnet50-11ad3fa6.pth resnet50.safetensors
    leantrain train --config configs/resnet50.toml --init-from resnet50.safetensors \\
        --init-skip-mismatched          # when model.num_classes differs from the file's 1000

The file keeps torchvision's names (conv1.weight, layer1.0.bn1.running_mean, fc.bias, ...);
model.kind = resnet converts them (models/src/foreign_weights.cpp). The input is loaded with
torch.load(weights_only=True): tensors only, no code. A checkpoint that wraps the state dict
(`{"state_dict": ...}` or `{"model": ...}`) is unwrapped, and a DataParallel "module." prefix
removed. Exit codes: 0 written, 2 an input that is not a state dict of tensors.
"""
import argparse
import os
import sys

import torch
from safetensors.torch import save_file


def state_dict_of(obj):
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj:
        raise ValueError("not a state dict (a dict of name -> tensor)")
    out = {}
    for name, t in obj.items():
        if not isinstance(name, str) or not torch.is_tensor(t):
            raise ValueError(f"entry {name!r} is not a named tensor")
        if name.startswith("module."):
            name = name[len("module."):]
        out[name] = t.detach().cpu().contiguous()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pth", help="torchvision state dict (.pth)")
    p.add_argument("out", help="output .safetensors file")
    a = p.parse_args(argv)
    try:
        sd = state_dict_of(torch.load(a.pth, map_location="cpu", weights_only=True))
    except Exception as e:  # noqa: BLE001 - any unreadable input is a usage error
        print(f"torchvision_to_safetensors: {a.pth}: {e}", file=sys.stderr)
        return 2
    tmp = a.out + f".tmp.{os.getpid()}"
    try:
        save_file(sd, tmp, metadata={"format": "pt", "source": os.path.basename(a.pth)})
        os.replace(tmp, a.out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"{a.out}: {len(sd)} tensors from {a.pth}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
