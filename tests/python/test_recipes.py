#!/usr/bin/env python3
"""The fine-tuning recipes of configs/ run as their comments say, shrunk to tiny shapes with
--set (no download: the pretrained weights are models built from a config with random
weights, saved the way the ecosystem saves them):

- gpt2_continue_hf.toml: a GPT2LMHeadModel directory and shards from tools/prepare_text.py
  with the model's own tokenizer (a byte-level BPE saved as tokenizer.json); `train
  --init-from DIR` loads every tensor, the loss falls, and `export --format hf` of the last
  checkpoint opens with AutoModelForCausalLM.from_pretrained.
- bert_mlm_hf.toml: a BertForMaskedLM directory and WordPiece shards; the [MASK] and special
  ids come from the prepared meta.json; the export opens with AutoModelForMaskedLM.
- resnet50_finetune.toml: a torchvision resnet50 state dict (.pth) converted by
  tools/torchvision_to_safetensors.py, an image folder of PNGs with 3 classes; `--init-from
  --init-skip-mismatched` loads everything but the new 3-class head and lists it; the export
  loads into torchvision.models.resnet50(num_classes=3) strictly.

    .venv/bin/python tests/python/test_recipes.py build/bin/leantrain
Exit codes: 0 pass, 1 fail, 77 no binary given."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
CORPUS = "/usr/share/games/fortunes/computers"
FAILS: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILS.append(what)


def run(cmd, expect=0):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
    if r.returncode != expect:
        print(f"  exit {r.returncode} (expected {expect}): {' '.join(map(str, cmd))}\n{r.stderr[-1500:]}")
    return r


def steps(run_dir):
    return [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"event":"step"' in l]


def train(leantrain, config, out, init, sets, extra=()):
    cmd = [leantrain, "train", "--config", os.path.join(ROOT, "configs", config), "--out", out, "--init-from", init]
    for s in sets:
        cmd += ["--set", s]
    return run(cmd + list(extra))


def last_checkpoint(out):
    d = os.path.join(out, "checkpoints")
    return os.path.join(d, sorted(f for f in os.listdir(d) if f.endswith(".h5"))[-1])


def test_gpt2(leantrain, tmp):
    import transformers
    shards = os.path.join(tmp, "gpt-shards")
    r = run([PY, os.path.join(ROOT, "tools/prepare_text.py"), "--out", shards, "--train-bpe", "512",
             "--doc-separator", "%", CORPUS])
    check(r.returncode == 0, "gpt2 recipe: prepare_text writes BPE shards")
    model_dir = os.path.join(tmp, "gpt2")
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2,
                                                         n_head=2, bos_token_id=0,
                                                         eos_token_id=0)).save_pretrained(model_dir)
    out = os.path.join(tmp, "gpt-run")
    sets = [f"data.train={shards}/train_*.bin", f"data.eval={shards}/val_*.bin", "data.vocab_size=512",
            "model.vocab_size=512", "model.seq_len=32", "model.n_layer=2", "model.n_head=2", "model.d_model=64",
            "train.global_batch=8", "train.micro_batch=4", "train.steps=12", "train.lr=1e-3", "train.warmup_steps=2",
            "train.eval_max_batches=2", "checkpoint.every_steps=6"]
    r = train(leantrain, "gpt2_continue_hf.toml", out, model_dir, sets)
    check(r.returncode == 0 and "(Hugging Face GPT2LMHeadModel)" in r.stderr,
          "gpt2 recipe: train --init-from the Hugging Face directory (bf16, selective recompute) exits 0")
    if r.returncode != 0:
        return
    s = steps(out)
    check(s[-1]["loss"] < s[0]["loss"], f"gpt2 recipe: loss falls ({s[0]['loss']:.3f} -> {s[-1]['loss']:.3f})")
    exported = os.path.join(tmp, "gpt2-export")
    r = run([leantrain, "export", last_checkpoint(out), "--format", "hf", "--out", exported])
    m = transformers.AutoModelForCausalLM.from_pretrained(exported)
    check(r.returncode == 0 and type(m).__name__ == "GPT2LMHeadModel",
          "gpt2 recipe: the exported checkpoint opens with AutoModelForCausalLM")


def test_bert(leantrain, tmp):
    import transformers
    shards = os.path.join(tmp, "bert-shards")
    r = run([PY, os.path.join(ROOT, "tools/prepare_text.py"), "--out", shards, "--train-wordpiece", "512",
             "--doc-separator", "%", CORPUS])
    check(r.returncode == 0, "bert recipe: prepare_text writes WordPiece shards")
    meta = json.load(open(os.path.join(shards, "meta.json")))["leantrain_data"]
    model_dir = os.path.join(tmp, "bert")
    torch.manual_seed(0)
    transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                                                         num_attention_heads=2, intermediate_size=256,
                                                         max_position_embeddings=64)).save_pretrained(model_dir)
    out = os.path.join(tmp, "bert-run")
    sets = [f"data.train={shards}/train_*.bin", f"data.eval={shards}/val_*.bin", "data.vocab_size=512",
            f"data.mask_id={meta['mask_id']}", f"data.special_ids={meta['special_ids']}".replace(" ", ""),
            "model.vocab_size=512", "model.seq_len=32", "model.n_layer=2", "model.n_head=2", "model.d_model=64",
            "model.dropout=0", "train.global_batch=8", "train.micro_batch=8", "train.steps=12", "train.lr=1e-3",
            "train.warmup_steps=2", "train.eval_max_batches=2", "checkpoint.every_steps=6"]
    r = train(leantrain, "bert_mlm_hf.toml", out, model_dir, sets)
    check(r.returncode == 0 and "(Hugging Face BertForMaskedLM)" in r.stderr,
          "bert recipe: train --init-from the Hugging Face directory exits 0")
    if r.returncode != 0:
        return
    s = steps(out)
    check(s[-1]["loss"] < s[0]["loss"], f"bert recipe: loss falls ({s[0]['loss']:.3f} -> {s[-1]['loss']:.3f})")
    exported = os.path.join(tmp, "bert-export")
    r = run([leantrain, "export", last_checkpoint(out), "--format", "hf", "--out", exported])
    m = transformers.AutoModelForMaskedLM.from_pretrained(exported)
    check(r.returncode == 0 and type(m).__name__ == "BertForMaskedLM",
          "bert recipe: the exported checkpoint opens with AutoModelForMaskedLM")


def test_resnet(leantrain, tmp):
    import torchvision
    from PIL import Image
    from safetensors.torch import load_file
    root = os.path.join(tmp, "images")
    rng = np.random.default_rng(0)
    for c in range(3):
        os.makedirs(os.path.join(root, f"c{c}"))
        for i in range(8):
            img = (rng.random((40, 48, 3)) * 80 + 60 * c).astype(np.uint8)
            Image.fromarray(img).save(os.path.join(root, f"c{c}", f"{i}.png"))
    torch.manual_seed(0)
    pth = os.path.join(tmp, "resnet50.pth")
    torch.save(torchvision.models.resnet50().state_dict(), pth)
    st = os.path.join(tmp, "resnet50.safetensors")
    r = run([PY, os.path.join(ROOT, "tools/torchvision_to_safetensors.py"), pth, st])
    check(r.returncode == 0, "resnet recipe: torchvision_to_safetensors converts the .pth")
    out = os.path.join(tmp, "resnet-run")
    sets = [f"data.train={root}", f"data.eval={root}", "model.num_classes=3", "model.image_size=32",
            "train.global_batch=8", "train.micro_batch=4", "train.epochs=1", "train.eval_batch=8", "data.workers=2"]
    r = train(leantrain, "resnet50_finetune.toml", out, st, sets, ["--init-skip-mismatched"])
    check(r.returncode == 0 and "skipped 2 with another shape" in r.stderr and "fc.weight" in r.stderr,
          "resnet recipe: --init-from the torchvision weights loads all but the new head, which is listed")
    if r.returncode != 0:
        return
    exported = os.path.join(tmp, "resnet-export")
    r = run([leantrain, "export", last_checkpoint(out), "--format", "hf", "--out", exported])
    files = [f for f in os.listdir(exported) if f.endswith(".safetensors")] if r.returncode == 0 else []
    ok = False
    if files:
        m = torchvision.models.resnet50(num_classes=3)
        m.load_state_dict(load_file(os.path.join(exported, files[0])), strict=True)
        ok = True
    check(ok, "resnet recipe: the export loads into torchvision resnet50(num_classes=3) strictly")


def main(argv):
    if len(argv) < 2:
        print("skip: no leantrain binary given")
        return 77
    with tempfile.TemporaryDirectory(prefix="recipes_") as tmp:
        test_gpt2(argv[1], tmp)
        test_bert(argv[1], tmp)
        test_resnet(argv[1], tmp)
    if FAILS:
        print(f"{len(FAILS)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
