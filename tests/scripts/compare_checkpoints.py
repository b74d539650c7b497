#!/usr/bin/env python3
"""Compares two leantrain checkpoints tensor by tensor (h5py, no leantrain code involved).

    compare_checkpoints.py A.h5 B.h5 [--rtol R] [--groups model,optimizer]

--rtol 0 (the default) demands bitwise equality; otherwise every tensor must satisfy
max|a-b| <= rtol * max(max|b|, tiny). Prints the worst tensor; exits 0 when equal, 1 when not,
2 when a file cannot be read or the two hold different tensor names.
"""
import argparse
import sys

import h5py
import numpy as np


def tensors(f, group):
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out[name] = obj[()]

    f[group].visititems(visit)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=0.0)
    ap.add_argument("--groups", default="model")
    args = ap.parse_args()
    try:
        fa, fb = h5py.File(args.a, "r"), h5py.File(args.b, "r")
    except OSError as e:
        print(f"cannot read: {e}")
        return 2
    worst, worst_name, bad = 0.0, "", []
    for group in args.groups.split(","):
        ta, tb = tensors(fa, group), tensors(fb, group)
        if ta.keys() != tb.keys():
            print(f"/{group}: different tensors: {sorted(ta.keys() ^ tb.keys())[:10]}")
            return 2
        for name in sorted(ta):
            a, b = np.asarray(ta[name]), np.asarray(tb[name])
            if a.shape != b.shape:
                bad.append(f"/{group}/{name}: shape {a.shape} vs {b.shape}")
                continue
            if args.rtol == 0.0:
                if a.tobytes() != b.tobytes():
                    bad.append(f"/{group}/{name}: not bitwise equal")
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            scale = max(float(np.max(np.abs(b64))) if b64.size else 0.0, 1e-12)
            rel = float(np.max(np.abs(a64 - b64))) / scale if a64.size else 0.0
            if rel > worst:
                worst, worst_name = rel, f"/{group}/{name}"
            if rel > args.rtol:
                bad.append(f"/{group}/{name}: relative difference {rel:.3e} > {args.rtol:.1e}")
    print(f"worst relative difference {worst:.3e} ({worst_name or 'none'})")
    for line in bad[:20]:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
