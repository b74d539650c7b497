#!/usr/bin/env python3
"""Checks one training run of tests/gpu/run.sh from its metrics.jsonl and its log.

    check_run.py RUN_DIR LOG MODE [--device cuda|cpu]

Passes (exit 0, one line 'ok: ...') when: the log names the expected device; every step
event has a finite loss (fp16 may skip steps), a loss_scale and peak_mem_bytes > 0; the mean
loss of the last 5 steps is below 90% of the first 5; under fp16 the loss scale is a real
one (> 1), under fp32/bf16 it is 1. Otherwise exits 1 with 'FAIL: ...'.
"""
import json
import math
import sys


def main() -> int:
    args = sys.argv[1:]
    device = "cuda"
    if "--device" in args:
        i = args.index("--device")
        device = args[i + 1]
        del args[i:i + 2]
    run_dir, log_path, mode = args
    problems = []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        log = f.read()
    if f"device {device}" not in log:
        problems.append(f"the log does not say 'device {device}'")
    steps = []
    skipped = 0
    with open(f"{run_dir}/metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "step":
                steps.append(e)
            elif e.get("event") == "skipped_step":
                skipped += 1
    if len(steps) < 10:
        problems.append(f"only {len(steps)} step events")
    for e in steps:
        if "loss_scale" not in e:
            problems.append(f"step {e.get('step')}: no loss_scale")
            break
        if not e.get("peak_mem_bytes", 0) > 0:
            problems.append(f"step {e.get('step')}: peak_mem_bytes = {e.get('peak_mem_bytes')}")
            break
    losses = [e["loss"] for e in steps if isinstance(e.get("loss"), (int, float)) and math.isfinite(e["loss"])]
    if mode != "fp16" and len(losses) != len(steps):
        problems.append(f"{len(steps) - len(losses)} non-finite losses under {mode}")
    first = last = float("nan")
    if len(losses) >= 10:
        first = sum(losses[:5]) / 5
        last = sum(losses[-5:]) / 5
        if not last < 0.9 * first:
            problems.append(f"loss did not decrease: first 5 mean {first:.4f}, last 5 mean {last:.4f}")
    scales = [e.get("loss_scale") for e in steps if "loss_scale" in e]
    if scales:
        if mode == "fp16" and not max(scales) > 1:
            problems.append(f"fp16 without a loss scale > 1 (max {max(scales)})")
        if mode != "fp16" and any(s != 1 for s in scales):
            problems.append(f"{mode} with a loss scale other than 1: {sorted(set(scales))[:3]}")
    peak = max((e.get("peak_mem_bytes", 0) for e in steps), default=0)
    summary = (f"{len(steps)} steps, {skipped} skipped, loss {first:.3f} -> {last:.3f}, "
               f"loss_scale {scales[0] if scales else None} -> {scales[-1] if scales else None}, "
               f"peak_mem {peak / 2**20:.1f} MiB")
    if problems:
        print("FAIL: " + "; ".join(problems) + " (" + summary + ")")
        return 1
    print("ok: " + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
