#!/usr/bin/env python3
"""configs/smollm2_135m.toml, the SmolLM2-135M-shaped pretraining recipe, run as its comment
says but shrunk with --set to a CPU-sized model (2 blocks, width 144, still 9 query heads over 3
key/value heads, seq 64, 30 steps, fp32: bf16 at this size is slower on a CPU than fp32):

- the shipped file has SmolLM2-135M's shape (so the shrinking below is all --set);
- tools/prepare_text.py writes byte-level BPE shards of Debian's fortunes (4096 tokens, the
  recipe's vocabulary);
- `train` on them: the loss falls;
- `export --format hf` of its last checkpoint is a LlamaForCausalLM directory with the shape
  trained; transformers' AutoModelForCausalLM.from_pretrained opens it, its loss on a training
  window is finite and near leantrain's, and model.generate(max_new_tokens=8) on a prompt
  encoded by the shards' tokenizer.json runs and returns 8 new tokens.
Then the fine-tuning recipes, configs/qwen2.5_0.5b_finetune.toml and llama3.2_1b_finetune.toml,
as written but for seq 64 and 3 steps, from tiny random-weight Qwen2ForCausalLM /
LlamaForCausalLM (llama3 RoPE) directories that transformers itself saves: `--init-from DIR`
alone fills in the model (bf16, full recompute, int8 moments; the Llama one's shard =
gradients runs as none at one rank), and `export --format hf --dtype bf16 --source DIR` opens
with from_pretrained as the source's architecture.

    .venv/bin/python tests/python/test_llama_recipe.py build/bin/leantrain
Exit codes: 0 pass, 1 fail, 77 no binary given."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import tomllib

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
CORPUS = "/usr/share/games/fortunes"
CONFIG = os.path.join(ROOT, "configs", "smollm2_135m.toml")
# The checks, the command runner and the metrics reader are test_recipes' (the recipes test in this
# folder): one definition of each.
from test_recipes import FAILS, check, run, steps as step_events  # noqa: E402


def test_shipped_shape() -> None:
    with open(CONFIG, "rb") as f:
        cfg = tomllib.load(f)
    m = cfg["model"]
    shape = {k: m.get(k) for k in ("kind", "hidden_size", "intermediate_size", "num_hidden_layers",
                                    "num_attention_heads", "num_key_value_heads", "tie_word_embeddings",
                                    "rms_norm_eps", "rope_theta", "seq_len")}
    want = {"kind": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "seq_len": 2048}
    check(shape == want, f"smollm2 recipe: the shipped config has SmolLM2-135M's shape ({shape})")
    check(m.get("vocab_size") == cfg["data"].get("vocab_size") == 4096,
          "smollm2 recipe: model.vocab_size = data.vocab_size = the 4096-token BPE of the shards")


def test_recipe(leantrain: str, tmp: str) -> None:
    import transformers
    from tokenizers import Tokenizer
    shards = os.path.join(tmp, "fortunes-bpe")
    r = run([PY, os.path.join(ROOT, "tools/prepare_text.py"), "--out", shards, "--train-bpe", "4096",
             "--doc-separator", "%", CORPUS])
    check(r.returncode == 0, "smollm2 recipe: prepare_text writes the fortunes BPE shards")
    if r.returncode != 0:
        return
    out = os.path.join(tmp, "run")
    sets = [f"data.train={shards}/train_*.bin", f"data.eval={shards}/val_*.bin",
            "model.num_hidden_layers=2", "model.hidden_size=144", "model.intermediate_size=384",
            "model.seq_len=64", "precision.mode=fp32", "train.global_batch=16", "train.micro_batch=8",
            "train.steps=30", "train.warmup_steps=5", "train.lr=3e-3", "train.eval_max_batches=2",
            "checkpoint.every_steps=0", "log.progress=none"]
    cmd = [leantrain, "train", "--config", CONFIG, "--out", out]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    r = run(cmd)
    check(r.returncode == 0 and "9 query / 3 key-value heads" in r.stderr,
          f"smollm2 recipe: train (shrunk, GQA 9/3) exits 0 ({time.time() - t0:.1f} s)")
    if r.returncode != 0:
        return
    steps = step_events(out)
    first, last = steps[0]["loss"], steps[-1]["loss"]
    check(len(steps) == 30 and np.isfinite(last) and last < first - 1.0,
          f"smollm2 recipe: the loss falls over 30 steps ({first:.3f} -> {last:.3f})")

    ckdir = os.path.join(out, "checkpoints")
    ckpt = os.path.join(ckdir, sorted(f for f in os.listdir(ckdir) if f.endswith(".h5"))[-1])
    exported = os.path.join(tmp, "export")
    r = run([leantrain, "export", ckpt, "--format", "hf", "--out", exported])
    check(r.returncode == 0, "smollm2 recipe: export --format hf of the last checkpoint exits 0")
    if r.returncode != 0:
        return
    conf = json.load(open(os.path.join(exported, "config.json")))
    got = {k: conf.get(k) for k in ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                    "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings")}
    check(got == {"architectures": ["LlamaForCausalLM"], "hidden_size": 144, "num_hidden_layers": 2,
                  "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 384,
                  "vocab_size": 4096, "tie_word_embeddings": True},
          f"smollm2 recipe: the export's config.json is the LlamaForCausalLM trained ({got})")

    model = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    check(type(model).__name__ == "LlamaForCausalLM", "smollm2 recipe: from_pretrained opens it as LlamaForCausalLM")
    # Its loss on a training window, against leantrain's last training losses (same weights,
    # fp32; a window of 64 + 1 tokens from the first shard, which training sampled from).
    raw = np.fromfile(os.path.join(shards, "train_000000.bin"), dtype=np.uint16, offset=1024)
    windows = torch.from_numpy(raw[:65 * 8].astype(np.int64)).view(8, 65)
    with torch.no_grad():
        hf_loss = model(input_ids=windows[:, :64], labels=windows[:, :64]).loss.item()
    tail = float(np.mean([s["loss"] for s in steps[-5:]]))
    check(np.isfinite(hf_loss) and abs(hf_loss - tail) < 0.5,
          f"smollm2 recipe: transformers' loss on training windows {hf_loss:.3f} is near leantrain's last {tail:.3f}")
    tok = Tokenizer.from_file(os.path.join(shards, "tokenizer.json"))
    prompt = torch.tensor([tok.encode("What is a computer?").ids])
    try:
        with torch.no_grad():
            gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                                 do_sample=False, pad_token_id=0)
        new = gen[0, prompt.shape[1]:].tolist()
        ok = len(new) == 8 and all(0 <= t < 4096 for t in new)
        print(f"  generated: {tok.decode(gen[0].tolist())!r}")
    except Exception as e:  # any error from generate is the failure this checks for
        print(f"  generate raised {type(e).__name__}: {e}")
        ok = False
    check(ok, "smollm2 recipe: model.generate(max_new_tokens=8) on the export runs and returns 8 tokens")


def test_finetune(leantrain: str, tmp: str) -> None:
    import transformers
    shards = os.path.join(tmp, "fortunes-bpe")
    if not os.path.isdir(shards):
        return
    small = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(0)
    models = {
        "qwen2.5_0.5b_finetune": transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            **small, rope_theta=1e6, rms_norm_eps=1e-6)),
        "llama3.2_1b_finetune": transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **small, rope_theta=5e5, rms_norm_eps=1e-5,
            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 128})),
    }
    for config, model in models.items():
        arch = type(model).__name__
        src = os.path.join(tmp, arch)
        model.save_pretrained(src)
        out = os.path.join(tmp, config)
        cmd = [leantrain, "train", "--config", os.path.join(ROOT, "configs", f"{config}.toml"), "--out", out,
               "--init-from", src]
        for s in [f"data.train={shards}/train_*.bin", f"data.eval={shards}/val_*.bin", "model.seq_len=64",
                  "train.global_batch=4", "train.steps=3", "train.eval_max_batches=1", "log.progress=none"]:
            cmd += ["--set", s]
        r = run(cmd)
        check(r.returncode == 0 and f"(Hugging Face {arch})" in r.stderr and "optimizer state int8" in r.stderr,
              f"{config}: train --init-from a {arch} directory alone (bf16, full recompute, int8 state) exits 0")
        if r.returncode != 0:
            continue
        ckdir = os.path.join(out, "checkpoints")
        ckpt = os.path.join(ckdir, sorted(f for f in os.listdir(ckdir) if f.endswith(".h5"))[-1])
        exported = os.path.join(tmp, f"{config}-export")
        r = run([leantrain, "export", ckpt, "--format", "hf", "--dtype", "bf16", "--source", src, "--out", exported])
        ok = r.returncode == 0 and type(transformers.AutoModelForCausalLM.from_pretrained(exported)).__name__ == arch
        check(ok, f"{config}: export --format hf --dtype bf16 --source opens with from_pretrained as {arch}")


def main(argv):
    if len(argv) < 2:
        print("skip: no leantrain binary given")
        return 77
    t0 = time.time()
    test_shipped_shape()
    with tempfile.TemporaryDirectory(prefix="llama_recipe_") as tmp:
        test_recipe(argv[1], tmp)
        test_finetune(argv[1], tmp)
    print(f"{time.time() - t0:.1f} s")
    if FAILS:
        print(f"{len(FAILS)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
