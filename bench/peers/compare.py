#!/usr/bin/env python3
"""leantrain side by side with the PyTorch DDP recipe (bench/peers/ddp_recipe.py), and on the
Llama rows with the Llama peers (bench/peers/llama_recipe.py: Hugging Face, torchtitan-style
eager and compiled; Note [Llama peers]).

    bench/peers/run.sh [--scale cpu|full|smoke] [--rows REGEX] ...     (builds, then this)
    .venv/bin/python bench/peers/compare.py --bin build/bin [--scale cpu] ...
    bench/peers/run.sh --scale real --models llama [--ranks 1]          (the Llama rows)

For every row (model x ranks x precision x activation recompute) both sides train the
same model from the same initial weights on the same samples with the same optimizer,
schedule, batch layout and threads per rank. At 1 rank the two sides run side by side and take
turns, one optimizer step each (Note [Taking turns], trainers/include/leantrain/trainers/turns.h),
so a slow window of the machine falls on both sides' steps alike; at 2 ranks whole runs
alternate leantrain, peer, peer, leantrain (--repeats 2 pairs) so drifting load falls on both. Then the collective row
(leantrain_bench_comm: GradientSync busbw vs a raw MPI_Allreduce) and the checkpoint row
(leantrain_bench_checkpoint: commit_checkpoint vs fwrite + fsync) from those benches.

How both sides get the same start (Note [Same start]): for each model a one-step leantrain run
with a NaN injected into its loss (LEANTRAIN_FAULT=nan@1, train.nonfinite = "skip": the update
is skipped) writes a checkpoint holding exactly the initial weights leantrain builds from
data.seed; the peer loads its parameters; leantrain's measured runs build the same weights from
the same seed (same model section, checked). Each row starts with a leantrain run, whose resolved
config.json (every key, defaults included) is the peer's config; later leantrain runs of the
row must resolve to the same.

Outputs: a markdown table on stdout and in --doc (docs/BENCH_PEERS.md for --scale cpu/full),
one JSON object per (row, metric) in OUT/results.jsonl ({"bench": "peers", "row", "metric",
"value": leantrain, "baseline": peer}), and the plots of `leantrain report --bench` when the
binary has that option (into OUT/plots/). Exit codes: 0 done (targets are reported, not enforced), 1 a run
failed or the two sides' configs disagree, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY = sys.executable
SHM = "/dev/shm"

# ---- scales ------------------------------------------------------------------------------------
# Each model: the repo config it starts from, the model overrides, and the batch layout. The
# global batch is the same at 1 and 2 ranks (accumulation halves at 2), and at 2 ranks there
# are still >= 2 micro-batches per rank, so no_sync() / local accumulation is exercised.
# Note [CPU scale]: d_model 768 and the layer counts (and vocabularies) of the issue stay; only
# sequence length / image size, micro-batch and steps shrink so that 32 rows x 4 runs fit in
# 20 minutes on 2 cores (GPT-12L at seq 512, micro-batch 8 takes ~50 s per fwd+bwd there).
GPT = "gpt2_small.toml"
BERT = "bert_base.toml"
RESNET = "resnet50.toml"
# A config path with a "/" is relative to the repository, else to configs/.
LLAMA = "bench/peers/llama_base.toml"

# Note [Llama peers]: the Llama rows have three peers, the ones a user of these models runs
# (issue 40): Hugging Face's LlamaForCausalLM, and a torchtitan-style module eager and under
# torch.compile (llama_recipe.py --impl). Each peer gets its own pair of runs with leantrain
# (taking turns at 1 rank, L P P L at 2 ranks), so at most two processes are alive at once (the
# real shapes hold 3-5 GB each, in fp32) and every ratio comes from one pair that shared the
# machine's slow windows. leantrain thus runs once per peer; its columns are over all its runs.
# The other rows have one peer, the DDP recipe ("peer", ddp_recipe.py).
LLAMA_PEERS = ("hf", "titan", "titan-compiled")
PEER_TITLES = {"hf": "HF eager", "titan": "titan eager", "titan-compiled": "titan compiled"}
# SmolLM2-135M's shape, and a deeper GQA model shaped like Llama 3.2 (llama3 RoPE scaling).
LLAMA135 = {"model.vocab_size": 49152, "model.hidden_size": 576, "model.intermediate_size": 1536,
            "model.num_hidden_layers": 30, "model.num_attention_heads": 9, "model.num_key_value_heads": 3,
            "model.rope_theta": 100000.0, "model.tie_word_embeddings": True, "model.dropout": 0.0}
LLAMAGQA = {"model.vocab_size": 32000, "model.hidden_size": 1024, "model.intermediate_size": 2816,
            "model.num_hidden_layers": 16, "model.num_attention_heads": 16, "model.num_key_value_heads": 4,
            "model.rope_theta": 500000.0, "model.rope_scaling": "llama3", "model.rope_factor": 32.0,
            "model.rope_low_freq_factor": 1.0, "model.rope_high_freq_factor": 4.0,
            "model.rope_original_max_position_embeddings": 8192, "model.tie_word_embeddings": False,
            "model.dropout": 0.0}

# Note [No dropout at CPU scale]: the two frameworks draw different dropout masks, so with
# dropout on, a run of 2-3 steps ends at losses that differ by mask noise alone (up to 1.3% on
# BERT, measured), which says nothing about whether both computed the same thing. With
# dropout 0 the final losses must agree closely, and a real difference shows.
NO_DROPOUT = {"model.dropout": 0.0}

# The rows: 1 and 2 ranks x fp32/bf16 x no/full recompute, every model.
EVERY_ROW = {"ranks": [1, 2], "precisions": ["fp32", "bf16"], "checkpoints": ["none", "full"],
             "only": lambda m, r, p, c: True, "comm": ["--parts", "a"]}

SCALES: Dict[str, dict] = {
    "smoke": {
        "models": {
            "gpt": (GPT, {"model.n_layer": 2, "model.d_model": 64, "model.n_head": 4, "model.seq_len": 32,
                          "model.vocab_size": 512, "model.dropout": 0.0}, dict(seq=32)),
            "bert": (BERT, {"model.n_layer": 2, "model.d_model": 64, "model.n_head": 4, "model.seq_len": 32,
                            "model.vocab_size": 512, "model.d_ff": 128, "model.dropout": 0.0}, dict(seq=32)),
            "resnet": (RESNET, {"model.depth": 0, "model.layers": [1, 1], "model.width": 8,
                                "model.image_size": 32, "model.num_classes": 10}, dict(image=32)),
        },
        # A high learning rate: a different sample or weight shows in the loss at once. One
        # thread: the smoke test runs beside other tests.
        "train": {"train.global_batch": 8, "train.micro_batch": 2, "train.steps": 3, "train.lr": 0.01,
                  "train.min_lr": 0.0, "train.warmup_steps": 1, "data.synthetic_samples": 256,
                  "train.threads": 1},
        "ranks": [1], "precisions": ["fp32", "bf16"], "checkpoints": ["none", "full"],
        # Every model in fp32; bf16 + full recompute once (gpt, llama): each code path runs once.
        "only": lambda m, r, p, c: (p, c) == ("fp32", "none") or (m, p, c) in (("gpt", "bf16", "full"),
                                                                               ("llama", "bf16", "full")),
        # torch.compile takes ~30 s per new graph here: the compiled peer in the fp32 row only.
        "peer_only": lambda m, r, p, c, peer: peer != "titan-compiled" or (p, c) == ("fp32", "none"),
        "comm": ["--layers", "1", "--d-model", "64", "--vocab", "256", "--parts", "a", "--warmup", "1",
                 "--iters", "2"],
        "ckpt": ["--model", "small", "--rounds", "1"],
        # --models llama: GQA 4/2, a tied head and llama3 RoPE scaling whose original context (16)
        # puts the frequencies in all three of its bands at seq 32.
        "optional_models": {"llama": {
            "llama": (LLAMA, {"model.vocab_size": 512, "model.hidden_size": 64, "model.intermediate_size": 160,
                              "model.num_hidden_layers": 2, "model.num_attention_heads": 4,
                              "model.num_key_value_heads": 2, "model.rope_theta": 10000.0,
                              "model.rope_scaling": "llama3", "model.rope_factor": 8.0,
                              "model.rope_original_max_position_embeddings": 16,
                              "model.max_position_embeddings": 64, "model.seq_len": 32,
                              "model.tie_word_embeddings": True, "model.dropout": 0.0}, dict(seq=32)),
        }},
    },
    "cpu": {
        "models": {
            "gpt6": (GPT, {"model.n_layer": 6, "model.seq_len": 32, **NO_DROPOUT}, {}),
            "gpt12": (GPT, {"model.n_layer": 12, "model.seq_len": 32, **NO_DROPOUT}, {}),
            "bert": (BERT, {"model.seq_len": 32, **NO_DROPOUT}, {}),
            "resnet50": (RESNET, {"model.image_size": 112}, {}),
        },
        "train": {"train.global_batch": 4, "train.micro_batch": 1, "train.steps": 2,
                  "data.synthetic_samples": 512},
        # Note [More runs for the parity rows]: at 1 rank both sides run the same kernels on
        # ResNet (profiled), so its rows are decided by a few percent, and the VM has slow
        # windows of 10-15 s (25-40 % slower steps, either side) that ABBA order cannot cancel
        # within 4 runs. Those rows get 8 runs per side (4 pairs) of 4 steps (3 timed) instead
        # of 2 of 6: twice the timed steps, and a window weighs a quarter of a side's runs, not
        # half. Since both sides take turns step by step (Note [Taking turns]) a window falls
        # on both alike; the 4 pairs stay, for more timed steps. docs/BENCH_PEERS.md has the
        # measurements.
        "train_resnet": {"train.global_batch": 8, "train.micro_batch": 2, "train.steps": 4},
        "repeats": {("resnet50", 1): 4},
        **EVERY_ROW,
        "ckpt": ["--model", "gpt2_small", "--rounds", "3"],
    },
    # Note [Real shapes]: the shapes users train, against the strongest recipe (SDPA,
    # AdamW(fused=True), non-reentrant checkpoint, DDP no_sync, bf16 autocast): GPT d 768 with 6
    # and 12 layers at seq 256, micro-batch 4; BERT-base at seq 128, micro-batch 8; ResNet-50 at
    # 224x224, micro-batch 8. Attention dropout 0 (nanoGPT's pretraining setting; with dropout
    # neither side has a fused attention kernel on the CPU, and PyTorch's SDPA math fallback
    # would make the peer slower for a reason no user wants). Two micro-batches per rank at 1
    # rank, one at 2 ranks (the global batch stays; 2 accumulating micro-batches per rank would
    # double the 2-rank rows' minutes on 2 cores). One warm-up and two timed steps per run, one
    # run per side (taking turns at 1 rank); `--repeats` for more. Its table is the headline of
    # docs/BENCH_PEERS.md; the `cpu` scale's (seq 32, micro-batch 1) stays below it.
    "real": {
        "models": {
            "gpt6": (GPT, {"model.n_layer": 6, "model.seq_len": 256, **NO_DROPOUT}, {}),
            "gpt12": (GPT, {"model.n_layer": 12, "model.seq_len": 256, **NO_DROPOUT}, {}),
            "bert": (BERT, {"model.seq_len": 128, **NO_DROPOUT}, {}),
            "resnet50": (RESNET, {"model.image_size": 224}, {}),
        },
        "train": {"train.global_batch": 8, "train.micro_batch": 4, "train.steps": 3,
                  "data.synthetic_samples": 512},
        "train_by_model": {"bert": {"train.global_batch": 16, "train.micro_batch": 8},
                           "resnet50": {"train.global_batch": 16, "train.micro_batch": 8},
                           "llama135": {"train.global_batch": 2, "train.micro_batch": 1},
                           "llamagqa": {"train.global_batch": 2, "train.micro_batch": 1}},
        "repeats_default": 1,
        "doc_marker": "real",
        **EVERY_ROW,
        "ckpt": ["--model", "gpt2_small", "--rounds", "3"],
        # --models llama (Note [Llama peers]): the two shapes at seq 512; micro-batch 1,
        # global batch 2 (2 micro-batches at 1 rank, 1 per rank at 2), as Note [CPU scale] shrinks
        # the batch and not the model: a llama135 fwd+bwd at seq 512 takes seconds on 2 cores.
        "optional_models": {"llama": {
            "llama135": (LLAMA, {**LLAMA135, "model.seq_len": 512}, {}),
            "llamagqa": (LLAMA, {**LLAMAGQA, "model.seq_len": 512}, {}),
        }},
    },
    # The same rows on one GPU (tests/gpu/peers.sh): 1 rank, the GPU-sized batches of `full`.
    "real-gpu": {
        "models": {
            "gpt6": (GPT, {"model.n_layer": 6, "model.seq_len": 1024, **NO_DROPOUT}, {}),
            "gpt12": (GPT, {"model.n_layer": 12, "model.seq_len": 1024, **NO_DROPOUT}, {}),
            "bert": (BERT, {"model.seq_len": 128, **NO_DROPOUT}, {}),
            "resnet50": (RESNET, {"model.image_size": 224}, {}),
        },
        "train": {"train.global_batch": 32, "train.micro_batch": 8, "train.steps": 8,
                  "data.synthetic_samples": 2048, "train.device": "cuda"},
        "train_by_model": {"bert": {"train.global_batch": 128, "train.micro_batch": 64},
                           "resnet50": {"train.global_batch": 128, "train.micro_batch": 64}},
        "repeats_default": 1,
        "doc_marker": "real-gpu",
        "mem_key": "peak_mem_bytes",  # the CUDA allocator's peak on both sides, not the host's RSS
        **EVERY_ROW,
        "ranks": [1],
        "ckpt": ["--model", "gpt2_small", "--rounds", "3"],
    },
    "full": {
        "models": {
            "gpt6": (GPT, {"model.n_layer": 6, "model.seq_len": 512}, {}),
            "gpt12": (GPT, {"model.n_layer": 12, "model.seq_len": 512}, {}),
            "bert": (BERT, {"model.seq_len": 512}, {}),
            "resnet50": (RESNET, {"model.image_size": 224}, {}),
        },
        "train": {"train.global_batch": 64, "train.micro_batch": 8, "train.steps": 20,
                  "data.synthetic_samples": 4096},
        "train_resnet": {"train.global_batch": 64, "train.micro_batch": 16},
        **EVERY_ROW,
        "ckpt": ["--model", "gpt2_small", "--rounds", "5"],
    },
}

# Settings every measured run shares: no progress bar, no checkpoints (the peer writes none;
# leantrain's end-of-run checkpoint came after the last step event, outside what is measured,
# but cost up to 5 s of wall time per GPT-12L run), a one-batch evaluation at the end
# (leantrain's; after the last step event too).
COMMON = {"train.device": "cpu", "log.progress": "none", "checkpoint.every_steps": 0,
          "checkpoint.at_end": False, "train.eval_batch": 1, "train.eval_max_batches": 1,
          "checkpoint.keep_last": 1}

# Note [Same start]: the export run. SGD without momentum has no optimizer state, so the file
# holds only the model; the NaN makes the one step a skipped update.
EXPORT = {"checkpoint.at_end": True, "train.steps": 1, "train.global_batch": 1, "train.micro_batch": 1, "train.optimizer": "sgd",
          "train.momentum": 0.0, "train.nonfinite": "skip", "precision.mode": "fp32",
          "memory.recompute": "none"}

TARGET_SPS, TARGET_SPS_GPT, TARGET_MEM, TARGET_LOSS = 1.0, 1.1, 1.0, 0.01
TARGET_SPS_LLAMA_EAGER = 1.1  # issue 40: >= 1.1x the stronger eager peer, >= 1.0x the compiled one


def set_arg(key: str, value) -> str:
    if isinstance(value, bool):
        v = "true" if value else "false"
    elif isinstance(value, (int, float)):
        v = repr(value)
    elif isinstance(value, list):
        v = "[" + ",".join(str(x) for x in value) + "]"
    else:
        v = str(value)
    return f"{key}={v}"


class Bench:
    def __init__(self, args):
        self.args = args
        self.scale = SCALES[args.scale]
        self.lt = os.path.join(args.bin, "leantrain")
        self.work = os.path.join(args.out, "runs")
        self.log = open(os.path.join(args.out, "bench.log"), "w")
        self.t0 = time.time()

    def say(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:7.1f} s] {msg}"
        print(line, file=sys.stderr, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    @staticmethod
    def child_env(env: Optional[dict] = None) -> dict:
        """A measured process's environment: no injected faults, the repo's Python tools, env."""
        e = {k: v for k, v in os.environ.items() if not k.startswith("LEANTRAIN_FAULT")}
        e["PYTHONPATH"] = os.path.join(ROOT, "tools")
        e.update(env or {})
        return e

    def run(self, cmd: List[str], what: str, env: Optional[dict] = None, timeout: int = 1800) -> str:
        e = self.child_env(env)
        t = time.time()
        before = usage_now()
        r = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)
        self.last_usage = {k: round(v - before[k], 3) for k, v in usage_now().items()}
        self.last_usage["wall_s"] = round(time.time() - t, 3)
        self.log.write(f"$ {' '.join(cmd)}\n{r.stdout[-4000:]}{r.stderr[-4000:]}\n")
        if r.returncode != 0:
            raise RuntimeError(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
        self.say(f"{what}: {time.time() - t:.1f} s")
        return r.stdout + r.stderr

    # ---- rows ----
    def models(self) -> Dict[str, tuple]:
        """The models --models names (model or optional set names of the scale), else the scale's."""
        s = self.scale
        if not self.args.models:
            return dict(s["models"])
        sets = s.get("optional_models", {})
        known = dict(s["models"])
        for group in sets.values():
            known.update(group)
        out = {}
        for name in self.args.models.split(","):
            if name in sets:
                out.update(sets[name])
            elif name in known:
                out[name] = known[name]
            else:
                raise ValueError(f"--models {self.args.models}: no model or set '{name}' in --scale {self.args.scale} "
                                 f"(models: {', '.join(known)}; sets: {', '.join(sets) or 'none'})")
        return out

    def rows(self) -> List[dict]:
        s = self.scale
        out = []
        for m, (config, model_sets, _) in self.models().items():
            train = dict(s["train"])
            if m.startswith("resnet") and "train_resnet" in s:
                train.update(s["train_resnet"])
            train.update(s.get("train_by_model", {}).get(m, {}))
            ranks = [int(x) for x in self.args.ranks.split(",")] if self.args.ranks else s["ranks"]
            for r in ranks:
                for p in s["precisions"]:
                    for c in s["checkpoints"]:
                        if not s["only"](m, r, p, c):
                            continue
                        label = f"{m} {r}r {p} ckpt-{c}"
                        if self.args.rows and not re.search(self.args.rows, label):
                            continue
                        sets = dict(model_sets)
                        sets.update(train)
                        sets.update(COMMON)
                        if "train.device" in train:
                            sets["train.device"] = train["train.device"]
                        sets.update({"precision.mode": p, "memory.recompute": c})
                        peers = [q for q in (LLAMA_PEERS if config == LLAMA else ("peer",))
                                 if s.get("peer_only", lambda *a: True)(m, r, p, c, q)]
                        out.append(dict(label=label, model=m, config=config, model_sets=model_sets,
                                        train=train, ranks=r, precision=p, ckpt=c, sets=sets, peers=peers))
        return out

    @staticmethod
    def config_path(config: str) -> str:
        return os.path.join(ROOT, config) if "/" in config else os.path.join(ROOT, "configs", config)

    def export_init(self, row: dict) -> (str, dict):
        """Note [Same start]: (checkpoint path, resolved config of the export run)."""
        d = os.path.join(self.work, f"init-{row['model']}")
        ckpt = os.path.join(d, "checkpoints", "step-00000001.h5")
        if not os.path.exists(ckpt):
            shutil.rmtree(d, ignore_errors=True)
            sets = dict(row["model_sets"])
            sets.update({k: v for k, v in row["train"].items() if k.startswith("data.")})
            sets.update(COMMON)
            sets.update(EXPORT)  # its end-of-run checkpoint is the export
            cmd = [self.lt, "train", "--config", self.config_path(row["config"]), "--out", d]
            for k, v in sets.items():
                cmd += ["--set", set_arg(k, v)]
            self.run(cmd, f"init weights for {row['model']} (leantrain, step 0)", env={"LEANTRAIN_FAULT": "nan@1"})
        with open(os.path.join(d, "config.json")) as fh:
            return ckpt, json.load(fh)

    def lt_cmd(self, row: dict, out: str) -> Tuple[List[str], str]:
        """(leantrain's command for a run of the row into out, its checkpoint directory)."""
        shutil.rmtree(out, ignore_errors=True)
        # The final checkpoint (written after the last step event, so outside what is measured)
        # goes to memory when it can: 1.4 GB to the disk costs seconds of wall time per run.
        ckpt_dir = os.path.join(SHM if os.path.isdir(SHM) else out, f"lt-peers-{os.getpid()}")
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        cmd = [self.lt, "train", "--config", self.config_path(row["config"]), "--out", out,
               "--set", f"checkpoint.dir={ckpt_dir}"]
        for k, v in row["sets"].items():
            cmd += ["--set", set_arg(k, v)]
        if row["ranks"] > 1:
            cmd = [os.path.join(ROOT, "cluster", "mpirun.sh"), str(row["ranks"])] + cmd
        return cmd, ckpt_dir

    def peer_cmd(self, row: dict, out: str, config_json: str, init: str, peer: str = "peer") -> List[str]:
        """The command of one peer run: ddp_recipe.py ("peer"), llama_recipe.py --impl for the
        Llama peers (Note [Llama peers])."""
        shutil.rmtree(out, ignore_errors=True)
        script = os.path.join(HERE, "ddp_recipe.py" if peer == "peer" else "llama_recipe.py")
        args = ["--config", config_json, "--init", init, "--out", out]
        if peer != "peer":
            args = ["--impl", peer] + args
        if row["ranks"] > 1:
            return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={row['ranks']}",
                    script] + args
        return [PY, script] + args

    def run_leantrain(self, row: dict, out: str) -> None:
        cmd, ckpt_dir = self.lt_cmd(row, out)
        try:
            self.run(cmd, f"{row['label']}: leantrain")
        finally:
            shutil.rmtree(ckpt_dir, ignore_errors=True)

    def run_peer(self, row: dict, out: str, config_json: str, init: str, peer: str = "peer") -> None:
        try:
            self.run(self.peer_cmd(row, out, config_json, init, peer), f"{row['label']}: {peer}")
        except RuntimeError:
            self.raise_if_unavailable(row, peer, out)
            raise

    def raise_if_unavailable(self, row: dict, peer: str, out: str) -> None:
        """A peer that cannot run on this machine (llama_recipe.py exit 3: torch.compile failed)
        left OUT/unavailable.json: PeerUnavailable with its error, so the row reports it."""
        path = os.path.join(out, "unavailable.json")
        if os.path.exists(path):
            with open(path) as fh:
                err = json.load(fh).get("error", "?")
            self.say(f"{row['label']}: {peer} cannot run here: {err.splitlines()[0] if err else '?'}")
            raise PeerUnavailable(err)

    def run_pair_in_turns(self, row: dict, i: int, outs: Dict[str, str], config_json: str, init: str,
                          first_config, peer: str = "peer") -> None:
        """Note [Taking turns]: one leantrain run and one peer run side by side, one step each
        in turn (trainers/include/leantrain/trainers/turns.h): leantrain's warm-up step first
        (its config.json, checked by first_config, is the peer's config), then the peer starts
        and takes its warm-up step, then the timed steps alternate, A B B A, starting with
        leantrain on even pairs i and the peer on odd ones. A slow window of the machine then
        falls on both sides' steps alike. Each process's CPU time and faults come from wait4."""
        steps = int(row["sets"]["train.steps"])
        tmp = tempfile.mkdtemp(prefix="lt-turns-")
        fds, procs, logs, usage = {}, {}, {}, {}
        t0, before = time.time(), usage_now()
        lt_cmd, ckpt_dir = self.lt_cmd(row, outs["lt"])

        def start(side: str, cmd: List[str]) -> None:
            go, done = os.path.join(tmp, side + ".go"), os.path.join(tmp, side + ".done")
            os.mkfifo(go)
            os.mkfifo(done)
            # Held read-write here, so the child's opens never block and its reads see end of
            # file only when this process is gone.
            fds[side] = (os.open(go, os.O_RDWR), os.open(done, os.O_RDWR | os.O_NONBLOCK))
            e = self.child_env({"LEANTRAIN_BENCH_TURNS": f"{go}:{done}"})
            logs[side] = open(os.path.join(tmp, side + ".log"), "w+")
            self.log.write(f"$ LEANTRAIN_BENCH_TURNS=... {' '.join(cmd)}\n")
            procs[side] = subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=logs[side], stderr=subprocess.STDOUT)

        def reap(side: str, block: bool) -> bool:
            """True once the side's process has exited (its rusage kept); raises if it failed."""
            if side in usage:
                return True
            pid, status, ru = os.wait4(procs[side].pid, 0 if block else os.WNOHANG)
            if pid == 0:
                return False
            procs[side].returncode = os.waitstatus_to_exitcode(status)
            usage[side] = {k: round(v, 3) for k, v in rusage_fields(ru).items()}
            if procs[side].returncode != 0:
                logs[side].seek(0)
                tail = logs[side].read()[-3000:]
                self.log.write(tail + "\n")
                if side == "peer":
                    self.raise_if_unavailable(row, peer, outs["peer"])
                raise RuntimeError(f"{row['label']}: {side} failed (exit {procs[side].returncode}) "
                                   f"while taking turns:\n{tail}")
            return True

        def turn(side: str, exit_turn: bool = False) -> None:
            os.write(fds[side][0], b"g")
            if exit_turn:
                return
            deadline = time.time() + 1800
            while time.time() < deadline:
                ready, _, _ = select.select([fds[side][1]], [], [], 1.0)
                if ready and os.read(fds[side][1], 1):
                    return
                if reap(side, block=False):
                    raise RuntimeError(f"{row['label']}: {side} exited before its turn ended")
            raise RuntimeError(f"{row['label']}: {side} held its turn for more than 1800 s")

        try:
            start("lt", lt_cmd)
            turn("lt")
            first_config(outs["lt"])
            start("peer", self.peer_cmd(row, outs["peer"], config_json, init, peer))
            turn("peer")
            for k in range(1, steps):
                for side in (("lt", "peer") if (i + k) % 2 == 0 else ("peer", "lt")):
                    turn(side)
            for side in ("lt", "peer"):
                turn(side, exit_turn=True)
            for side in ("lt", "peer"):
                reap(side, block=True)
        finally:
            for side, p in procs.items():
                if side not in usage and p.poll() is None:
                    p.kill()
                    p.wait()
            for f in list(fds.values()):
                for fd in f:
                    os.close(fd)
            for side, fh in logs.items():
                fh.seek(0)
                self.log.write(f"[{side}]\n{fh.read()[-4000:]}\n")
                fh.close()
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        steal = round(usage_now()["steal_s"] - before["steal_s"], 3)
        for side in usage:
            usage[side].update({"wall_s": round(time.time() - t0, 3), "steal_s": steal})
        self.pair_usage = usage
        self.say(f"{row['label']}: leantrain and peer in turns: {time.time() - t0:.1f} s")

    @staticmethod
    def steps(run_dir: str) -> List[dict]:
        with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
            return [e for e in (json.loads(l) for l in fh if l.strip()) if e.get("event") == "step"]

    def repeats_for(self, row: dict) -> int:
        """Pairs of runs per side: --repeats, else the scale's for (model, ranks) (Note [More runs
        for the parity rows]), else 2."""
        if self.args.repeats is not None:
            return self.args.repeats
        return self.scale.get("repeats", {}).get((row["model"], row["ranks"]), self.scale.get("repeats_default", 2))

    def measure_row(self, row: dict) -> dict:
        init, export_cfg = self.export_init(row)
        rdir = os.path.join(self.work, re.sub(r"[^A-Za-z0-9_.-]+", "_", row["label"]))
        os.makedirs(rdir, exist_ok=True)
        config_json = os.path.join(rdir, "peer_config.json")
        cfg = None

        def check_config(out: str) -> None:
            nonlocal cfg
            with open(os.path.join(out, "config.json")) as fh:
                ran = json.load(fh)
            if cfg is None:
                # The first run of a row is leantrain's: its resolved config is the peer's.
                if ran["model"] != export_cfg["model"] or ran["data"]["seed"] != export_cfg["data"]["seed"]:
                    raise RuntimeError(f"{row['label']}: the model or seed differs from the init export's")
                cfg = ran
                with open(config_json, "w") as fh:
                    json.dump(cfg, fh, indent=1)
            elif ran != cfg:
                raise RuntimeError(f"{row['label']}: leantrain's config.json changed between runs")

        if row["peers"] == ["peer"]:
            res, usage = self.measure_pairs(row, "peer", rdir, config_json, init, check_config)
            s = self.summarise(row, res, self.scale.get("mem_key", "peak_rss_bytes"))
            for side in usage:
                s[side]["usage"] = usage[side]
            return s
        # Note [Llama peers]: a pair of runs per peer, leantrain in each.
        pairs, unavailable = {}, {}
        for peer in row["peers"]:
            try:
                res, usage = self.measure_pairs(row, peer, os.path.join(rdir, peer), config_json, init, check_config)
            except PeerUnavailable as e:
                unavailable[peer] = str(e)
                continue
            pairs[peer] = (res, usage)
        return self.summarise_peers(row, pairs, unavailable, self.scale.get("mem_key", "peak_rss_bytes"))

    def measure_pairs(self, row: dict, peer: str, rdir: str, config_json: str, init: str,
                      check_config) -> Tuple[Dict[str, list], Dict[str, list]]:
        """The row's runs of leantrain and one peer into rdir: at 1 rank side by side taking turns
        (Note [Taking turns]), else whole runs L P P L; (steps per run, usage per run) by side."""
        os.makedirs(rdir, exist_ok=True)
        res = {"lt": [], "peer": []}
        usage = {"lt": [], "peer": []}
        if row["ranks"] == 1 and not self.args.no_turns:
            for i in range(self.repeats_for(row)):
                outs = {side: os.path.join(rdir, f"{side}{i}") for side in ("lt", "peer")}
                self.run_pair_in_turns(row, i, outs, config_json, init, check_config, peer)
                for side in ("lt", "peer"):
                    res[side].append(self.steps(outs[side]))
                    usage[side].append(self.pair_usage[side])
        else:
            order = []
            for _ in range(self.repeats_for(row)):
                order += ["lt", "peer"] if len(order) % 4 == 0 else ["peer", "lt"]
            for i, side in enumerate(order):
                out = os.path.join(rdir, f"{side}{i}")
                if side == "lt":
                    self.run_leantrain(row, out)
                    check_config(out)
                else:
                    self.run_peer(row, out, config_json, init, peer)
                res[side].append(self.steps(out))
                usage[side].append(self.last_usage)
        return res, usage

    @staticmethod
    def summarise(row: dict, res: dict, mem_key: str = "peak_rss_bytes") -> dict:
        """mem_key: the step events' memory field compared (the real-gpu scale: peak_mem_bytes,
        reported under peak_rss_bytes so the table and results.jsonl keep one shape)."""
        s = {"row": row}
        for side, runs in res.items():
            s[side] = side_stats(runs, mem_key)
        lt, pe = s["lt"], s["peer"]
        s["sps_ratio"] = lt["samples_per_s"] / pe["samples_per_s"]
        s["mem_ratio"] = lt["peak_rss_bytes"] / pe["peak_rss_bytes"] if pe["peak_rss_bytes"] else float("nan")
        s["loss_rel"] = abs(lt["final_loss"] - pe["final_loss"]) / max(abs(pe["final_loss"]), 1e-12)
        return s

    @classmethod
    def summarise_peers(cls, row: dict, pairs: Dict[str, tuple], unavailable: Dict[str, str],
                        mem_key: str = "peak_rss_bytes") -> dict:
        """A Llama row (Note [Llama peers]): each pair summarised as summarise() does, leantrain
        over all its runs, and the ratios the issue sets targets on: to the stronger eager peer
        (the higher samples/s of HF and titan eager) and to the compiled peer, each from its pair;
        the final-loss agreement is the largest relative difference to any peer."""
        s = {"row": row, "peers": {}, "unavailable": unavailable}
        lt_runs, lt_usage = [], []
        for peer, (res, usage) in pairs.items():
            p = cls.summarise(row, res, mem_key)
            p["lt"]["usage"], p["peer"]["usage"] = usage["lt"], usage["peer"]
            del p["row"]
            s["peers"][peer] = p
            lt_runs += res["lt"]
            lt_usage += usage["lt"]
        if lt_runs:
            s["lt"] = side_stats(lt_runs, mem_key)
            s["lt"]["usage"] = lt_usage
        eager = [q for q in ("hf", "titan") if q in s["peers"]]
        s["eager_best"] = max(eager, key=lambda q: s["peers"][q]["peer"]["samples_per_s"]) if eager else None
        for key, peer in (("eager", s["eager_best"]), ("compiled", "titan-compiled" if "titan-compiled" in s["peers"]
                                                          else None)):
            s[f"sps_ratio_{key}"] = s["peers"][peer]["sps_ratio"] if peer else None
            s[f"mem_ratio_{key}"] = s["peers"][peer]["mem_ratio"] if peer else None
        s["loss_rel"] = max((p["loss_rel"] for p in s["peers"].values()), default=None)
        return s

    # ---- the two benches' rows ----
    def comm_row(self) -> Optional[dict]:
        exe = os.path.join(self.args.bin, "leantrain_bench_comm")
        if not os.access(exe, os.X_OK):
            self.say(f"no {exe}: collective row skipped")
            return None
        text = self.run([os.path.join(ROOT, "cluster", "mpirun.sh"), "2", exe] + self.scale["comm"],
                        "collective: leantrain_bench_comm (2 ranks)")
        head = re.search(r"\(a\) gradient all-reduce: .*?(\d+) parameters = ([\d.]+) MiB", text)

        def busbw(name: str) -> float:
            m = re.search(re.escape(name) + r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text)
            if not m:
                raise RuntimeError(f"leantrain_bench_comm: no '{name}' line in its output")
            return float(m.group(3))

        return {"label": f"all-reduce busbw, 2 ranks, {head.group(2) if head else '?'} MiB (GB/s)",
                "metric": "busbw_gb_s", "value": busbw("GradientSync, gradients in the buckets"),
                "baseline": busbw("raw MPI_Allreduce (one call)"), "peer_name": "raw MPI_Allreduce"}

    def ckpt_row(self) -> Optional[dict]:
        exe = os.path.join(self.args.bin, "leantrain_bench_checkpoint")
        if not os.access(exe, os.X_OK):
            self.say(f"no {exe}: checkpoint row skipped")
            return None
        scratch = os.path.join(self.work, "ckpt_bench")
        shutil.rmtree(scratch, ignore_errors=True)
        text = self.run([exe, "--dir", scratch] + self.scale["ckpt"], "checkpoint: leantrain_bench_checkpoint")
        shutil.rmtree(scratch, ignore_errors=True)

        def mib(name: str) -> float:
            m = re.search(r"\| " + re.escape(name) + r"[^|]*\| ([\d.]+) \| ([\d.e+]+) \| ([\d.]+) \|", text)
            if not m:
                raise RuntimeError(f"leantrain_bench_checkpoint: no '{name}' row in its output")
            return float(m.group(3))

        size = re.search(r"\| write of ([^(|]+)", text)
        return {"label": f"checkpoint write, {size.group(1).strip() if size else '?'} (MiB/s)",
                "metric": "write_mib_per_s", "value": mib("commit_checkpoint"),
                "baseline": mib("baseline: fwrite + fflush + fsync"), "peer_name": "fwrite + fsync"}


class PeerUnavailable(RuntimeError):
    """A peer that cannot run on this machine (its error as the message): its column says so."""


def side_stats(runs: List[List[dict]], mem_key: str = "peak_rss_bytes") -> dict:
    """One side's numbers over its runs (each a list of step events)."""
    # samples/s over the timed steps (the first step of each run is warm-up: lazy
    # allocations, the optimizer state, oneDNN primitive caches, torch.compile): sum of samples /
    # sum of step times over all repeats.
    # Note [Same step]: a step's time without building its samples, on both sides: the
    # peer builds them before its step timer starts, leantrain inside its step and
    # reports that part as data_time_s.
    samples = secs = 0.0
    for steps in runs:
        timed = steps[1:] if len(steps) > 1 else steps
        samples += sum(e["samples_per_s"] * e["step_time_s"] for e in timed)
        secs += sum(e["step_time_s"] - e.get("data_time_s", 0.0) for e in timed)
    return {
        "samples_per_s": samples / secs,
        "peak_rss_bytes": max(max(e.get(mem_key) or 0 for e in steps) for steps in runs),
        "final_loss": runs[0][-1]["loss"],
        "final_loss_runs": [steps[-1]["loss"] for steps in runs],
        "losses": [e["loss"] for e in runs[0]],
        "step_time_s": [[round(e["step_time_s"], 4) for e in steps] for steps in runs],
        "data_time_s": [[round(e.get("data_time_s", 0.0), 4) for e in steps] for steps in runs],
    }


def rusage_fields(u) -> Dict[str, float]:
    return {"user_s": u.ru_utime, "sys_s": u.ru_stime, "minflt": u.ru_minflt, "majflt": u.ru_majflt,
            "nvcsw": u.ru_nvcsw, "nivcsw": u.ru_nivcsw}


def usage_now() -> Dict[str, float]:
    """What the finished children used (CPU seconds, page faults, context switches) and the VM's
    steal time so far: per-run differences go to details.json, to tell a slow run's cause
    (another tenant's steal, faults, preemption) from the code's."""
    out = rusage_fields(resource.getrusage(resource.RUSAGE_CHILDREN))
    out["steal_s"] = 0.0
    try:
        with open("/proc/stat") as fh:
            f = fh.readline().split()
        out["steal_s"] = int(f[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    return out


def commit_label() -> str:
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


def table(results: List[dict], extra: List[dict]) -> str:
    single = [s for s in results if "peers" not in s]
    lines = ["| row | leantrain samples/s | peer samples/s | ratio | leantrain peak RSS | peer peak RSS | ratio "
             "| final loss leantrain | peer | rel. diff | targets |",
             "|---|---|---|---|---|---|---|---|---|---|---|"] if single or not results else []
    for s in single:
        r, lt, pe = s["row"], s["lt"], s["peer"]
        want = TARGET_SPS_GPT if r["model"].startswith("gpt") else TARGET_SPS
        miss = []
        if s["sps_ratio"] < want:
            miss.append(f"speed < {want}x")
        if s["mem_ratio"] > TARGET_MEM:
            miss.append("memory > 1.0x")
        if s["loss_rel"] > TARGET_LOSS:
            miss.append("loss > 1%")
        lines.append(f"| {r['label']} | {lt['samples_per_s']:.3f} | {pe['samples_per_s']:.3f} | "
                     f"**{s['sps_ratio']:.2f}x** | {gib(lt['peak_rss_bytes'])} | {gib(pe['peak_rss_bytes'])} | "
                     f"**{s['mem_ratio']:.2f}x** | {lt['final_loss']:.6f} | {pe['final_loss']:.6f} | "
                     f"{100 * s['loss_rel']:.4f}% | {'met' if not miss else 'missed: ' + ', '.join(miss)} |")
    llama = [s for s in results if "peers" in s]
    if llama:
        lines += ([""] if lines else []) + llama_table(llama)
    if extra:
        lines += ["", "| row | leantrain | baseline | ratio |", "|---|---|---|---|"]
        for e in extra:
            lines.append(f"| {e['label']} | {e['value']:.3f} | {e['baseline']:.3f} ({e['peer_name']}) | "
                         f"**{e['value'] / e['baseline']:.2f}x** |")
    return "\n".join(lines) + "\n"


def llama_table(results: List[dict]) -> List[str]:
    """The Llama rows (Note [Llama peers]): leantrain's samples/s and peak RSS over all its runs,
    each peer's; the ratios (bold) are leantrain's in the pair with that peer over the peer's."""
    def cell(s: dict, peer: str, f) -> str:
        if peer in s["peers"]:
            return f(s["peers"][peer]["peer"])
        if peer in s["unavailable"]:
            first = (s["unavailable"][peer].strip().splitlines() or ["?"])[0]
            return "n/a: " + (first[:90] + ("..." if len(first) > 90 else "")).replace("|", "/")
        return "not run"

    def ratio(v: Optional[float]) -> str:
        return f"**{v:.2f}x**" if v is not None else "n/a"

    peers = LLAMA_PEERS
    lines = ["| row | leantrain samples/s | " + " | ".join(PEER_TITLES[p] for p in peers) +
             " | vs stronger eager | vs compiled | leantrain peak RSS | " + " | ".join(PEER_TITLES[p] for p in peers) +
             " | RSS vs stronger eager | RSS vs compiled | final loss leantrain | max rel. diff | targets |",
             "|" + "---|" * (10 + 2 * len(peers))]
    for s in results:
        r, lt = s["row"], s.get("lt")
        miss = []
        for key, want in (("eager", TARGET_SPS_LLAMA_EAGER), ("compiled", TARGET_SPS)):
            v, m = s[f"sps_ratio_{key}"], s[f"mem_ratio_{key}"]
            if v is None:
                miss.append(f"no {key} peer")
                continue
            if v < want:
                miss.append(f"speed < {want}x {key}")
            if m > TARGET_MEM:
                miss.append(f"memory > 1.0x {key}")
        if s["loss_rel"] is not None and s["loss_rel"] > TARGET_LOSS:
            miss.append("loss > 1%")
        eager = f" ({PEER_TITLES[s['eager_best']]})" if s["eager_best"] else ""
        cells = [r["label"], f"{lt['samples_per_s']:.3f}" if lt else "n/a"]
        cells += [cell(s, p, lambda x: f"{x['samples_per_s']:.3f}") for p in peers]
        cells += [ratio(s["sps_ratio_eager"]) + eager, ratio(s["sps_ratio_compiled"])]
        cells += [gib(lt["peak_rss_bytes"]) if lt else "n/a"]
        cells += [cell(s, p, lambda x: gib(x["peak_rss_bytes"])) for p in peers]
        cells += [ratio(s["mem_ratio_eager"]), ratio(s["mem_ratio_compiled"])]
        cells += [f"{lt['final_loss']:.6f}" if lt else "n/a",
                  f"{100 * s['loss_rel']:.4f}%" if s["loss_rel"] is not None else "n/a",
                  "met" if not miss else "missed: " + ", ".join(miss)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_jsonl(path: str, results: List[dict], extra: List[dict]) -> None:
    """One line per (row, metric); a Llama row has one per peer, its row "<label> vs <peer>" and
    value leantrain's in that pair (Note [Llama peers])."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        for s in results:
            pairs = [(f"{s['row']['label']} vs {p}", q) for p, q in s["peers"].items()] if "peers" in s \
                else [(s["row"]["label"], s)]
            for label, q in pairs:
                for metric in ("samples_per_s", "peak_rss_bytes", "final_loss"):
                    fh.write(json.dumps({"bench": "peers", "row": label, "metric": metric,
                                         "value": q["lt"][metric], "baseline": q["peer"][metric]}) + "\n")
        for e in extra:
            fh.write(json.dumps({"bench": "peers", "row": e["label"], "metric": e["metric"],
                                 "value": e["value"], "baseline": e["baseline"]}) + "\n")
    os.replace(tmp, path)


def main(argv) -> int:
    ap = argparse.ArgumentParser(description="leantrain vs the PyTorch DDP recipe, side by side")
    ap.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"), help="leantrain's bin directory")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "peers"),
                    help="results.jsonl, bench.log, plots, and runs/ (deleted at the end unless --keep)")
    ap.add_argument("--doc", default=None, help="markdown file for the table (default docs/BENCH_PEERS.md "
                    "for --scale cpu|full, none for smoke)")
    ap.add_argument("--models", default="", help="comma-separated models or model sets of the scale instead of its "
                    "default ones, e.g. 'llama' (the Llama rows: llama135 and llamagqa at --scale real, Note [Llama "
                    "peers]) or 'llama135,gpt6'")
    ap.add_argument("--rows", default="", help="only rows whose label matches this regex (e.g. 'gpt6 1r')")
    ap.add_argument("--ranks", default="", help="comma-separated rank counts instead of the scale's (e.g. 2)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="pairs of runs per side per row (alternating A B B A); default 2, more for the rows "
                         "the scale names (Note [More runs for the parity rows])")
    ap.add_argument("--no-extra", action="store_true", help="skip the collective and checkpoint rows")
    ap.add_argument("--no-turns", action="store_true", help="1-rank rows too as whole runs one after the other "
                    "(A B B A), not side by side taking turns step by step (Note [Taking turns])")
    ap.add_argument("--keep", action="store_true", help="keep OUT/runs/")
    ap.add_argument("--list", action="store_true", help="print the rows and exit")
    args = ap.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.ranks and not re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*", args.ranks):
        ap.error(f"--ranks {args.ranks!r}: expected rank counts like 1,2")
    if not os.access(os.path.join(args.bin, "leantrain"), os.X_OK):
        print(f"compare.py: no leantrain binary in --bin {args.bin} (build it: bash bench/peers/run.sh builds)",
              file=sys.stderr)
        return 2
    # The doc holds whole runs only: not smoke, not a --rows subset. A --ranks subset of a scale
    # with a doc marker of its own (real) has its own section (the 1- and 2-rank halves of the
    # real scale take ~an hour each on 2 cores).
    # --models makes a section of its own too (real models llama ranks 1), and none for a scale
    # without a doc marker (its default section holds the default models).
    marker = SCALES[args.scale].get("doc_marker", "")
    if marker and args.models:
        marker += f" models {args.models}"
    if marker and args.ranks:
        marker += f" ranks {args.ranks}"
    doc = args.doc if args.doc is not None else (
        None if args.scale == "smoke" or args.rows or ((args.ranks or args.models) and not marker) else
        os.path.join(ROOT, "docs", "BENCH_PEERS.md"))
    os.makedirs(args.out, exist_ok=True)
    bench = Bench(args)
    try:
        rows = bench.rows()
    except ValueError as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(r["label"] for r in rows))
        return 0
    if not rows:
        print(f"compare.py: no row matches --rows {args.rows!r}", file=sys.stderr)
        return 2
    n_runs = sum(2 * bench.repeats_for(r) * len(r["peers"]) for r in rows)
    bench.say(f"scale {args.scale}: {len(rows)} rows, {n_runs} runs; commit {commit_label()}")
    results, extra = [], []
    try:
        for row in rows:
            s = bench.measure_row(row)
            results.append(s)
            if "peers" not in s:
                bench.say(f"{row['label']}: samples/s {s['sps_ratio']:.2f}x, peak RSS {s['mem_ratio']:.2f}x, "
                          f"final loss diff {100 * s['loss_rel']:.4f}%")
            for peer, p in s.get("peers", {}).items():
                bench.say(f"{row['label']} vs {peer}: samples/s {p['sps_ratio']:.2f}x, peak RSS {p['mem_ratio']:.2f}x, "
                          f"final loss diff {100 * p['loss_rel']:.4f}%")
            for peer, err in s.get("unavailable", {}).items():
                bench.say(f"{row['label']} vs {peer}: unavailable: {err.splitlines()[0] if err else '?'}")
        if not args.no_extra and not args.rows:
            for f in (bench.comm_row, bench.ckpt_row):
                e = f()
                if e:
                    extra.append(e)
    except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 1
    wall = time.time() - bench.t0
    md = table(results, extra)
    print(md)
    write_jsonl(os.path.join(args.out, "results.jsonl"), results, extra)
    with open(os.path.join(args.out, "details.json"), "w") as fh:
        json.dump({"scale": args.scale, "commit": commit_label(), "wall_s": wall,
                   "rows": [{k: v for k, v in s.items() if k != "row"} | {"label": s["row"]["label"],
                            "sets": s["row"]["sets"]} for s in results], "extra": extra}, fh, indent=1)
    if doc:
        write_doc(doc, md, args, wall, len(rows), n_runs, marker)
    report = subprocess.run([os.path.join(args.bin, "leantrain"), "report", "--help"], capture_output=True, text=True)
    if report.returncode == 0 and "--bench" in report.stdout + report.stderr:
        # Into a folder of its own: `report --out DIR` replaces what DIR held (results.jsonl too).
        bench.run([os.path.join(args.bin, "leantrain"), "report", "--bench", os.path.join(args.out, "results.jsonl"),
                   "--out", os.path.join(args.out, "plots")], "plots: leantrain report --bench")
    else:
        bench.say("leantrain report has no --bench option in this build: plots skipped")
    if not args.keep:
        shutil.rmtree(bench.work, ignore_errors=True)
    bench.say(f"done in {wall:.0f} s; {os.path.join(args.out, 'results.jsonl')}" + (f", {doc}" if doc else ""))
    return 0


def cpu_label() -> str:
    """The CPU's model name and whether it has bf16 instructions (AVX-512 BF16 / AMX): bf16
    rows compare very differently with and without them, and a machine kind may change."""
    model, flags = "unknown CPU", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} cores, bf16 instructions: {' + '.join(bf16) if bf16 else 'none'}"


def write_doc(path: str, md: str, args, wall: float, n_rows: int, runs: int, marker: str = "") -> None:
    """The generated part of docs/BENCH_PEERS.md, between the two markers (the prose around it
    is kept); a new file gets just the markers and the table. A scale with a doc marker (real)
    has its own pair of markers, so its table and the cpu scale's live side by side."""
    tag = f" ({marker})" if marker else ""
    begin, end = f"<!-- BEGIN GENERATED{tag} by bench/peers/compare.py -->", f"<!-- END GENERATED{tag} -->"
    load = os.getloadavg()
    body = (f"{begin}\nMeasured at commit `{commit_label()}`, `--scale {args.scale}`, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {wall:.0f} s wall, load average at the end "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, {n_rows} rows, {runs} runs, "
            f"on {cpu_label()}.\n\n{md}{end}")
    text = open(path).read() if os.path.exists(path) else ""
    if begin in text and end in text:
        text = text[:text.index(begin)] + body + text[text.index(end) + len(end):]
    else:
        text = (text + "\n" if text else "") + body + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
