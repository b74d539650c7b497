#!/usr/bin/env python3
"""The criteria of tests/gpu/run.sh, one function per check, and the results file they fill.

The same code judges the GPU run and its CPU rehearsal (`run.sh --device cpu`), so the
rehearsal in CI proves what will judge the GPU's numbers. Standard library only: it runs with
whichever Python the machine has.

    checks.py probe OUT                       print the environment, write OUT/probe.json
    checks.py record OUT NAME STATUS DETAIL --device D [--numbers JSON] [--elapsed S]
    checks.py judge OUT NAME KIND --device D [--elapsed S] [--arg KEY=VALUE]... DIR...
    checks.py budget DIR                      the OOM check's budget from a reference run
    checks.py finish OUT --device D --elapsed S
    checks.py selftest                        every criterion against made-up runs

Each judged or recorded check appends one line to OUT/checks.jsonl and rewrites
OUT/gpu_results.json at once, so a run cut off by its time limit still leaves every check it
finished. `finish` marks the file complete, prints the summary table (also OUT/summary.txt)
and exits 0 only when no check failed and every required one passed. On a GPU every check is
required; in the CPU rehearsal a check may be skipped, with its reason (a GPU-only gtest).

A DIR is what run.sh's run_cmd leaves: rc (exit status; 124/137 = its timeout), elapsed_s,
log.txt (stdout and stderr), cmd.txt, and whatever the command wrote (metrics.jsonl,
config.json, gtest.json, inspect.json).
"""
import contextlib
import fnmatch
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_run import finite, judge_training, read_events  # noqa: E402

GiB, MiB = 2**30, 2**20

# ---------------------------------------------------------------------------------- claims
# Activation memory of GPT-2 small's shape at seq 1024 (12 layers, d 768, 12 heads, vocab
# 50257, micro-batch 4, bf16 autocast, dropout 0, momentum-free SGD), measured on the CPU by
# leantrain_bench_attention (docs/PRECISION_AND_MEMORY.md, "Measured at the issue's shape",
# rerun at 8706fbc): plain attention, recompute none 2.22 GiB (peak 3.15 GiB); full 342.77
# MiB (peak 1.26 GiB); sdpa none 1.08 GiB (peak 2.01 GiB). `selective` recomputes the
# attention core, dropping the plain core's [B,H,T,T] probabilities, 96 MiB a layer — what
# SDPA drops — so it should keep about what sdpa none keeps: 0.49x of none. The memory check
# runs that shape with the plain core and SGD, so these numbers compare directly.
CLAIM_SHAPE = {"d_model": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "seq_len": 1024,
               "micro_batch": 4, "precision": "bf16", "attention": "plain"}
CLAIMS = {
    "source": "docs/PRECISION_AND_MEMORY.md, Measured at the issue's shape (CPU, 8706fbc)",
    "activations_none_bytes": int(2.22 * GiB),
    "activations_selective_bytes": int(1.08 * GiB),
    "activations_full_bytes": int(342.77 * MiB),
    "peak_none_bytes": int(3.15 * GiB),
    "peak_full_bytes": int(1.26 * GiB),
    "activations_selective_over_none": round(1.08 / 2.22, 3),
    "activations_full_over_none": round(342.77 / (2.22 * 1024), 3),
    "peak_full_over_none": round(1.26 / 3.15, 3),
    # README's Measured table, the other shape (seq 512, micro-batch 8), for the record.
    "readme_seq512_activations_selective_over_none": round(1.99 / 3.64, 3),
    "readme_seq512_activations_full_over_none": round(645.62 / (3.64 * 1024), 3),
}
# A measured activation ratio passes within this factor of its claim either way: the claims
# are CPU numbers and on CUDA the fused loss keeps two [rows, V] buffers a chunk instead of
# one (+~150 MB on none, docs/PRECISION_AND_MEMORY.md), which moves the ratios by < 10%.
CLAIM_FACTOR = 1.5

# Dense bf16 tensor peaks (no sparsity), first match of the card's name wins.
PEAK_BF16 = [
    ("H100 PCIe", 756e12, "NVIDIA H100 PCIe datasheet: 756 TFLOP/s bf16 dense"),
    ("H100 NVL", 835e12, "NVIDIA H100 NVL datasheet: 835 TFLOP/s bf16 dense"),
    ("H100", 989e12, "NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 dense"),
    ("H200", 989e12, "NVIDIA H200 datasheet: 989 TFLOP/s bf16 dense (as H100 SXM)"),
    ("A100", 312e12, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense"),
]

# Tolerances, each with why (docs/GPU.md, "The device script").
TOL = {
    # none vs full recompute with dropout, same seed: bitwise on the CPU (the dropout bits are
    # kept, Note [Dropout masks kept as bits]); on CUDA the rerun draws again from the restored
    # generator, so the masks are the same and only atomics (index_add_ in the fused loss, the
    # attention backward) differ run to run: within 1e-4 relative, or 10x the difference of
    # two identical `none` runs measured beside it, whichever is larger.
    "replay_rel": {"cpu": 0.0, "cuda": 1e-4},
    "replay_noise_factor": 10.0,
    # A checkpoint resumed on the other device: fp32 matmuls (TF32 off, PyTorch's default) on
    # two devices round differently; 10 steps of a small GPT stay within 1e-3 relative. A
    # resume that lost the weights or the moments is off by far more (the loss restarts near
    # ln(vocab) or jumps).
    "resume_rel": 1e-3,
    # The OOM back-off redoes the step with the same samples; bf16 autocast over micro-batches
    # of another size rounds differently.
    "backoff_rel": 2e-2,
    # int8 moments: ~2 bytes a parameter instead of 8, tensors under 4096 elements stay fp32.
    "int8_state_ratio_max": 0.4,
}


# ---------------------------------------------------------------------------------- runs
class Run:
    """One command's folder, as run.sh's run_cmd leaves it."""

    def __init__(self, path):
        self.path = path.rstrip("/")
        self.name = os.path.basename(self.path)
        self.rc = _read_int(os.path.join(self.path, "rc"))
        self.elapsed_s = _read_float(os.path.join(self.path, "elapsed_s"))
        self.log = _read_text(os.path.join(self.path, "log.txt"))
        self.events = read_events(self.path)
        self.config = _read_json(os.path.join(self.path, "config.json")) or {}

    def steps(self):
        """Step events by step number (a resumed run appends; the last line of a step wins)."""
        return {e["step"]: e for e in self.events if e.get("event") == "step" and "step" in e}

    def losses(self):
        return {k: e.get("loss") for k, e in sorted(self.steps().items())}

    def of(self, kind):
        return [e for e in self.events if e.get("event") == kind]

    def exit_problem(self):
        """None, or why the command did not end well (its last error line)."""
        if self.rc == 0:
            return None
        if self.rc is None:
            return f"{self.name}: did not run (no rc file)"
        why = {124: "timed out", 137: "killed after its timeout"}.get(self.rc, f"exit {self.rc}")
        lines = [ln for ln in self.log.splitlines() if re.search(r"error|fail|abort|what\(\)", ln, re.I)]
        tail = (lines[-1] if lines else (self.log.strip().splitlines() or [""])[-1])[:220]
        return f"{self.name}: {why}: {tail}"


def _read_text(p):
    try:
        with open(p, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _read_int(p):
    t = _read_text(p).strip()
    return int(t) if re.fullmatch(r"-?\d+", t) else None


def _read_float(p):
    try:
        return float(_read_text(p).strip())
    except ValueError:
        return None


def _read_json(p):
    try:
        with open(p, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rel_diffs(a, b):
    """Max relative difference of two {step: loss} maps over their common steps, and the
    steps one has and the other lacks."""
    common = sorted(set(a) & set(b))
    worst = 0.0
    for s in common:
        x, y = a[s], b[s]
        if not (finite(x) and finite(y)):
            return math.inf, common, sorted(set(a) ^ set(b))
        worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-12))
    return worst, common, sorted(set(a) ^ set(b))


def mib(x):
    return round(x / MiB, 2) if isinstance(x, (int, float)) else None


def training(run, mode, device, **kw):
    """Problems (exit status first) and numbers of one training run."""
    bad = run.exit_problem()
    problems, summary, numbers = judge_training(run.events, run.log, mode, device, **kw)
    numbers["elapsed_s"] = run.elapsed_s
    return ([bad] if bad else []) + [f"{run.name}: {p}" for p in problems], summary, numbers


def verdict(problems, detail, numbers):
    return ("fail" if problems else "pass"), numbers, ("; ".join(problems) + " | " + detail if problems else detail)


# ---------------------------------------------------------------------------------- judges
# Each: (runs, device, args) -> (status, numbers, detail).

def j_probe(runs, device, args):
    """The machine as the probe saw it: on a GPU, nvidia-smi lists a card and torch sees it."""
    p = _read_json(os.path.join(args["out"], "probe.json")) or {}
    t = p.get("torch") or {}
    gpus = p.get("gpus") or []
    numbers = {"cores": p.get("cores"), "gpus": [g.get("name") for g in gpus],
               "driver": gpus[0].get("driver") if gpus else None, "torch": t.get("version"),
               "torch_cuda": t.get("cuda"), "torch_nccl": t.get("nccl"), "cuda_available": t.get("cuda_available")}
    problems = [] if p else ["no probe.json"]
    if device == "cuda":
        if not gpus:
            problems.append("nvidia-smi lists no GPU")
        if not t.get("cuda_available"):
            problems.append(f"torch sees no CUDA device ({t.get('error') or 'torch.cuda.is_available() is False'})")
    return verdict(problems, f"{p.get('cores')} cores; {', '.join(numbers['gpus']) or 'no GPU'}"
                             f"{', driver ' + numbers['driver'] if numbers['driver'] else ''}; torch {t.get('version')} "
                             f"(CUDA {t.get('cuda')}, NCCL {t.get('nccl')}, cuda available {t.get('cuda_available')})",
                   numbers)


def j_version(runs, device, args):
    run = runs[0]
    text = run.log
    numbers = {"nccl": (re.search(r"NCCL (\S+)", text) or [None, None])[1],
               "cuda_devices_visible": int((re.search(r"CUDA devices visible: (\d+)", text) or [0, 0])[1]),
               "libtorch": (re.search(r"LibTorch (\S+)", text) or [None, None])[1]}
    problems = [p for p in [run.exit_problem()] if p]
    if device == "cuda":
        if not re.search(r"NCCL 2\.", text):
            problems.append("--version names no NCCL 2.x (built without NCCL?)")
        if numbers["cuda_devices_visible"] < 1:
            problems.append("--version sees no CUDA device")
    return verdict(problems, f"LibTorch {numbers['libtorch']}, NCCL {numbers['nccl']}, "
                             f"{numbers['cuda_devices_visible']} CUDA devices", numbers)


def j_train(runs, device, args):
    """One run: the device, finite losses, the loss falls, the loss scale fits the mode."""
    run = runs[0]
    mode = args.get("mode", "fp32")
    problems, summary, numbers = training(run, mode, device)
    numbers["mode"] = mode
    return verdict(problems, summary, numbers)


def j_world_of_one(runs, device, args):
    """A world of one under mpirun through the named backend."""
    run = runs[0]
    backend = args["backend"]
    problems, summary, numbers = training(run, "fp32", device)
    numbers["backend"] = backend
    if not re.search(r"\bworld 1\b", run.log):
        problems.append("the log does not say 'world 1'")
    # The startup line names the backend the ranks agreed on: "world 1 (nccl)".
    m = re.search(r"\bworld 1 \((\w+)\)", run.log)
    numbers["backend_logged"] = m[1] if m else None
    if m and m[1] != backend:
        problems.append(f"the log says backend {m[1]!r}, want {backend!r}")
    configured = run.config.get("comm", {}).get("backend")
    if configured != backend:
        problems.append(f"config.json has comm.backend {configured!r}, want {backend!r}")
    if backend == "nccl":
        # Besides the startup line, NCCL_DEBUG=VERSION makes NCCL print
        # its version when a communicator is created, which only the NCCL backend does.
        m = re.search(r"NCCL version (\S+)", run.log)
        numbers["nccl_version_printed"] = m[1] if m else None
        if not m:
            problems.append("no 'NCCL version' line (NCCL_DEBUG=VERSION): no NCCL communicator was created")
    return verdict(problems, f"backend {backend}: {summary}", numbers)


def j_replay(runs, device, args):
    """Dropout under `full` recompute: same losses as `none` with the same seed."""
    none_a, none_b, full = runs
    problems = []
    for r in runs:
        p, _, _ = training(r, "fp32", device)
        problems += p
    noise, _, _ = rel_diffs(none_a.losses(), none_b.losses())
    diff, common, odd = rel_diffs(none_a.losses(), full.losses())
    tol = max(TOL["replay_rel"][device], TOL["replay_noise_factor"] * noise)
    numbers = {"steps_compared": len(common), "max_rel_diff_none_vs_full": diff,
               "max_rel_diff_none_vs_none": noise, "tolerance": tol,
               "dropout": full.config.get("model", {}).get("dropout")}
    if odd:
        problems.append(f"steps logged by one run only: {odd[:5]}")
    if not numbers["dropout"]:
        problems.append("the runs have no dropout: nothing to replay")
    if not diff <= tol:
        problems.append(f"none vs full differ by {diff:.3g} relative > tolerance {tol:.3g}")
    return verdict(problems, f"none vs full max rel diff {diff:.3g} (none vs none {noise:.3g}, "
                             f"tolerance {tol:.3g}) over {len(common)} steps", numbers)


def _shape(run):
    m, t, p = run.config.get("model", {}), run.config.get("train", {}), run.config.get("precision", {})
    s = {k: m.get(k) for k in ("d_model", "n_layer", "n_head", "vocab_size", "seq_len", "attention")}
    s.update(micro_batch=t.get("micro_batch"), precision=p.get("mode"))
    return s


def _mem(run):
    steps = list(run.steps().values())
    return (max((e.get("mem_activations_bytes", 0) for e in steps), default=0),
            max((e.get("peak_mem_bytes", 0) for e in steps), default=0))


def j_memory(runs, device, args):
    """none vs selective vs full: activations and peaks ordered, ratios against the claims."""
    policies = ("none", "selective", "full")
    problems, numbers = [], {}
    for pol, r in zip(policies, runs):
        bad = r.exit_problem()
        if bad:
            problems.append(bad)
        got = r.config.get("memory", {}).get("recompute")
        if got != pol:
            problems.append(f"{r.name}: recompute {got!r}, want {pol!r}")
        act, peak = _mem(r)
        numbers[f"activations_{pol}_bytes"], numbers[f"peak_{pol}_bytes"] = act, peak
        if not all(finite(x) for x in r.losses().values()) or not r.losses():
            problems.append(f"{r.name}: no finite losses")
    a = [numbers[f"activations_{p}_bytes"] for p in policies]
    pk = [numbers[f"peak_{p}_bytes"] for p in policies]
    if not (a[0] > a[1] > a[2] > 0):
        problems.append(f"activations not ordered none > selective > full: {[mib(x) for x in a]} MiB")
    if not (pk[0] > pk[1] > pk[2] > 0):
        problems.append(f"peaks not ordered none > selective > full: {[mib(x) for x in pk]} MiB")
    if a[0] > 0 and pk[0] > 0:
        numbers.update(activations_selective_over_none=round(a[1] / a[0], 3),
                       activations_full_over_none=round(a[2] / a[0], 3),
                       peak_selective_over_none=round(pk[1] / pk[0], 3),
                       peak_full_over_none=round(pk[2] / pk[0], 3))
    shape = _shape(runs[0])
    numbers["shape"] = shape
    at_claim = shape == CLAIM_SHAPE
    numbers["claims"] = CLAIMS if at_claim else "not at this shape (claims are for " + json.dumps(CLAIM_SHAPE) + ")"
    if at_claim and a[0] > 0:
        for key in ("activations_selective_over_none", "activations_full_over_none"):
            got, want = numbers[key], CLAIMS[key]
            ok = want / CLAIM_FACTOR <= got <= want * CLAIM_FACTOR
            numbers[key + "_claim_holds"] = ok
            if not ok:
                problems.append(f"{key} {got} outside {CLAIM_FACTOR}x of the claim {want}")
    detail = (f"activations none/selective/full {mib(a[0])}/{mib(a[1])}/{mib(a[2])} MiB "
              f"(x{numbers.get('activations_selective_over_none')}/x{numbers.get('activations_full_over_none')}), "
              f"peaks {mib(pk[0])}/{mib(pk[1])}/{mib(pk[2])} MiB")
    if at_claim:
        detail += (f"; claimed x{CLAIMS['activations_selective_over_none']}/x{CLAIMS['activations_full_over_none']}"
                   f" (within {CLAIM_FACTOR}x)")
    return verdict(problems, detail, numbers)


def j_int8(runs, device, args):
    """The 8-bit state: trains like fp32 state, with about a quarter of its optimizer bytes."""
    int8, fp32 = runs
    mode = args.get("mode", "bf16")
    problems, summary, numbers = training(int8, mode, device)
    got = int8.config.get("memory", {}).get("optimizer_state")
    if got != "int8":
        problems.append(f"{int8.name}: optimizer_state {got!r}")
    opt8 = max((e.get("mem_optimizer_bytes", 0) for e in int8.steps().values()), default=0)
    opt32 = max((e.get("mem_optimizer_bytes", 0) for e in fp32.steps().values()), default=0)
    ratio = opt8 / opt32 if opt32 else math.inf
    numbers.update(optimizer_bytes_int8=opt8, optimizer_bytes_fp32=opt32, ratio=round(ratio, 4),
                   ratio_max=TOL["int8_state_ratio_max"])
    if not 0 < ratio <= TOL["int8_state_ratio_max"]:
        problems.append(f"optimizer bytes int8/fp32 = {ratio:.3f}, want <= {TOL['int8_state_ratio_max']}")
    return verdict(problems, f"optimizer state {mib(opt8)} MiB vs fp32 {mib(opt32)} MiB (x{ratio:.3f}); {summary}",
                   numbers)


def oom_budget(ref):
    """A budget between the reference run's peak at its micro-batch and the peak half of it
    would need: fixed state (parameters, gradients, optimizer) plus 3/4 of the rest."""
    steps = list(ref.steps().values())
    peak = max((e.get("peak_mem_bytes", 0) for e in steps), default=0)
    last = steps[-1] if steps else {}
    fixed = sum(last.get(k, 0) for k in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"))
    return fixed + (peak - fixed) * 3 // 4, peak, fixed


def j_oom(runs, device, args):
    """A budget under the first micro-batch's peak: the step backs off and the run finishes."""
    ref, run = runs
    budget, peak, fixed = oom_budget(ref)
    problems = [p for p in [ref.exit_problem(), run.exit_problem()] if p]
    backoffs = run.of("oom_backoff")
    micro = ref.config.get("train", {}).get("micro_batch")
    steps = run.steps()
    numbers = {"budget_bytes": budget, "reference_peak_bytes": peak, "fixed_bytes": fixed,
               "micro_batch": micro, "backoffs": backoffs,
               "final_micro_batch": steps[max(steps)].get("micro_batch") if steps else None,
               "max_step_peak_bytes": max((e.get("peak_mem_bytes", 0) for e in steps.values()), default=0)}
    if not backoffs:
        problems.append("no oom_backoff event")
    elif backoffs[0].get("old_micro_batch") != micro or backoffs[0].get("step") != 1:
        problems.append(f"the first back-off is not step 1 from micro-batch {micro}: {backoffs[0]}")
    if len(steps) != len(ref.steps()):
        problems.append(f"{len(steps)} steps, the reference ran {len(ref.steps())}")
    if numbers["max_step_peak_bytes"] > budget:
        problems.append(f"a step peaked at {numbers['max_step_peak_bytes']} bytes > budget {budget}")
    diff, _, _ = rel_diffs(ref.losses(), run.losses())
    numbers["max_rel_diff_vs_reference"] = diff
    if not diff <= TOL["backoff_rel"]:
        problems.append(f"losses differ from the reference by {diff:.3g} > {TOL['backoff_rel']} (not the same samples?)")
    path = " -> ".join(str(b.get("new_micro_batch")) for b in backoffs)
    return verdict(problems, f"budget {mib(budget)} MiB (peak at micro-batch {micro}: {mib(peak)} MiB, fixed "
                             f"{mib(fixed)} MiB): micro-batch {micro} -> {path or '?'}, {len(steps)} steps, "
                             f"loss max rel diff {diff:.2g}", numbers)


def j_resume(runs, device, args):
    """A checkpoint written on one device resumed on the other: the loss continues."""
    ref, res = runs
    k = int(args["from_step"])
    src, dst = args["from_device"], args["to_device"]
    problems = [p for p in [ref.exit_problem(), res.exit_problem()] if p]
    for r, d in ((ref, src), (res, dst)):
        if f"device {d}" not in r.log:
            problems.append(f"{r.name}: the log does not say 'device {d}'")
    resumed = res.of("resume")
    if not resumed or resumed[0].get("step") != k:
        problems.append(f"no resume event at step {k}: {resumed[:1]}")
    inspect = _read_json(os.path.join(ref.path, "inspect.json")) or {}
    # `leantrain inspect --json`: every model tensor FP32, and AdamW's two moments FP32 too
    # (8 bytes a parameter beside the weights' 4).
    dtypes = sorted({str(t.get("dtype")) for t in inspect.get("model", [])})
    if dtypes != ["Float"]:
        problems.append(f"checkpoint model tensors not all FP32 (leantrain inspect): {dtypes}")
    if not inspect.get("optimizer_bytes", 0) >= 2 * inspect.get("model_bytes", 1):
        problems.append(f"checkpoint optimizer bytes {inspect.get('optimizer_bytes')} < 2 x model bytes "
                        f"{inspect.get('model_bytes')}: moments not FP32?")
    ref_l = {s: v for s, v in ref.losses().items() if s > k}
    res_l = res.losses()
    diff, common, odd = rel_diffs(ref_l, res_l)
    if not common or odd:
        problems.append(f"resumed steps {sorted(res_l)[:3]}..., reference after {k}: {sorted(ref_l)[:3]}...")
    if not diff <= TOL["resume_rel"]:
        problems.append(f"resumed losses differ from the uninterrupted run by {diff:.3g} > {TOL['resume_rel']}")
    first = ref.losses().get(1)
    numbers = {"from_step": k, "steps_compared": len(common), "max_rel_diff": diff, "tolerance": TOL["resume_rel"],
               "loss_step1": first, "loss_reference_first_resumed": ref_l.get(k + 1),
               "loss_resumed_first": res_l.get(k + 1), "checkpoint_dtypes": dtypes,
               "checkpoint": (ref.of("checkpoint") or [{}])[0].get("path")}
    return verdict(problems, f"{src} step {k} -> {dst}: {len(common)} steps, max rel diff {diff:.3g} "
                             f"(step {k + 1}: {res_l.get(k + 1)} vs {ref_l.get(k + 1)}; step 1 {first})", numbers)


def peak_flops(device, probe):
    if device == "cuda":
        name = (probe.get("gpus") or [{}])[0].get("name") or ""
        for key, flops, src in PEAK_BF16:
            if key in name:
                return flops, f"{name}: {src}"
        return None, f"no bf16 peak known for {name!r}"
    cores = probe.get("cores") or os.cpu_count() or 1
    return cores * 2.0e9 * 64, f"nominal CPU figure ({cores} cores x 2 GHz x 64 FLOP/cycle): plumbing only"


def j_mfu(runs, device, args):
    """MFU of GPT-2 small in bf16 from samples/s and the model's FLOPs per sample."""
    run = runs[0]
    probe = _read_json(os.path.join(args["out"], "probe.json")) or {}
    problems = [p for p in [run.exit_problem()] if p]
    steps = [e for _, e in sorted(run.steps().items())]
    m = re.search(r"(\d+) parameters;", run.log)
    n = int(m[1]) if m else (steps[-1].get("mem_params_bytes", 0) // 4 if steps else 0)
    model = run.config.get("model", {})
    t, layers, d = model.get("seq_len", 0), model.get("n_layer", 0), model.get("d_model", 0)
    # nanoGPT / PaLM: 6N per token forward and backward, plus attention's QK^T and AV, 12·L·d·T
    # per token (the causal mask's half not discounted).
    flops_sample = 6 * n * t + 12 * layers * d * t * t
    warm = steps[3:] if len(steps) > 4 else steps[1:]
    rates = sorted(e["samples_per_s"] for e in warm if finite(e.get("samples_per_s")))
    rate = rates[len(rates) // 2] if rates else 0.0
    peak, source = peak_flops(device, probe)
    mfu = flops_sample * rate / peak if peak else None
    if len(steps) < 5:
        problems.append(f"{len(steps)} steps, want >= 5")
    if not all(finite(e.get("loss")) for e in steps):
        problems.append("non-finite losses")
    if (run.config.get("precision", {}).get("mode")) != "bf16":
        problems.append("not a bf16 run")
    if peak is None:
        problems.append(source)
    elif not (mfu and 0 < mfu <= 1):
        problems.append(f"MFU {mfu} not in (0, 1]")
    numbers = {"parameters": n, "seq_len": t, "n_layer": layers, "d_model": d,
               "flops_per_sample": flops_sample, "samples_per_s_median": rate,
               "tokens_per_s": rate * t, "achieved_tflops": round(flops_sample * rate / 1e12, 3),
               "peak_tflops": peak / 1e12 if peak else None, "peak_source": source,
               "mfu": round(mfu, 4) if mfu else None, "micro_batch": run.config.get("train", {}).get("micro_batch"),
               "formula": "6*N*T + 12*L*d*T^2 FLOPs a sample; median samples/s of the steps after the 3rd"}
    return verdict(problems, f"MFU {100 * (mfu or 0):.1f}% ({numbers['achieved_tflops']} TFLOP/s of "
                             f"{numbers['peak_tflops']}; {rate:.1f} samples/s, N {n / 1e6:.1f}M, T {t})", numbers)


def j_gtest(runs, device, args):
    """The tests matching a pattern in a gtest binary's JSON report: all run and passed on a
    GPU; on the CPU skipped by the binary itself (no CUDA device) is a skip."""
    run = runs[0]
    pattern, min_count = args["pattern"], int(args.get("min_count", 1))
    report = _read_json(os.path.join(run.path, "gtest.json")) or {}
    tests = []
    for suite in report.get("testsuites", []):
        for t in suite.get("testsuite", []):
            full = f"{suite.get('name')}.{t.get('name')}"
            if fnmatch.fnmatchcase(full, pattern) and t.get("status", "RUN") == "RUN":
                tests.append((full, t.get("result", "COMPLETED"), t.get("failures", [])))
    failed = [n for n, _, f in tests if f]
    skipped = [n for n, r, f in tests if r == "SKIPPED" and not f]
    ran = [n for n, r, f in tests if r != "SKIPPED" and not f]
    numbers = {"pattern": pattern, "matched": len(tests), "passed": len(ran), "skipped": len(skipped),
               "failed": failed, "elapsed_s": run.elapsed_s, "exit": run.rc}
    problems = []
    if not report:
        problems.append(run.exit_problem() or "no gtest.json")
    if failed:
        problems.append(f"failed: {failed}")
        msg = [f[0].get("failure", "")[:200] for _, _, f in tests if f]
        numbers["first_failure"] = msg[0] if msg else None
    if run.rc not in (0, None) and not failed and report:
        problems.append(f"exit {run.rc} with no failed test in the report")
    detail = f"{len(ran)} passed, {len(skipped)} skipped, {len(failed)} failed of {len(tests)} matching {pattern}"
    if device == "cpu" and not problems and len(ran) == 0:
        return "skip", numbers, f"GPU-only: {detail} (the binary skips them without a CUDA device)"
    if device == "cuda":
        if skipped:
            problems.append(f"skipped on the GPU: {skipped}")
        if len(tests) < min_count:
            problems.append(f"{len(tests)} tests match, want >= {min_count}")
    return verdict(problems, detail, numbers)


def j_sharded(runs, device, args):
    """Ranks sharing the device through MPI, ZeRO stage >= 1: ShardedOptimizer's path."""
    run = runs[0]
    ranks = int(args.get("ranks", 2))
    problems, summary, numbers = training(run, "fp32", device)
    mem, comm = run.config.get("memory", {}), run.config.get("comm", {})
    numbers.update(ranks=ranks, shard=mem.get("shard"), backend=comm.get("backend"))
    if not re.search(rf"\bworld {ranks}\b", run.log):
        problems.append(f"the log does not say 'world {ranks}'")
    if comm.get("backend") != "mpi":
        problems.append(f"comm.backend {comm.get('backend')!r}, want 'mpi'")
    if mem.get("shard") not in ("optimizer", "gradients") or f"shard {mem.get('shard')}" not in run.log:
        problems.append(f"not a sharded run (memory.shard {mem.get('shard')!r})")
    steps = list(run.steps().values())
    rs = sum(e.get("grad_reduce_scatter_calls", 0) for e in steps)
    ag = sum(e.get("param_allgather_calls", 0) for e in steps)
    numbers.update(reduce_scatter_calls=rs, allgather_calls=ag)
    if not (rs > 0 and ag > 0):
        problems.append(f"reduce-scatter calls {rs}, all-gather calls {ag}: the sharded collectives did not run")
    return verdict(problems, f"{ranks} ranks, shard {mem.get('shard')}, MPI: {rs} reduce-scatters, {ag} "
                             f"all-gathers; {summary}", numbers)


JUDGES = {"probe": j_probe, "version": j_version, "train": j_train, "world_of_one": j_world_of_one, "replay": j_replay,
          "memory": j_memory, "int8": j_int8, "oom": j_oom, "resume": j_resume, "mfu": j_mfu,
          "gtest": j_gtest, "sharded": j_sharded}


# ---------------------------------------------------------------------------------- results
def add_record(out, device, rec):
    rec["required"] = device == "cuda" or rec["status"] != "skip"
    with open(os.path.join(out, "checks.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(_clean(rec), allow_nan=False) + "\n")
    write_results(out, device, complete=False)
    print(f"== {rec['name']}: {rec['status'].upper()} {rec['detail']}", flush=True)


def _clean(x):
    """NaN and infinity as null (JSON has neither)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def records(out):
    recs = []
    for line in _read_text(os.path.join(out, "checks.jsonl")).splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
    return recs


def write_results(out, device, complete, elapsed=None):
    recs = records(out)
    ok = all(r["status"] != "fail" for r in recs) and all(r["status"] == "pass" for r in recs if r["required"])
    started = _read_float(os.path.join(out, "started_at"))
    res = {"device": device, "probe": _read_json(os.path.join(out, "probe.json")) or {},
           "checks": recs, "complete": complete, "result": "pass" if ok and complete else "fail",
           "elapsed_s": elapsed if elapsed is not None else (round(time.time() - started, 1) if started else None)}
    tmp = os.path.join(out, "gpu_results.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_clean(res), f, indent=1, allow_nan=False)
    os.replace(tmp, os.path.join(out, "gpu_results.json"))
    return res


def finish(out, device, elapsed):
    res = write_results(out, device, complete=True, elapsed=elapsed)
    recs = res["checks"]
    fails = [r["name"] for r in recs if r["status"] == "fail" or (r["required"] and r["status"] != "pass")]
    probe = res["probe"]
    gpu = ", ".join(g.get("name", "?") for g in probe.get("gpus", [])) or "no GPU"
    lines = ["", f"==================== leantrain GPU checks, device {device} ({gpu}), {elapsed:.0f} s "
                 "====================", f"{'check':36} {'status':6} {'time':>6}  detail"]
    for r in recs:
        t = r.get("elapsed_s")
        lines.append(f"{r['name']:36} {r['status'].upper():6} {(f'{t:.0f}s' if isinstance(t, (int, float)) else ''):>6}"
                     f"  {r['detail'][:300]}")
    lines.append(f"numbers: {os.path.join(out, 'gpu_results.json')}; logs: {out}")
    lines.append(f"RESULT: {len(fails)} FAILED ({', '.join(fails)})" if fails else
                 f"RESULT: all {sum(r['status'] == 'pass' for r in recs)} passed"
                 f"{', ' + str(sum(r['status'] == 'skip' for r in recs)) + ' skipped' if any(r['status'] == 'skip' for r in recs) else ''}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    return 0 if not fails else 1


# ---------------------------------------------------------------------------------- probe
def _sh(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def probe(out):
    p = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": os.uname().nodename,
         "cores": os.cpu_count(), "python": sys.version.split()[0]}
    cpuinfo = _read_text("/proc/cpuinfo")
    m = re.search(r"model name\s*:\s*(.*)", cpuinfo)
    p["cpu"] = m[1].strip() if m else None
    m = re.search(r"MemTotal:\s*(\d+) kB", _read_text("/proc/meminfo"))
    p["mem_total_bytes"] = int(m[1]) * 1024 if m else None
    m = re.search(r'PRETTY_NAME="?([^"\n]*)', _read_text("/etc/os-release"))
    p["os"] = m[1] if m else None
    p["nvidia_smi_L"] = (_sh(["nvidia-smi", "-L"]) or "").splitlines() if shutil.which("nvidia-smi") else None
    gpus = []
    if shutil.which("nvidia-smi"):
        q = _sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode,clocks.max.sm,power.limit",
                 "--format=csv,noheader"]) or ""
        for line in q.splitlines():
            f = [x.strip() for x in line.split(",")]
            if len(f) >= 6:
                gpus.append(dict(zip(["name", "driver", "memory_total", "compute_mode", "max_sm_clock", "power_limit"], f)))
    p["gpus"] = gpus
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    p["nvcc"] = ((_sh([nvcc, "--version"]) or "").splitlines() or [None])[-1] if nvcc else None
    p["gxx"] = ((_sh(["g++", "--version"]) or "").splitlines() or [None])[0]
    try:
        import torch  # noqa: PLC0415 (only the probe needs it)
        t = {"version": torch.__version__, "cuda": torch.version.cuda,
             "cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count()}
        try:
            t["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001 (a probe reports, never stops)
            t["cudnn"] = None
        try:
            v = torch.cuda.nccl.version()
            t["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001
            t["nccl"] = None
        if t["cuda_available"]:
            t["devices"] = [{"name": torch.cuda.get_device_name(i),
                             "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))}
                            for i in range(torch.cuda.device_count())]
        t["threads"] = torch.get_num_threads()
        p["torch"] = t
    except Exception as e:  # noqa: BLE001
        p["torch"] = {"error": str(e)}
    with open(os.path.join(out, "probe.json"), "w", encoding="utf-8") as f:
        json.dump(p, f, indent=1)
    t = p["torch"]
    print(f"probe: {p['date']} host {p['host']}, {p['cores']} cores ({p['cpu']}), "
          f"{(p['mem_total_bytes'] or 0) / GiB:.0f} GiB, {p['os']}")
    for line in p["nvidia_smi_L"] or ["nvidia-smi: not found"]:
        print(f"probe: {line}")
    for g in gpus:
        print(f"probe: {g['name']}: driver {g['driver']}, {g['memory_total']}, compute mode {g['compute_mode']}, "
              f"max SM clock {g['max_sm_clock']}, power limit {g['power_limit']}")
    print(f"probe: torch {t.get('version')} (CUDA {t.get('cuda')}, cuDNN {t.get('cudnn')}, NCCL {t.get('nccl')}), "
          f"cuda available {t.get('cuda_available')}, {t.get('device_count')} devices{' ' + t['error'] if 'error' in t else ''}")
    print(f"probe: nvcc {p['nvcc']}; {p['gxx']}; python {p['python']}", flush=True)
    return 0


# ---------------------------------------------------------------------------------- self-test
def selftest():
    """Every judge against made-up runs, passing and failing: the criteria can fail."""
    tmp = tempfile.mkdtemp(prefix="lt_checks_")
    n = [0]

    def mk(name, rc=0, log="device cpu, 1 threads, world 1", steps=(), events=(), config=None, extra=None):
        n[0] += 1
        d = os.path.join(tmp, f"{n[0]}_{name}")
        os.makedirs(d)
        for fname, text in {"rc": str(rc), "log.txt": log, "elapsed_s": "1.0"}.items():
            with open(os.path.join(d, fname), "w") as f:
                f.write(text)
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for i, s in enumerate(steps):
                e = {"event": "step", "step": i + 1, "loss_scale": 1.0, "peak_mem_bytes": 1000,
                     "samples_per_s": 100.0, "mem_params_bytes": 400, "mem_grads_bytes": 400, "mem_optimizer_bytes": 0}
                e.update(s)
                f.write(json.dumps(e) + "\n")
            for e in events:
                f.write(json.dumps(e) + "\n")
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config or {}, f)
        for fname, obj in (extra or {}).items():
            with open(os.path.join(d, fname), "w") as f:
                json.dump(obj, f)
        return Run(d)

    falling = [{"loss": 5 - 0.2 * i} for i in range(20)]
    flat = [{"loss": 5.0} for _ in range(20)]
    results = []

    def expect(name, want, got):
        results.append((name, want, got[0], got[2]))

    expect("train falls", "pass", j_train([mk("a", steps=falling)], "cpu", {}))
    expect("train flat", "fail", j_train([mk("b", steps=flat)], "cpu", {}))
    expect("train timed out", "fail", j_train([mk("c", rc=124, steps=falling)], "cpu", {}))
    expect("train wrong device", "fail", j_train([mk("d", log="device cpu", steps=falling)], "cuda", {}))
    expect("fp16 scale 1", "fail", j_train([mk("e", steps=falling)], "cpu", {"mode": "fp16"}))
    expect("fp16 scaled", "pass", j_train([mk("f", steps=[dict(s, loss_scale=65536.0) for s in falling])],
                                          "cpu", {"mode": "fp16"}))
    nccl_cfg = {"comm": {"backend": "nccl"}}
    expect("nccl without its line", "fail",
           j_world_of_one([mk("g", log="device cuda:0, world 1", steps=falling, config=nccl_cfg)], "cuda",
                          {"backend": "nccl"}))
    expect("nccl with its line", "pass",
           j_world_of_one([mk("h", log="NCCL version 2.27.3+cuda13.0\ndevice cuda:0, world 1", steps=falling,
                              config=nccl_cfg)], "cuda", {"backend": "nccl"}))
    drop = {"model": {"dropout": 0.1}}
    a, b = mk("i", steps=falling, config=drop), mk("j", steps=falling, config=drop)
    off = mk("k", steps=[{"loss": s["loss"] * (1 + 1e-6)} for s in falling], config=drop)
    expect("replay bitwise", "pass", j_replay([a, b, mk("l", steps=falling, config=drop)], "cpu", {}))
    expect("replay 1e-6 on cpu", "fail", j_replay([a, b, off], "cpu", {}))
    expect("replay 1e-6 on cuda", "pass",
           j_replay([mk("i2", log="device cuda", steps=falling, config=drop),
                     mk("j2", log="device cuda", steps=falling, config=drop),
                     mk("k2", log="device cuda", steps=[{"loss": s["loss"] * (1 + 1e-6)} for s in falling],
                        config=drop)], "cuda", {}))

    def mem(pol, act, shape=None, peak_extra=GiB):
        cfg = {"memory": {"recompute": pol}, "model": {}, "train": {}, "precision": {}}
        if shape:
            cfg["model"] = {k: shape[k] for k in ("d_model", "n_layer", "n_head", "vocab_size", "seq_len", "attention")}
            cfg["train"] = {"micro_batch": shape["micro_batch"]}
            cfg["precision"] = {"mode": shape["precision"]}
        return mk(pol, steps=[{"loss": 10.0, "mem_activations_bytes": act, "peak_mem_bytes": act + peak_extra}] * 3,
                  config=cfg)

    expect("memory ordered", "pass", j_memory([mem("none", 300), mem("selective", 200), mem("full", 100)], "cpu", {}))
    expect("memory selective = none", "fail",
           j_memory([mem("none", 300), mem("selective", 300), mem("full", 100)], "cpu", {}))
    claim = CLAIMS
    expect("memory at the claims", "pass",
           j_memory([mem("none", claim["activations_none_bytes"], CLAIM_SHAPE),
                     mem("selective", claim["activations_selective_bytes"], CLAIM_SHAPE),
                     mem("full", claim["activations_full_bytes"], CLAIM_SHAPE)], "cuda", {}))
    expect("memory off the claims", "fail",
           j_memory([mem("none", 1000, CLAIM_SHAPE), mem("selective", 900, CLAIM_SHAPE),
                     mem("full", 100, CLAIM_SHAPE)], "cuda", {}))
    ref = mk("ref", steps=[{"loss": 10.0, "peak_mem_bytes": 2000, "micro_batch": 4}] * 3,
             config={"train": {"micro_batch": 4}})
    budget = oom_budget(ref)[0]
    backed = mk("oom", steps=[{"loss": 10.0, "peak_mem_bytes": 1500, "micro_batch": 2}] * 3,
                events=[{"event": "oom_backoff", "step": 1, "old_micro_batch": 4, "new_micro_batch": 2}])
    expect("oom backed off", "pass", j_oom([ref, backed], "cpu", {}))
    expect("oom budget ok", "pass" if 1500 < budget < 2000 else "fail", ("pass", {}, f"budget {budget}"))
    expect("oom no back-off", "fail", j_oom([ref, mk("oom2", steps=[{"loss": 10.0, "peak_mem_bytes": 1500}] * 3)],
                                            "cpu", {}))
    insp = {"inspect.json": {"model": [{"dtype": "Float"}], "model_bytes": 400, "optimizer_bytes": 800}}
    ck_ref = mk("ck", log="device cuda:0", steps=falling, extra=insp)
    expect("resume continues", "pass",
           j_resume([ck_ref, mk("r", steps=[{"loss": None}] * 0, events=[{"event": "resume", "step": 10}] +
                                [dict(falling[i], event="step", step=i + 1) for i in range(10, 20)])],
                    "cuda", {"from_step": 10, "from_device": "cuda", "to_device": "cpu"}))
    expect("resume restarted", "fail",
           j_resume([ck_ref, mk("r2", events=[{"event": "resume", "step": 10}] +
                                [dict(falling[i - 10], event="step", step=i + 1) for i in range(10, 20)])],
                    "cuda", {"from_step": 10, "from_device": "cuda", "to_device": "cpu"}))
    gt = {"testsuites": [{"name": "FeedForward", "testsuite": [
        {"name": "MatchesThePlainExpressionBitwiseOnCuda", "status": "RUN", "result": "SKIPPED", "failures": []}]}]}
    expect("gtest skipped on cpu", "skip",
           j_gtest([mk("gt", extra={"gtest.json": gt})], "cpu", {"pattern": "FeedForward.*Cuda"}))
    expect("gtest skipped on cuda", "fail",
           j_gtest([mk("gt2", extra={"gtest.json": gt})], "cuda", {"pattern": "FeedForward.*Cuda"}))
    gt["testsuites"][0]["testsuite"][0].update(result="COMPLETED", failures=[{"failure": "x != y"}])
    expect("gtest failed", "fail", j_gtest([mk("gt3", rc=1, extra={"gtest.json": gt})], "cpu",
                                           {"pattern": "FeedForward.*Cuda"}))
    mfu_cfg = {"model": {"seq_len": 1024, "n_layer": 12, "d_model": 768}, "precision": {"mode": "bf16"}}
    with open(os.path.join(tmp, "probe.json"), "w") as f:
        json.dump({"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}, f)
    st, nums, _ = j_mfu([mk("mfu", log="124439808 parameters; device cuda", steps=[{"loss": 10.0,
                                                                                     "samples_per_s": 400.0}] * 8,
                            config=mfu_cfg)], "cuda", {"out": tmp})
    expect("probe: a card torch cannot see", "fail", j_probe([], "cuda", {"out": tmp}))
    with open(os.path.join(tmp, "probe.json"), "w") as f:
        json.dump({"gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "580"}],
                   "torch": {"cuda_available": True}}, f)
    expect("probe: a card torch sees", "pass", j_probe([], "cuda", {"out": tmp}))
    want = (6 * 124439808 * 1024 + 12 * 12 * 768 * 1024 ** 2) * 400 / 989e12
    expect("mfu arithmetic", "pass" if st == "pass" and abs(nums["mfu"] - want) < 1e-4 else "fail",
           (st, nums, f"mfu {nums['mfu']} want {want:.4f}"))
    # The results file: a non-finite number is written as null, a required skip fails the run.
    res_dir = os.path.join(tmp, "out")
    os.makedirs(res_dir)
    with contextlib.redirect_stdout(io.StringIO()):
        add_record(res_dir, "cuda", {"name": "x", "status": "pass", "numbers": {"d": math.inf}, "detail": "",
                                     "elapsed_s": None})
        add_record(res_dir, "cuda", {"name": "y", "status": "skip", "numbers": {}, "detail": "", "elapsed_s": None})
        with open(os.path.join(res_dir, "gpu_results.json")) as f:
            written = json.load(f)
        ok = written["checks"][0]["numbers"]["d"] is None and finish(res_dir, "cuda", 1.0) == 1
    expect("results file: null for inf, a skip on cuda fails", "pass",
           ("pass" if ok else "fail", {}, str(written)))
    shutil.rmtree(tmp)
    bad = [r for r in results if r[1] != r[2]]
    for name, want, got, detail in results:
        print(f"selftest {'ok  ' if want == got else 'BAD '} {name}: want {want}, got {got}"
              + ("" if want == got else f" ({detail})"))
    print(f"selftest: {len(results) - len(bad)}/{len(results)} as expected")
    return 1 if bad else 0


# ---------------------------------------------------------------------------------- main
def main(argv):
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]

    def opt(name, default=None, many=False):
        vals = []
        while name in rest:
            i = rest.index(name)
            vals.append(rest[i + 1])
            del rest[i:i + 2]
        return vals if many else (vals[-1] if vals else default)

    if cmd == "selftest":
        return selftest()
    if cmd == "probe":
        return probe(rest[0])
    if cmd == "budget":
        print(oom_budget(Run(rest[0]))[0])
        return 0
    device = opt("--device", "cuda")
    elapsed = opt("--elapsed")
    elapsed = float(elapsed) if elapsed else None
    if cmd == "finish":
        return finish(rest[0], device, elapsed or 0.0)
    if cmd == "record":
        numbers = json.loads(opt("--numbers", "{}"))
        out, name, status, detail = rest
        add_record(out, device, {"name": name, "status": status, "numbers": numbers, "detail": detail,
                                 "elapsed_s": elapsed})
        return 0
    if cmd == "judge":
        args = dict(a.split("=", 1) for a in opt("--arg", many=True))
        out, check, kind = rest[0], rest[1], rest[2]
        args["out"] = out
        try:
            status, numbers, detail = JUDGES[kind]([Run(d) for d in rest[3:]], device, args)
        except Exception as e:  # noqa: BLE001 (a judge's bug is that check's failure, not the script's end)
            status, numbers, detail = "fail", {}, f"judge {kind} raised {type(e).__name__}: {e}"
        add_record(out, device, {"name": check, "status": status, "numbers": numbers, "detail": detail,
                                 "elapsed_s": elapsed})
        return 0 if status != "fail" else 1
    print(f"checks.py: unknown command {cmd!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
