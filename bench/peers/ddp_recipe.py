#!/usr/bin/env python3
"""The PyTorch recipe leantrain is compared with: DistributedDataParallel + torch.autocast +
torch.utils.checkpoint + no_sync() gradient accumulation, written as a careful user would.

    torchrun --nproc_per_node N bench/peers/ddp_recipe.py --config RUN/config.json \\
        --init CKPT.h5 --out DIR

--config is leantrain's fully resolved config.json (what `leantrain train` writes into its
run directory), so every hyper-parameter is the one leantrain ran with: model (the same
definitions, tools/leantrain_py/reference_models.py), synthetic data (the same samples in
the same order on the same rank, tools/leantrain_py/sample_stream.py), AdamW or SGD with leantrain's
parameter groups (weight decay on tensors with >= 2 dims), warmup + cosine schedule
(trainers/src/schedule.cpp), gradient clipping, precision (fp32; bf16 autocast; fp16 autocast
with torch.amp.GradScaler), activation recompute ("full": every block through
torch.utils.checkpoint with use_reentrant=False), global batch = world x micro x accumulation.
--init is a leantrain checkpoint holding the initial weights (compare.py writes one with
leantrain at step 0); its parameters are loaded, buffers keep their fresh values.

Threads: train.threads, else cores / ranks on this host, as leantrain
(runtime/src/runtime_context.cpp). Process group: gloo on the CPU, NCCL on GPUs.

Rank 0 writes DIR/metrics.jsonl: one {"event":"step", "step", "loss", "lr", "step_time_s",
"samples_per_s", "peak_rss_bytes", "peak_mem_bytes"} per optimizer step, the same fields
leantrain's step events carry. A step's time runs from after its samples are built (the
synthetic generator here is Python; a real input pipeline would hide it in DataLoader
workers, so the peer is not charged for it) to after the optimizer step.
Exit codes: 0 done, 2 bad arguments or config.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from leantrain_py import sample_stream as lt_data  # noqa: E402
from leantrain_py.checkpoint import load_checkpoint  # noqa: E402
from leantrain_py.reference_models import build_model  # noqa: E402


def usage_error(msg: str) -> None:
    print(f"ddp_recipe.py: {msg}", file=sys.stderr)
    sys.exit(2)


def lr_at(t: dict, step: int, total: int) -> float:
    """trainers/src/schedule.cpp lr_at (lr_scaling included)."""
    scale = 1.0
    if t.get("lr_scaling") == "linear" and t.get("lr_reference_batch", 0) > 0:
        scale = t["global_batch"] / t["lr_reference_batch"]
    lr, min_lr = t["lr"] * scale, t["min_lr"] * scale
    w = t["warmup_steps"]
    if w > 0 and step < w:
        return lr * (step + 1) / w
    if t["schedule"] == "constant":
        return lr
    decay = max(1, total - w)
    progress = min(max((step - w) / decay, 0.0), 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(t: dict, model: torch.nn.Module) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    if t["optimizer"] == "adamw":
        return torch.optim.AdamW(groups, lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"], fused=True)
    return torch.optim.SGD(groups, lr=t["lr"], momentum=t["momentum"], fused=True)


def checkpoint_blocks(model: torch.nn.Module) -> int:
    """Every repeated block runs through torch.utils.checkpoint (non-reentrant): its
    activations are recomputed in backward. Overriding forward on the instance keeps the
    module tree, and so the state_dict names, unchanged."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return 0
    for block in blocks:
        inner = block.forward

        def wrapped(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = wrapped
    return len(blocks)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class StepTurns:
    """Note [Taking turns] (trainers/include/leantrain/trainers/turns.h), the same protocol as
    leantrain's: LEANTRAIN_BENCH_TURNS=GO:DONE names two FIFOs the harness holds open; one byte
    read from GO before each step, one written to DONE after it, one more read from GO before
    the teardown. A vanished harness (end of file, broken pipe) ends the turns, not the run."""

    def __init__(self, spec: str):
        self.go = self.done = None
        if not spec:
            return
        go, sep, done = spec.partition(":")
        if not sep or not go or not done:
            usage_error(f"LEANTRAIN_BENCH_TURNS = '{spec}': expected GO_FIFO:DONE_FIFO (two paths)")
        self.go = os.open(go, os.O_RDONLY)
        self.done = os.open(done, os.O_WRONLY | os.O_NONBLOCK)
        self.held = False

    def _gone(self) -> None:
        print("peer: LEANTRAIN_BENCH_TURNS: the harness went away; going on without turns", file=sys.stderr)
        self.go = self.done = None

    def wait(self) -> None:
        if self.go is not None and self.held:
            try:
                os.write(self.done, b"d")
            except OSError:
                return self._gone()
        if self.go is not None:
            if os.read(self.go, 1) != b"g":
                return self._gone()
            self.held = True


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="leantrain's resolved config.json")
    ap.add_argument("--init", required=True, help="leantrain checkpoint with the initial weights")
    ap.add_argument("--out", required=True, help="directory for metrics.jsonl (rank 0)")
    args = ap.parse_args(argv)
    try:
        with open(args.config) as fh:
            cfg = json.load(fh)
        model_cfg, data_cfg, t = cfg["model"], cfg["data"], cfg["train"]
        mode = cfg["precision"]["mode"]
        policy = cfg["memory"]["recompute"]
    except (OSError, ValueError, KeyError) as e:
        usage_error(f"--config {args.config}: {e!r}")
    if data_cfg.get("kind") != "synthetic":
        usage_error(f"--config {args.config}: data.kind = {data_cfg.get('kind')!r}; the peer reproduces 'synthetic' only")
    if policy not in ("none", "full"):
        usage_error(f"--config {args.config}: memory.recompute = {policy!r}; the recipe does none or full")
    if mode not in ("fp32", "bf16", "fp16"):
        usage_error(f"--config {args.config}: precision.mode = {mode!r}")

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available() and t.get("device", "auto") != "cpu"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if use_cuda else torch.device("cpu")
    threads = t["threads"] if t.get("threads", 0) > 0 else max(1, (os.cpu_count() or 1) // max(1, local_world))
    torch.set_num_threads(threads)
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(device)

    micro = t["micro_batch"]
    if t["global_batch"] % (world * micro) != 0:
        usage_error(f"train.global_batch = {t['global_batch']} is not a multiple of world {world} x micro_batch {micro}")
    accum = t["global_batch"] // (world * micro)

    model = build_model(model_cfg)
    info = load_checkpoint(args.init)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(info["state_dict"]))
    if missing:
        usage_error(f"--init {args.init}: no tensor for parameter(s) {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, p in params.items():
            src = info["state_dict"][name]
            if tuple(src.shape) != tuple(p.shape):
                usage_error(f"--init {args.init}: {name} has shape {list(src.shape)}, the model {list(p.shape)}")
            p.copy_(src)
    del info
    model.to(device).train()
    n_ckpt = checkpoint_blocks(model) if policy == "full" else 0
    if world > 1:
        # gradient_as_bucket_view: gradients live in DDP's buckets (no second copy), the
        # memory-saving option DDP documents.
        model = DDP(model, device_ids=[device.index] if use_cuda else None, gradient_as_bucket_view=True)
    inner = model.module if isinstance(model, DDP) else model
    optimizer = make_optimizer(t, inner)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    scaler = torch.amp.GradScaler(device.type, init_scale=cfg["precision"].get("init_scale", 65536.0),
                                  growth_factor=cfg["precision"].get("growth_factor", 2.0),
                                  backoff_factor=cfg["precision"].get("backoff_factor", 0.5),
                                  growth_interval=cfg["precision"].get("growth_interval", 2000),
                                  enabled=mode == "fp16")
    data = lt_data.SyntheticTrain(model_cfg, data_cfg)
    seed = data_cfg.get("seed", 1234)
    steps_per_epoch = data.size // t["global_batch"]
    if steps_per_epoch == 0:
        usage_error(f"train.global_batch = {t['global_batch']}: larger than the training set ({data.size})")
    total = t["steps"] if t["steps"] > 0 else t["epochs"] * steps_per_epoch
    torch.manual_seed(seed)  # dropout

    metrics = None
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        metrics = open(os.path.join(args.out, "metrics.jsonl"), "w")
        print(f"peer: {model_cfg['kind']}, world {world}, {threads} threads/rank, {mode}, checkpoint {policy}"
              f" ({n_ckpt} blocks), global batch {t['global_batch']} = {world} x {micro} x {accum}, {total} steps",
              file=sys.stderr)
    perm, perm_epoch = None, -1
    turns = StepTurns(os.environ.get("LEANTRAIN_BENCH_TURNS", ""))
    if turns.go is not None and world > 1:
        usage_error("LEANTRAIN_BENCH_TURNS is for one-process runs")
    for step in range(total):
        turns.wait()  # hands the previous step's turn back, then waits for this one
        epoch, k = divmod(step, steps_per_epoch)
        if epoch != perm_epoch:
            perm, perm_epoch = lt_data.epoch_permutation(data.size, seed, epoch), epoch
        batches = []
        for j in range(accum):
            x, y = data.get(lt_data.micro_batch_indices(perm, k, micro, accum, world, rank, j), epoch)
            batches.append((torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)))
        if use_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        lr = lr_at(t, step, total)
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for j, (x, y) in enumerate(batches):
            sync = world == 1 or j == accum - 1
            with (contextlib.nullcontext() if sync else model.no_sync()):
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    logits = model(x).float()
                    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)
                scaler.scale(loss / accum).backward()  # DDP averages over ranks
            loss_sum += loss.detach()
        if mode == "fp16":
            scaler.unscale_(optimizer)
        if t["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(inner.parameters(), t["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        loss_mean = loss_sum / accum
        if world > 1:
            dist.all_reduce(loss_mean)
            loss_mean /= world
        loss_val = loss_mean.item()
        dt = time.perf_counter() - t0
        if metrics:
            ev = {"event": "step", "step": step + 1, "epoch": epoch, "loss": loss_val if math.isfinite(loss_val) else None,
                  "lr": lr, "loss_scale": scaler.get_scale() if scaler.is_enabled() else 1.0,
                  "samples_per_s": t["global_batch"] / dt, "step_time_s": dt,
                  "peak_rss_bytes": peak_rss_bytes(),
                  "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if use_cuda else None}
            metrics.write(json.dumps(ev) + "\n")
            metrics.flush()
    turns.wait()  # the exit turn
    if metrics:
        metrics.close()
    if world > 1:
        # Both ranks leave together: a rank tearing gloo down while its peer is still in the
        # last collective's cleanup aborted once in ~10 runs ("terminate called without an
        # active exception", after every step was written).
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
