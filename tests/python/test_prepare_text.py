#!/usr/bin/env python3
"""tools/prepare_text.py on Debian's fortunes corpus, and leantrain training on its shards.

1. A byte-level BPE trained on the corpus: the shards are llm.c files (magic 20240520, version
   1, the count equal to the size), every document round-trips exactly (decode of its tokens
   is the fortune's text), train and val together hold every document once.
2. The saved tokenizer.json named with --tokenizer gives the same shards byte for byte.
3. A WordPiece: documents are [CLS] ... [SEP], meta.json's mask_id / special_ids are the
   tokenizer's, and every id is below its vocabulary.
4. Bad arguments: exit 2 with a message naming the input, nothing written.
5. leantrain (configs/gpt_fortunes_bpe.toml, shrunk) trains GPT on the shards: the eval loss
   falls below the uniform ln(V) by a margin, and a resume from the run's step-40 checkpoint ends with
   the same loss as the uninterrupted run (the sampling invariant on token_shards).

    .venv/bin/python tests/python/test_prepare_text.py [build/bin/leantrain]
Exit codes: 0 pass, 1 fail (the leantrain part is skipped when no binary is given)."""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import prepare_text as pt  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

FORTUNES = "/usr/share/games/fortunes"
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)


def prepare(out, *args):
    return subprocess.run([sys.executable, str(ROOT / "tools/prepare_text.py"), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=300)


def read_shard(path):
    raw = Path(path).read_bytes()
    header = np.frombuffer(raw[:1024], dtype=np.int32)
    dtype = np.uint16 if header[0] == pt.MAGIC_U16 else np.uint32
    tokens = np.frombuffer(raw[1024:], dtype=dtype)
    return header, tokens


def split_on(tokens, sep):
    docs, cur = [], []
    for t in tokens.tolist():
        if t == sep:
            if cur:
                docs.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        docs.append(cur)
    return docs


def test_bpe(tmp):
    out = tmp / "bpe"
    r = prepare(out, "--train-bpe", "2048", "--doc-separator", "%", FORTUNES)
    check(r.returncode == 0, f"prepare_text --train-bpe exits 0 ({r.stderr.strip()[-200:]})")
    meta = json.loads((out / "meta.json").read_text())
    check(meta["vocab_size"] == 2048, "BPE vocabulary is 2048")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    eot = tok.token_to_id(pt.EOT)
    check(meta["special_tokens"].get(pt.EOT) == eot, "meta names <|endoftext|>'s id")
    docs = pt.read_documents(pt.input_files([FORTUNES]), "%")
    order = list(range(len(docs)))
    random.Random(1234).shuffle(order)
    expected = [docs[i] for i in order]
    decoded = []
    for split in ("val", "train"):
        for name in meta["shards"][split]:
            header, tokens = read_shard(out / name)
            check(header[0] == pt.MAGIC_U16 and header[1] == 1 and header[2] == len(tokens),
                  f"{name}: llm.c header (magic 20240520, version 1, count {header[2]} = {len(tokens)} tokens)")
            check(int(tokens.max()) < 2048, f"{name}: every id below the vocabulary")
            check(int(tokens[0]) == eot, f"{name}: starts with <|endoftext|>")
            decoded += [tok.decode(d, skip_special_tokens=False) for d in split_on(tokens, eot)]
    check(len(decoded) == len(docs), f"train + val hold every document once ({len(decoded)} of {len(docs)})")
    check(decoded == expected, "every document round-trips exactly through the byte-level BPE")
    check(meta["documents"]["val"] == round(0.05 * len(docs)), "5% of the documents are validation")
    # The same tokenizer given as a file writes the same shards.
    again = tmp / "again"
    r = prepare(again, "--tokenizer", str(out / "tokenizer.json"), "--doc-separator", "%", FORTUNES)
    check(r.returncode == 0, "prepare_text --tokenizer exits 0")
    same = all((out / n).read_bytes() == (again / n).read_bytes() for n in meta["shards"]["train"] + meta["shards"]["val"])
    check(same, "an existing tokenizer.json gives the same shards byte for byte")
    # Shards split at --shard-tokens.
    small = tmp / "small"
    r = prepare(small, "--tokenizer", str(out), "--doc-separator", "%", "--shard-tokens", "100000", FORTUNES)
    m2 = json.loads((small / "meta.json").read_text())
    total = sum(len(read_shard(small / n)[1]) for n in m2["shards"]["train"])
    check(len(m2["shards"]["train"]) == math.ceil(m2["tokens"]["train"] / 100000) and total == m2["tokens"]["train"],
          f"--shard-tokens 100000 splits {total} tokens into {len(m2['shards']['train'])} shards")
    return out, meta


def test_wordpiece(tmp):
    out = tmp / "wp"
    r = prepare(out, "--train-wordpiece", "3000", "--doc-separator", "%", FORTUNES)
    check(r.returncode == 0, "prepare_text --train-wordpiece exits 0")
    meta = json.loads((out / "meta.json").read_text())
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = {n: tok.token_to_id(n) for n in pt.BERT_SPECIALS}
    data = meta["leantrain_data"]
    check(data["mask_id"] == ids["[MASK]"], f"mask_id is the tokenizer's [MASK] ({ids['[MASK]']})")
    check(data["special_ids"] == sorted(v for k, v in ids.items() if k != "[MASK]"),
          "special_ids are [PAD] [UNK] [CLS] [SEP]")
    _, tokens = read_shard(out / meta["shards"]["train"][0])
    check(int(tokens[0]) == ids["[CLS]"] and int(tokens[-1]) == ids["[SEP]"], "documents are [CLS] ... [SEP]")
    check(int(tokens.max()) < meta["vocab_size"], "every WordPiece id below the vocabulary")
    check(np.count_nonzero(tokens == ids["[CLS]"]) == meta["documents"]["train"], "one [CLS] per training document")


def test_errors(tmp):
    out = tmp / "never"
    r = prepare(out, "--train-bpe", "2048", str(tmp / "missing.txt"))
    check(r.returncode == 2 and "missing.txt" in r.stderr and "does not exist" in r.stderr,
          f"a missing input: exit 2 naming it ({r.stderr.strip()})")
    check(not out.exists(), "a missing input writes nothing")
    r = prepare(out, "--tokenizer", str(tmp / "nope.json"), FORTUNES)
    check(r.returncode == 2 and "nope.json" in r.stderr, "a missing tokenizer: exit 2 naming it")
    r = prepare(out, "--train-bpe", "10", FORTUNES)
    check(r.returncode == 2 and "--train-bpe 10" in r.stderr, "a vocabulary below 260: exit 2")
    check(not out.exists(), "bad arguments write nothing")


def last_step_loss(run):
    losses = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in losses if m.get("event") == "step"][-1]["loss"]


def evals(run):
    return [json.loads(l)["eval_loss"] for l in (run / "metrics.jsonl").read_text().splitlines()
            if '"eval_loss"' in l]


def test_train(tmp, leantrain, shards):
    common = ["--set", f"data.train={shards}/train_*.bin", "--set", f"data.eval={shards}/val_*.bin",
              "--set", "data.vocab_size=2048", "--set", "model.vocab_size=2048", "--set", "model.n_layer=2",
              "--set", "model.d_model=64", "--set", "model.seq_len=64", "--set", "train.global_batch=16",
              "--set", "train.micro_batch=8", "--set", "train.eval_max_batches=4", "--set", "train.warmup_steps=5",
              "--set", "checkpoint.every_steps=20", "--set", "model.dropout=0", "--set", "train.lr=3e-3"]
    cfg = str(ROOT / "configs/gpt_fortunes_bpe.toml")

    def train(out, steps, *extra):
        r = subprocess.run([leantrain, "train", "--config", cfg, "--out", str(out), *common,
                            "--set", f"train.steps={steps}", *extra], capture_output=True, text=True, timeout=600)
        check(r.returncode == 0, f"leantrain train --out {out.name} exits 0 ({r.stderr.strip()[-300:]})")

    full = tmp / "full"
    train(full, 60)
    e = evals(full)
    check(len(e) >= 1 and e[-1] < math.log(2048) - 1.0,
          f"eval loss {e[-1] if e else None:.3f} falls 1 nat below ln(2048) = {math.log(2048):.3f}")
    resumed = tmp / "resumed"
    train(resumed, 60, "--resume", str(full / "checkpoints/step-00000040.h5"))
    a, b = last_step_loss(full), last_step_loss(resumed)
    check(a == b, f"resumed at step 40, step 60's loss equals the uninterrupted run's ({b} vs {a})")


def main():
    leantrain = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory(prefix="prepare_text_") as d:
        tmp = Path(d)
        shards, _ = test_bpe(tmp)
        test_wordpiece(tmp)
        test_errors(tmp)
        if leantrain:
            test_train(tmp, leantrain, shards)
        else:
            print("skip leantrain training (no binary given)")
    if FAILS:
        print(f"{len(FAILS)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
