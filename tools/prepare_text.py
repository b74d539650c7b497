"""Turns text files into token shards that leantrain's `token_shards` data kind reads.

    .venv/bin/python tools/prepare_text.py --out data/fortunes-bpe --train-bpe 4096 \
        --doc-separator % /usr/share/games/fortunes

The tokenizer is one the user names:
  --tokenizer PATH       a Hugging Face `tokenizer.json` (or a directory holding one) the user
                         already has (GPT-2's, BERT's, Llama's, ...);
  --train-bpe N          a byte-level BPE of N tokens trained on the corpus (GPT-2's scheme:
                         every byte is a token, so decode(encode(text)) == text), plus
                         <|endoftext|> as the document separator;
  --train-wordpiece N    a WordPiece of N tokens trained on the corpus (BERT's scheme:
                         lower-cased, [PAD] [UNK] [CLS] [SEP] [MASK]).
Training is offline (Hugging Face `tokenizers`, pinned in requirements.txt).

Documents: each input file is one document, or, with --doc-separator S, a line holding only S
separates documents (fortune files use %). Directories are read recursively in sorted order;
files ending .dat or .u8 (fortune's indexes and links) and hidden files are skipped. The
documents are shuffled with --seed and the first --val-fraction of them form the validation
split, so both splits sample the whole corpus.

Each document is encoded as GPT-2 / llm.c do: the end-of-text token, then the document's tokens
(a tokenizer with a [CLS] ... [SEP] post-processor, such as WordPiece's, adds those instead).

Writes into --out:
  tokenizer.json                  the tokenizer (trained or copied), for decoding;
  train_000000.bin, ...           llm.c shards (256 x int32 header: magic 20240520 with uint16
  val_000000.bin                  tokens when the vocabulary fits 16 bits, else 20240801 with
                                  uint32; version 1 or 7; the token count), at most
                                  --shard-tokens tokens each;
  meta.json                       vocab_size, the special tokens' ids, token and document
                                  counts, and the [data] lines of a leantrain config.
Writing is atomic per file (a temporary name, then rename); a failure leaves no half shard.
Exit codes: 0 written; 2 bad arguments or unreadable input.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np

MAGIC_U16, MAGIC_U32 = 20240520, 20240801   # llm.c's dev/data/data_common.py
VERSION_U16, VERSION_U32 = 1, 7
EOT = "<|endoftext|>"
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


class PrepareError(Exception):
    pass


def input_files(paths: Iterable[str]) -> List[Path]:
    files: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and not f.is_symlink() and not f.name.startswith(".") \
                        and f.suffix not in (".dat", ".u8"):
                    files.append(f)
        elif p.is_file():
            files.append(p)
        else:
            raise PrepareError(f"input '{p}' does not exist")
    if not files:
        raise PrepareError("no input files (directories are read for every file but *.dat, *.u8 and hidden ones)")
    return files


def read_documents(files: List[Path], separator: Optional[str]) -> List[str]:
    docs: List[str] = []
    for f in files:
        try:
            text = f.read_bytes().decode("utf-8", errors="replace")
        except OSError as e:
            raise PrepareError(f"cannot read '{f}': {e.strerror}") from e
        if separator is None:
            parts = [text]
        else:
            parts, cur = [], []
            for line in text.splitlines(keepends=True):
                if line.rstrip("\r\n") == separator:
                    parts.append("".join(cur))
                    cur = []
                else:
                    cur.append(line)
            parts.append("".join(cur))
        docs.extend(d for d in parts if d.strip())
    if not docs:
        raise PrepareError("the input files hold no text")
    return docs


def train_tokenizer(kind: str, vocab_size: int, docs: List[str]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(docs, trainer=trainer)
        return tok
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=BERT_SPECIALS, show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def load_tokenizer(path: str):
    from tokenizers import Tokenizer
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise PrepareError(f"tokenizer '{path}' does not exist (a tokenizer.json, or a directory holding one)")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises its own Exception type
        raise PrepareError(f"cannot read tokenizer '{p}': {e}") from e


def special_ids(tok) -> Dict[str, int]:
    """The ids of the special tokens the tokenizer knows (GPT-2's and BERT's names, and Llama's)."""
    out = {}
    for name in [EOT, "<|begin_of_text|>", "<|end_of_text|>", "<s>", "</s>", "<pad>", "<unk>", "<mask>"] + BERT_SPECIALS:
        i = tok.token_to_id(name)
        if i is not None:
            out[name] = int(i)
    return out


def encode_documents(tok, docs: List[str], batch: int = 1024) -> List[np.ndarray]:
    eot = tok.token_to_id(EOT)
    out = []
    for i in range(0, len(docs), batch):
        for enc in tok.encode_batch(docs[i:i + batch]):
            ids = enc.ids if eot is None else [eot] + enc.ids
            out.append(np.asarray(ids, dtype=np.int64))
    return out


def write_shard(path: Path, tokens: np.ndarray, vocab_size: int) -> None:
    u16 = vocab_size <= 1 << 16
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = (MAGIC_U16, VERSION_U16, len(tokens)) if u16 else (MAGIC_U32, VERSION_U32, len(tokens))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16 if u16 else np.uint32).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_split(out: Path, name: str, docs: List[np.ndarray], shard_tokens: int, vocab_size: int) -> List[str]:
    tokens = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64)
    paths = []
    for k, begin in enumerate(range(0, max(len(tokens), 1), shard_tokens)):
        chunk = tokens[begin:begin + shard_tokens]
        if len(chunk) == 0:
            break
        p = out / f"{name}_{k:06d}.bin"
        write_shard(p, chunk, vocab_size)
        paths.append(p.name)
    return paths


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/prepare_text.py", description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="text files or directories")
    ap.add_argument("--out", required=True, help="output directory (created)")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokenizer", help="a Hugging Face tokenizer.json, or a directory holding one")
    g.add_argument("--train-bpe", type=int, metavar="N", help="train a byte-level BPE of N tokens")
    g.add_argument("--train-wordpiece", type=int, metavar="N", help="train a WordPiece of N tokens")
    ap.add_argument("--doc-separator", help="a line holding only this string separates documents (fortunes: %%)")
    ap.add_argument("--val-fraction", type=float, default=0.05, help="share of the documents for validation (0.05)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard at most (llm.c: 1e8)")
    ap.add_argument("--seed", type=int, default=1234, help="shuffles the documents before the split")
    a = ap.parse_args(argv)
    try:
        for n, flag in ((a.train_bpe, "--train-bpe"), (a.train_wordpiece, "--train-wordpiece")):
            if n is not None and not 260 <= n <= 1 << 20:
                raise PrepareError(f"{flag} {n}: the vocabulary must hold 260 to 2^20 tokens")
        if not 0.0 <= a.val_fraction < 1.0:
            raise PrepareError(f"--val-fraction {a.val_fraction} must be in [0, 1)")
        if a.shard_tokens < 1:
            raise PrepareError("--shard-tokens must be at least 1")
        docs = read_documents(input_files(a.inputs), a.doc_separator)
        if a.tokenizer:
            tok = load_tokenizer(a.tokenizer)
        else:
            tok = train_tokenizer("bpe" if a.train_bpe else "wordpiece", a.train_bpe or a.train_wordpiece, docs)
        out = Path(a.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PrepareError(f"cannot create --out '{out}': {e.strerror}") from e
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    vocab = tok.get_vocab_size(with_added_tokens=True)
    order = list(range(len(docs)))
    random.Random(a.seed).shuffle(order)
    n_val = int(round(a.val_fraction * len(docs)))
    if a.val_fraction > 0 and n_val == 0:
        n_val = 1
    encoded = encode_documents(tok, [docs[i] for i in order])
    val, train = encoded[:n_val], encoded[n_val:]
    train_files = write_split(out, "train", train, a.shard_tokens, vocab)
    val_files = write_split(out, "val", val, a.shard_tokens, vocab)
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    os.replace(tmp, out / "tokenizer.json")

    specials = special_ids(tok)
    data = {"kind": "token_shards", "train": str(out / "train_*.bin"), "vocab_size": vocab}
    if val_files:
        data["eval"] = str(out / "val_*.bin")
    if "[MASK]" in specials:
        data["mask_id"] = specials["[MASK]"]
        data["special_ids"] = sorted(v for k, v in specials.items() if k != "[MASK]")
    meta = {
        "tokenizer": "tokenizer.json",
        "vocab_size": vocab,
        "special_tokens": specials,
        "documents": {"train": len(train), "val": len(val)},
        "tokens": {"train": int(sum(len(d) for d in train)), "val": int(sum(len(d) for d in val))},
        "shards": {"train": train_files, "val": val_files},
        "format": "llm.c",
        "dtype": "uint16" if vocab <= 1 << 16 else "uint32",
        "leantrain_data": data,
    }
    (out / "meta.json.tmp").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(out / "meta.json.tmp", out / "meta.json")
    toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in data.items())
    print(f"prepare_text: {len(docs)} documents, vocabulary {vocab}; train {meta['tokens']['train']} tokens "
          f"in {len(train_files)} shard(s), val {meta['tokens']['val']} tokens in {len(val_files)}; wrote {out}")
    print(f"[data]\n{toml}\n(model.vocab_size must be at least {vocab})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
