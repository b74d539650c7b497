"""Exports a leantrain checkpoint's model tensors as a PyTorch state_dict file.

    PYTHONPATH=tools python -m leantrain_py.export CKPT.h5 OUT.pt [--no-verify]

OUT.pt is torch.save(OrderedDict name -> tensor) of /model, loadable with
torch.load(OUT.pt, weights_only=True) and then reference_models.build_model(model_config)
.load_state_dict(..., strict=True). By default the tensors are first checked (names, shapes,
dtypes) against the reference model built from the checkpoint's model_config.
Exit codes: 0 written; 2 unreadable or mismatching checkpoint, or the output not writable.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import torch

from .checkpoint import CheckpointError, build_reference, check_state_dict, load_checkpoint


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m leantrain_py.export", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="leantrain HDF5 checkpoint (step-NNNNNNNN.h5)")
    ap.add_argument("out", help="output file for torch.save(state_dict)")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip the check against the reference model's names, shapes and dtypes")
    args = ap.parse_args(argv)
    try:
        info = load_checkpoint(args.checkpoint)
        if not args.no_verify:
            check_state_dict(build_reference(info, device="meta"), info["state_dict"], args.checkpoint)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sd = info["state_dict"]
    try:
        torch.save(sd, args.out)
    except OSError as e:
        print(f"error: cannot write {args.out}: {e}", file=sys.stderr)
        return 2
    n_elems = sum(t.numel() for t in sd.values() if t.is_floating_point())
    n_bytes = sum(t.numel() * t.element_size() for t in sd.values())
    kind = (info["model_config"] or {}).get("kind", "?")
    step = info["attrs"].get("step", "?")
    print(f"wrote {args.out}: state_dict of {len(sd)} tensors ({n_elems:,} floating-point elements, "
          f"{n_bytes:,} bytes), model {kind}, step {step}, from {args.checkpoint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
