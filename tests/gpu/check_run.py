#!/usr/bin/env python3
"""Checks one training run of tests/gpu/run.sh from its metrics.jsonl and its log.

    check_run.py RUN_DIR LOG MODE [--device cuda|cpu]

Passes (exit 0, one line 'ok: ...') when: the log names the expected device; every step
event has a finite loss (fp16 may skip steps), a loss_scale and peak_mem_bytes > 0; the mean
loss of the last 5 steps is below 90% of the first 5; under fp16 the loss scale is a real
one (> 1), under fp32/bf16 it is 1. Otherwise exits 1 with 'FAIL: ...'.

tests/gpu/checks.py judges most of its checks with judge_training() below, on the GPU and in
the CPU rehearsal alike.
"""
import json
import math
import sys


def read_events(run_dir):
    """Every event of RUN_DIR/metrics.jsonl, in order (a line that does not parse, such as one
    cut off by a killed run, is left out)."""
    out = []
    try:
        with open(f"{run_dir}/metrics.jsonl", encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def judge_training(events, log, mode, device, min_steps=10, decrease=0.9):
    """(problems, summary, numbers) of one run: its events, its log text, its precision mode.

    decrease=None leaves out the loss-falls criterion (runs too short to learn)."""
    problems = []
    if f"device {device}" not in log:
        problems.append(f"the log does not say 'device {device}'")
    steps = [e for e in events if e.get("event") == "step"]
    skipped = sum(1 for e in events if e.get("event") == "skipped_step")
    if len(steps) < min_steps:
        problems.append(f"only {len(steps)} step events (want {min_steps})")
    for e in steps:
        if "loss_scale" not in e:
            problems.append(f"step {e.get('step')}: no loss_scale")
            break
        if not e.get("peak_mem_bytes", 0) > 0:
            problems.append(f"step {e.get('step')}: peak_mem_bytes = {e.get('peak_mem_bytes')}")
            break
    losses = [e["loss"] for e in steps if finite(e.get("loss"))]
    if mode != "fp16" and len(losses) != len(steps):
        problems.append(f"{len(steps) - len(losses)} non-finite losses under {mode}")
    first = last = float("nan")
    if len(losses) >= 10:
        first = sum(losses[:5]) / 5
        last = sum(losses[-5:]) / 5
    if decrease is not None:
        if len(losses) < 10:
            problems.append(f"{len(losses)} finite losses: too few to see the loss fall")
        elif not last < decrease * first:
            problems.append(f"loss did not fall below {decrease:g}x: first 5 mean {first:.4f}, last 5 mean {last:.4f}")
    scales = [e.get("loss_scale") for e in steps if "loss_scale" in e]
    if scales:
        if mode == "fp16" and not max(scales) > 1:
            problems.append(f"fp16 without a loss scale > 1 (max {max(scales)})")
        if mode != "fp16" and any(s != 1 for s in scales):
            problems.append(f"{mode} with a loss scale other than 1: {sorted(set(scales))[:3]}")
    peak = max((e.get("peak_mem_bytes", 0) for e in steps), default=0)
    rates = sorted(e["samples_per_s"] for e in steps[1:] if finite(e.get("samples_per_s")))
    numbers = {
        "steps": len(steps), "skipped_steps": skipped,
        "loss_first5": round(first, 6) if math.isfinite(first) else None,
        "loss_last5": round(last, 6) if math.isfinite(last) else None,
        "loss_scale_first": scales[0] if scales else None, "loss_scale_last": scales[-1] if scales else None,
        "loss_scale_max": max(scales) if scales else None,
        "peak_mem_bytes": peak,
        "samples_per_s_median": rates[len(rates) // 2] if rates else None,
    }
    summary = (f"{len(steps)} steps, {skipped} skipped, loss {first:.3f} -> {last:.3f}, "
               f"loss_scale {numbers['loss_scale_first']} -> {numbers['loss_scale_last']}, "
               f"peak_mem {peak / 2**20:.1f} MiB")
    return problems, summary, numbers


def main() -> int:
    args = sys.argv[1:]
    device = "cuda"
    if "--device" in args:
        i = args.index("--device")
        device = args[i + 1]
        del args[i:i + 2]
    run_dir, log_path, mode = args
    with open(log_path, encoding="utf-8", errors="replace") as f:
        log = f.read()
    problems, summary, _ = judge_training(read_events(run_dir), log, mode, device)
    if problems:
        print("FAIL: " + "; ".join(problems) + " (" + summary + ")")
        return 1
    print("ok: " + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
