"""Compares the C++ model's eval-mode output with the Python reference model's.

    PYTHONPATH=tools python -m leantrain_py.check_outputs CKPT.h5 IO.h5 [--tol 1e-5]

CKPT.h5 is a leantrain checkpoint. IO.h5 holds dataset `input` (int64 token ids [B,T] for
gpt/bert, float32 images [B,C,H,W] for resnet/mlp) and dataset `output` (the float32 logits the
C++ model returned for it in eval mode). Datasets carrying a crc32 attribute are verified.

The reference model is built from the checkpoint, put in eval mode and run in fp32 under
no_grad. Printed: the max absolute difference max|a-b| and the max relative difference
max|a-b| / max|b| (a = reference, b = C++). It passes when
max|a-b| <= tol * max(1, max|b|): an absolute tolerance for logits of magnitude <= 1, a
relative one for larger logits. A NaN/inf where the other side differs is a failure.
Exit codes: 0 within tol; 1 outside tol or a shape mismatch; 2 unreadable file / model mismatch.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import h5py
import numpy as np
import torch

from .checkpoint import CheckpointError, read_dataset, load_into_reference


def _read_io(path: str, name: str) -> np.ndarray:
    try:
        with h5py.File(path, "r") as f:
            if name not in f or not isinstance(f[name], h5py.Dataset):
                raise CheckpointError(f"{path}: no dataset '{name}'")
            ds = f[name]
            if "crc32" in ds.attrs:
                return read_dataset(ds, path, f"dataset '{name}'")
            return np.array(ds[()], order="C")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read dataset '{name}': {e}") from e


def compare(a: torch.Tensor, b: torch.Tensor, tol: float) -> dict:
    """max_abs, max_rel (max|a-b| / max|b|), max_ref (max|b|) and ok for a (reference) vs b."""
    a64, b64 = a.double(), b.double()
    same = (a64 == b64) | (torch.isnan(a64) & torch.isnan(b64))  # equal infs / both NaN
    diff = torch.where(same, torch.zeros_like(a64), (a64 - b64).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    max_abs = diff.max().item() if diff.numel() else 0.0
    finite_b = b64[torch.isfinite(b64)].abs()
    max_ref = finite_b.max().item() if finite_b.numel() else 0.0
    max_rel = max_abs / max_ref if max_ref > 0 else (0.0 if max_abs == 0 else float("inf"))
    return {"max_abs": max_abs, "max_rel": max_rel, "max_ref": max_ref,
            "ok": max_abs <= tol * max(1.0, max_ref)}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m leantrain_py.check_outputs",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="leantrain HDF5 checkpoint")
    ap.add_argument("io", help="HDF5 file with datasets `input` and `output` from the C++ model")
    ap.add_argument("--tol", type=float, default=1e-5,
                    help="pass when max|a-b| <= tol * max(1, max|b|) (default 1e-5)")
    args = ap.parse_args(argv)
    try:
        model, info = load_into_reference(args.checkpoint, device="cpu")
        x = _read_io(args.io, "input")
        y = _read_io(args.io, "output")
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    kind = info["model_config"].get("kind")
    if kind in ("gpt", "bert"):
        if x.dtype.kind not in "iu":
            print(f"error: {args.io}: input must be integer token ids for a {kind} model, got {x.dtype}",
                  file=sys.stderr)
            return 2
        inp = torch.from_numpy(x.astype(np.int64))
    else:
        inp = torch.from_numpy(x.astype(np.float32))
    expected = torch.from_numpy(y.astype(np.float32))

    model = model.float().eval()
    try:
        with torch.no_grad():
            out = model(inp)
    except (ValueError, RuntimeError) as e:
        print(f"error: the reference {kind} model rejects input {list(inp.shape)} {inp.dtype}: {e}",
              file=sys.stderr)
        return 2
    if tuple(out.shape) != tuple(expected.shape):
        print(f"FAIL: shape mismatch: reference output {list(out.shape)}, C++ output {list(expected.shape)}")
        return 1
    r = compare(out, expected, args.tol)
    verdict = "OK" if r["ok"] else "FAIL"
    print(f"{verdict}: {kind} output {list(out.shape)}: max abs diff {r['max_abs']:.3e}, "
          f"max rel diff {r['max_rel']:.3e} (max|C++ output| {r['max_ref']:.4g}), "
          f"tol {args.tol:g} x max(1, max|C++ output|)")
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
