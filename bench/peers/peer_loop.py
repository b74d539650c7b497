"""The training loop every peer recipe of bench/peers shares (ddp_recipe.py for GPT / BERT /
ResNet, llama_recipe.py for the Llama peers): what a recipe does around its model.

A recipe reads leantrain's resolved config.json with `setup()` (threads, process group, device),
builds and loads its model, and hands it to `train()` with its loss function. `train()` does the
rest as a careful PyTorch user writes it: DistributedDataParallel (gloo on the CPU, NCCL on
GPUs; gradient_as_bucket_view) with no_sync() on all micro-batches but the last, torch.autocast
(bf16; fp16 with torch.amp.GradScaler), AdamW or SGD with fused=True and leantrain's parameter
groups (weight decay on tensors with >= 2 dims), leantrain's warmup + cosine schedule
(trainers/src/schedule.cpp), gradient clipping, global batch = world x micro x accumulation, on
leantrain's synthetic samples in leantrain's order on the same rank and micro-batch
(tools/leantrain_py/sample_stream.py).

Threads: train.threads, else cores / ranks on this host, as leantrain
(runtime/src/runtime_context.cpp).

Rank 0 writes OUT/metrics.jsonl: one {"event":"step", "step", "loss", "lr", "step_time_s",
"samples_per_s", "peak_rss_bytes", "peak_mem_bytes"} per optimizer step, the same fields
leantrain's step events carry. A step's time runs from after its samples are built (the
synthetic generator here is Python; a real input pipeline would hide it in DataLoader
workers, so the peer is not charged for it) to after the optimizer step.
With LEANTRAIN_BENCH_TURNS set, the steps take turns with leantrain's (Note [Taking turns],
StepTurns below).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import resource
import sys
import time
from typing import Any, Callable, Dict, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from leantrain_py import sample_stream as lt_data  # noqa: E402


def usage_error(msg: str) -> None:
    """A bad argument or config: the message on stderr, exit 2."""
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr)
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


@dataclasses.dataclass
class Run:
    """What setup() read and started: the config's sections, this process's place, its device."""
    cfg: Dict[str, Any]
    model_cfg: Dict[str, Any]
    data_cfg: Dict[str, Any]
    train_cfg: Dict[str, Any]
    mode: str  # precision.mode: fp32 | bf16 | fp16
    policy: str  # memory.recompute: none | full
    world: int
    rank: int
    threads: int
    device: torch.device
    out: str

    @property
    def use_cuda(self) -> bool:
        return self.device.type == "cuda"


def setup(config_path: str, out: str) -> Run:
    """Reads leantrain's resolved config.json, checks what the recipes reproduce, sets the
    threads, starts the process group (torchrun's environment) and picks the device."""
    try:
        with open(config_path) as fh:
            cfg = json.load(fh)
        model_cfg, data_cfg, t = cfg["model"], cfg["data"], cfg["train"]
        mode = cfg["precision"]["mode"]
        policy = cfg["memory"]["recompute"]
    except (OSError, ValueError, KeyError) as e:
        usage_error(f"--config {config_path}: {e!r}")
    if data_cfg.get("kind") != "synthetic":
        usage_error(f"--config {config_path}: data.kind = {data_cfg.get('kind')!r}; "
                    "the peer reproduces 'synthetic' only")
    if policy not in ("none", "full"):
        usage_error(f"--config {config_path}: memory.recompute = {policy!r}; the recipe does none or full")
    if mode not in ("fp32", "bf16", "fp16"):
        usage_error(f"--config {config_path}: precision.mode = {mode!r}")

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
    if t["global_batch"] % (world * t["micro_batch"]) != 0:
        usage_error(f"train.global_batch = {t['global_batch']} is not a multiple of world {world} x "
                    f"micro_batch {t['micro_batch']}")
    return Run(cfg=cfg, model_cfg=model_cfg, data_cfg=data_cfg, train_cfg=t, mode=mode, policy=policy, world=world,
               rank=rank, threads=threads, device=device, out=out)


LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def train(run: Run, model: torch.nn.Module, loss_fn: LossFn, what: str,
          data_model_cfg: Optional[Dict[str, Any]] = None) -> int:
    """Trains `model` (its initial weights loaded, on run.device, recompute applied) for the
    config's steps; loss_fn(model, x, y) -> the micro-batch's mean loss, called under autocast
    with the DDP-wrapped model at 2+ ranks. data_model_cfg: the model section the synthetic
    stream is built from (default: the config's). `what` names the recipe on the start line."""
    t, world, rank, device = run.train_cfg, run.world, run.rank, run.device
    micro = t["micro_batch"]
    accum = t["global_batch"] // (world * micro)
    if world > 1:
        # gradient_as_bucket_view: gradients live in DDP's buckets (no second copy), the
        # memory-saving option DDP documents.
        model = DDP(model, device_ids=[device.index] if run.use_cuda else None, gradient_as_bucket_view=True)
    inner = model.module if isinstance(model, DDP) else model
    optimizer = make_optimizer(t, inner)
    p = run.cfg["precision"]
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.mode)
    scaler = torch.amp.GradScaler(device.type, init_scale=p.get("init_scale", 65536.0),
                                  growth_factor=p.get("growth_factor", 2.0),
                                  backoff_factor=p.get("backoff_factor", 0.5),
                                  growth_interval=p.get("growth_interval", 2000), enabled=run.mode == "fp16")
    data = lt_data.SyntheticTrain(data_model_cfg or run.model_cfg, run.data_cfg)
    seed = run.data_cfg.get("seed", 1234)
    steps_per_epoch = data.size // t["global_batch"]
    if steps_per_epoch == 0:
        usage_error(f"train.global_batch = {t['global_batch']}: larger than the training set ({data.size})")
    total = t["steps"] if t["steps"] > 0 else t["epochs"] * steps_per_epoch
    torch.manual_seed(seed)  # dropout

    metrics = None
    if rank == 0:
        os.makedirs(run.out, exist_ok=True)
        metrics = open(os.path.join(run.out, "metrics.jsonl"), "w")
        print(f"peer: {what}, world {world}, {run.threads} threads/rank, {run.mode}, recompute {run.policy}, "
              f"global batch {t['global_batch']} = {world} x {micro} x {accum}, {total} steps", file=sys.stderr)
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
        if run.use_cuda:
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
                    loss = loss_fn(model, x, y)
                scaler.scale(loss / accum).backward()  # DDP averages over ranks
            loss_sum += loss.detach()
        if run.mode == "fp16":
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
                  "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if run.use_cuda else None}
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
