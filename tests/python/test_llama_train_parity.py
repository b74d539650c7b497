#!/usr/bin/env python3
"""Training parity of the llama kind with transformers: 20 optimizer steps of `leantrain train
--init-from DIR` against the same model in transformers + torch.optim.AdamW, from the same
weights on the same batches, fp32, dropout 0; the losses must agree within REL_TOL (relative)
at every step.

The five tiny random-weight models of test_llama_interop.py (Llama with llama3 RoPE scaling
tied and untied, Qwen2 with q/k/v biases, Qwen3 with q/k norms, Mistral with GQA), saved by
save_pretrained. leantrain trains on data.kind = "synthetic" with a global batch of 8 as 2
micro-batches of 4 (gradient accumulation), AdamW with weight decay on the tensors of >= 2
dimensions, warmup + cosine learning rate and gradient clipping; the Python side rebuilds the
same samples in the same order (tools/leantrain_py/sample_stream.py), the schedule
(trainers/src/schedule.cpp, as bench/peers/ddp_recipe.py) and the same parameter groups, with
hyper-parameters read from the run's resolved config.json, and computes the loss as
leantrain reports it: the mean next-token cross-entropy over the global batch, before the
update.

    .venv/bin/python tests/python/test_llama_train_parity.py build/bin/leantrain
Exit codes: 0 pass, 1 fail, 77 skipped (binary or transformers missing)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))

SKIP = 77
REL_TOL = 1e-5
STEPS = 20

try:
    import torch
    import torch.nn.functional as F
    from test_llama_interop import models, perturb  # also skips (77) without transformers
    from leantrain_py import sample_stream as lt_data
except ImportError as e:  # pragma: no cover
    print(f"test_llama_train_parity: skipped ({e})")
    sys.exit(SKIP)

torch.set_num_threads(1)

CONFIG = f"""[model]
kind = "llama"
seq_len = 32
dropout = 0.0
[data]
kind = "synthetic"
synthetic_samples = 512
seed = 7
[train]
global_batch = 8
micro_batch = 4
steps = {STEPS}
lr = 3e-3
min_lr = 3e-4
schedule = "cosine"
warmup_steps = 3
weight_decay = 0.1
grad_clip = 1.0
threads = 1
device = "cpu"
eval_batch = 8
eval_max_batches = 1
[precision]
mode = "fp32"
"""


def lr_at(t: dict, step: int, total: int) -> float:
    """trainers/src/schedule.cpp lr_at (as bench/peers/ddp_recipe.py)."""
    lr, min_lr, w = t["lr"], t["min_lr"], t["warmup_steps"]
    if w > 0 and step < w:
        return lr * (step + 1) / w
    if t["schedule"] == "constant":
        return lr
    progress = min(max((step - w) / max(1, total - w), 0.0), 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def leantrain_losses(leantrain: str, d: str, out: str) -> tuple[list[float], dict]:
    conf = out + ".toml"
    with open(conf, "w") as f:
        f.write(CONFIG)
    r = subprocess.run([leantrain, "train", "--config", conf, "--out", out, "--init-from", d],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"leantrain train exited {r.returncode}:\n{r.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f if '"event":"step"' in line]
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    return [s["loss"] for s in sorted(steps, key=lambda s: s["step"])], cfg


def transformers_losses(cls, d: str, cfg: dict) -> list[float]:
    t, m, data_cfg = cfg["train"], cfg["model"], cfg["data"]
    model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa").train()
    params = list(model.parameters())  # a tied head is the embedding: one parameter
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": t["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"], foreach=False)
    data = lt_data.SyntheticTrain({"kind": "gpt", "seq_len": m["seq_len"], "vocab_size": m["vocab_size"]}, data_cfg)
    seed, micro = data_cfg["seed"], t["micro_batch"]
    accum = t["global_batch"] // micro
    steps_per_epoch = data.size // t["global_batch"]
    losses, perm, perm_epoch = [], None, -1
    for step in range(t["steps"]):
        epoch, k = divmod(step, steps_per_epoch)
        if epoch != perm_epoch:
            perm, perm_epoch = lt_data.epoch_permutation(data.size, seed, epoch), epoch
        for g in opt.param_groups:
            g["lr"] = lr_at(t, step, t["steps"])
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(accum):
            x, y = data.get(lt_data.micro_batch_indices(perm, k, micro, accum, 1, 0, j), epoch)
            logits = model(torch.from_numpy(x)).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), torch.from_numpy(y).reshape(-1))
            (loss / accum).backward()
            total += loss.item()
        if t["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        opt.step()
        losses.append(total / accum)
    return losses


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not os.path.exists(argv[1]):
        print("test_llama_train_parity: skipped (give the leantrain binary)")
        return SKIP
    failures, lines = [], []
    with tempfile.TemporaryDirectory(prefix="lt_llama_parity_") as tmp:
        for i, (name, cfg, cls, _) in enumerate(models()):
            try:
                torch.manual_seed(100 + i)
                hf = cls(cfg)
                perturb(hf, 100 + i)
                d = os.path.join(tmp, name)
                hf.save_pretrained(d)
                del hf
                ours, run_cfg = leantrain_losses(argv[1], d, os.path.join(tmp, "run_" + name))
                ref = transformers_losses(cls, d, run_cfg)
            except Exception as e:  # noqa: BLE001 - a crash is a failure of that model
                import traceback
                traceback.print_exc()
                failures.append(f"{name}: raised {type(e).__name__}: {e}")
                continue
            rel = [abs(a - b) / abs(b) for a, b in zip(ours, ref)]
            worst = max(rel) if rel else float("inf")
            ok = len(ours) == STEPS and len(ref) == STEPS and worst <= REL_TOL
            line = (f"{name}: {STEPS} steps, loss {ref[0]:.5f} -> {ref[-1]:.5f}, max rel diff per step {worst:.2e}"
                    f" (step {rel.index(worst) + 1 if rel else '-'})")
            lines.append(line)
            print(("ok   " if ok else "FAIL ") + line, flush=True)
            if not ok:
                failures.append(line)
                for s, (a, b) in enumerate(zip(ours, ref)):
                    print(f"  step {s + 1}: leantrain {a:.8f} transformers {b:.8f}")
            if not ref[-1] < ref[0]:
                failures.append(f"{name}: the loss did not fall ({ref[0]} -> {ref[-1]})")
    print("\n".join(lines))
    if failures:
        print(f"test_llama_train_parity: {len(failures)} failure(s)")
        return 1
    print("test_llama_train_parity: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
