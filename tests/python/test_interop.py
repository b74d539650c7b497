#!/usr/bin/env python3
"""Pretrained weights in and out, against the libraries themselves, with no download.

For each of GPT-2 (transformers GPT2LMHeadModel), BERT (BertForMaskedLM) and ResNet-50
(torchvision), a small model is built from a config with random weights (every parameter
perturbed, BatchNorm running statistics randomised), saved as that library saves it, and
loaded by leantrain as `train --init-from` loads it (leantrain_dump_outputs --model JSON
--init-from PATH, tests/tools/dump_outputs.cpp, which runs the same trainers::init_model).
leantrain's fp32 eval-mode logits must equal the library's within REL_TOL (max|a-b| /
max|b|). Then `leantrain export --format hf` writes the weights back; transformers'
from_pretrained / torchvision's load_state_dict(strict) must open them and give the same
logits again. Also: sharded Hugging Face directories, BERT's legacy (gamma/beta) key set of
the original BERT-base checkpoints, GPT-2 position rows cropped to a shorter seq_len, a
torchvision head of another size (refused, then skipped with --init-skip-mismatched),
`--format safetensors` round trips bitwise, `leantrain train --init-from` a Hugging Face
directory, and an unwritable --out.

    .venv/bin/python tests/python/test_interop.py build/bin/leantrain build/bin/leantrain_dump_outputs
Exit codes: 0 pass, 1 fail, 77 skipped (binaries or transformers/torchvision missing)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = 77
REL_TOL = 1e-5  # the bound on fp32 logits

try:
    import h5py
    import torch
    import torchvision
    import transformers
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from transformers import (AutoModelForCausalLM, AutoModelForMaskedLM, BertConfig, BertForMaskedLM,
                              BertForPreTraining, GPT2Config, GPT2LMHeadModel)
except ImportError as e:  # pragma: no cover
    print(f"test_interop: skipped ({e})")
    sys.exit(SKIP)

transformers.logging.set_verbosity_error()
torch.set_num_threads(1)

FAILURES: list[str] = []
RESULTS: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def run(cmd: list[str], expect_rc: int = 0) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != expect_rc:
        print(f"command {cmd} exited {r.returncode}, expected {expect_rc}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Every parameter moved off its initialisation (biases, LayerNorm, BatchNorm too)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.num_batches_tracked.fill_(123)


class Cpp:
    def __init__(self, leantrain: str, dump: str, tmp: str):
        self.leantrain, self.dump, self.tmp = leantrain, dump, tmp

    def load(self, model_cfg: dict, source: str, name: str, extra=(), expect_rc=0, batch=2):
        """leantrain's logits of `source` loaded into `model_cfg`: (input, output, stdout+stderr)."""
        io = os.path.join(self.tmp, name + "_io.h5")
        ckpt = os.path.join(self.tmp, name + ".h5")
        r = run([self.dump, "--model", json.dumps(model_cfg), "--init-from", source, io, "--batch", str(batch),
                 "--save-checkpoint", ckpt, *extra], expect_rc)
        if r.returncode != 0:
            return None, None, r.stdout + r.stderr
        with h5py.File(io, "r") as f:
            return torch.from_numpy(f["input"][()]), torch.from_numpy(f["output"][()]), r.stdout + r.stderr

    def export(self, name: str, fmt: str, expect_rc=0) -> tuple[str, subprocess.CompletedProcess]:
        out = os.path.join(self.tmp, f"{name}_{fmt}")
        r = run([self.leantrain, "export", os.path.join(self.tmp, name + ".h5"), "--format", fmt, "--out", out],
                expect_rc)
        return out, r


def test_gpt2(cpp: Cpp) -> None:
    torch.manual_seed(1)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=300, n_positions=64,
                                    bos_token_id=None, eos_token_id=None)).eval()
    perturb(hf, 1)
    d = os.path.join(cpp.tmp, "gpt2_hf")
    hf.save_pretrained(d)
    # seq_len 32 < n_positions 64: the first 32 position rows (crop_block_size).
    cfg = {"kind": "gpt", "vocab_size": 300, "seq_len": 32, "n_layer": 2, "n_head": 4, "d_model": 64}
    x, y, log = cpp.load(cfg, d, "gpt2")
    check(y is not None, "gpt2: leantrain loads a GPT2LMHeadModel directory")
    if y is None:
        return
    check("took the first 32 of 64 position rows" in log, "gpt2: the position rows cropped to seq_len, logged")
    with torch.no_grad():
        ref = hf(x).logits
    r = rel_diff(y, ref)
    RESULTS.append(f"gpt2 in: max rel diff {r:.2e}")
    check(r <= REL_TOL, f"gpt2: leantrain logits = transformers' (max rel diff {r:.2e} <= {REL_TOL})")

    # The same weights in shards (model.safetensors.index.json): the same logits, bitwise.
    ds = os.path.join(cpp.tmp, "gpt2_sharded")
    hf.save_pretrained(ds, max_shard_size="60KB")
    shards = [f for f in os.listdir(ds) if f.endswith(".safetensors")]
    check(os.path.exists(os.path.join(ds, "model.safetensors.index.json")) and len(shards) > 1,
          f"gpt2: save_pretrained wrote {len(shards)} shards and an index")
    _, ys, _ = cpp.load(cfg, ds, "gpt2_sharded")
    check(ys is not None and torch.equal(ys, y), "gpt2: a sharded directory gives the same logits bitwise")

    out, r_exp = cpp.export("gpt2", "hf")
    check(r_exp.returncode == 0, "gpt2: leantrain export --format hf")
    back = AutoModelForCausalLM.from_pretrained(out).eval()
    check(type(back).__name__ == "GPT2LMHeadModel", f"gpt2: from_pretrained opens it as {type(back).__name__}")
    with torch.no_grad():
        ref2 = back(x).logits
    r2 = rel_diff(ref2, y)
    RESULTS.append(f"gpt2 out: max rel diff {r2:.2e}")
    check(r2 <= REL_TOL, f"gpt2: exported, from_pretrained's logits = leantrain's (max rel diff {r2:.2e})")
    check(back.transformer.wpe.weight.shape[0] == 32 and back.config.n_positions == 32,
          "gpt2: the export's n_positions is the model's seq_len")

    # --format safetensors: leantrain's names and the model config, read back bitwise.
    out_st, r_st = cpp.export("gpt2", "safetensors")
    st = os.path.join(out_st, "model.safetensors")
    with safe_open(st, "pt") as f:
        meta, keys = f.metadata(), set(f.keys())
    check(json.loads(meta["leantrain.model_config"])["n_layer"] == 2 and meta["leantrain.kind"] == "gpt"
          and "blocks.0.attn.qkv.weight" in keys, "gpt2: --format safetensors keeps leantrain's names and the config")
    _, y3, _ = cpp.load(cfg, st, "gpt2_st")
    check(y3 is not None and torch.equal(y3, y), "gpt2: --init-from the exported safetensors gives the same logits bitwise")

    # The real command: train --init-from a Hugging Face directory.
    conf = os.path.join(cpp.tmp, "gpt_tiny.toml")
    with open(conf, "w") as f:
        f.write('[model]\nkind = "gpt"\nvocab_size = 300\nseq_len = 32\nn_layer = 2\nn_head = 4\nd_model = 64\n'
                '[data]\nkind = "synthetic"\nsynthetic_samples = 64\n'
                '[train]\nglobal_batch = 4\nmicro_batch = 4\nsteps = 1\neval_batch = 4\neval_max_batches = 1\n')
    r_train = run([cpp.leantrain, "train", "--config", conf, "--out", os.path.join(cpp.tmp, "run_gpt"),
                   "--init-from", d])
    check(r_train.returncode == 0 and "initialised 28 tensors from " + d + " (Hugging Face GPT2LMHeadModel)"
          in r_train.stderr, "gpt2: leantrain train --init-from DIR loads all 28 tensors")
    # Another shape in config.json: each disagreement named, exit 2, nothing trained.
    r_bad = run([cpp.leantrain, "train", "--config", conf, "--out", os.path.join(cpp.tmp, "run_gpt_bad"),
                 "--init-from", d, "--set", "model.n_layer=3"], 2)
    check(r_bad.returncode == 2 and "n_layer = 2, but model.n_layer = 3" in r_bad.stderr,
          "gpt2: a config.json disagreeing with the model is refused, naming the key")

    # An --out that cannot be made: exit 4, nothing written.
    blocker = os.path.join(cpp.tmp, "a_file")
    open(blocker, "w").close()
    r_unw = run([cpp.leantrain, "export", os.path.join(cpp.tmp, "gpt2.h5"), "--format", "hf", "--out",
                 os.path.join(blocker, "sub")], 4)
    check(r_unw.returncode == 4 and "nothing written" in r_unw.stderr and "a_file/sub" in r_unw.stderr,
          "export: an unwritable --out is a storage error naming it")


def test_bert(cpp: Cpp) -> None:
    torch.manual_seed(2)
    bc = BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128, vocab_size=300,
                    max_position_embeddings=64)
    hf = BertForMaskedLM(bc).eval()
    perturb(hf, 2)
    d = os.path.join(cpp.tmp, "bert_hf")
    hf.save_pretrained(d)
    cfg = {"kind": "bert", "vocab_size": 300, "seq_len": 32, "n_layer": 2, "n_head": 4, "d_model": 64, "d_ff": 128}
    x, y, _ = cpp.load(cfg, d, "bert")
    check(y is not None, "bert: leantrain loads a BertForMaskedLM directory")
    if y is None:
        return
    with torch.no_grad():
        ref = hf(x).logits  # no token_type_ids (type 0), no attention mask (all ones): as leantrain
    r = rel_diff(y, ref)
    RESULTS.append(f"bert in: max rel diff {r:.2e}")
    check(r <= REL_TOL, f"bert: leantrain logits = transformers' (max rel diff {r:.2e})")

    out, r_exp = cpp.export("bert", "hf")
    check(r_exp.returncode == 0, "bert: leantrain export --format hf")
    back = AutoModelForMaskedLM.from_pretrained(out).eval()
    check(type(back).__name__ == "BertForMaskedLM", f"bert: from_pretrained opens it as {type(back).__name__}")
    with torch.no_grad():
        ref2 = back(x).logits
    r2 = rel_diff(ref2, y)
    RESULTS.append(f"bert out: max rel diff {r2:.2e}")
    check(r2 <= REL_TOL, f"bert: exported, from_pretrained's logits = leantrain's (max rel diff {r2:.2e})")


def test_bert_legacy(cpp: Cpp) -> None:
    """The key set of the original BERT-base checkpoints: BertForPreTraining (pooler, next-sentence
    head, explicit tied decoder), position_ids, LayerNorm gamma/beta; 12 layers (small widths)."""
    torch.manual_seed(3)
    bc = BertConfig(num_hidden_layers=12, num_attention_heads=2, hidden_size=32, intermediate_size=64, vocab_size=200,
                    max_position_embeddings=512, architectures=["BertForMaskedLM"])
    pre = BertForPreTraining(bc).eval()
    perturb(pre, 3)
    sd = {}
    for k, v in pre.state_dict().items():
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        sd[k] = v.clone().contiguous()
    sd["bert.embeddings.position_ids"] = torch.arange(512).unsqueeze(0)
    check("cls.predictions.decoder.weight" in sd and "bert.pooler.dense.weight" in sd and
          "cls.seq_relationship.weight" in sd and "bert.encoder.layer.11.output.LayerNorm.gamma" in sd,
          f"bert legacy: the BERT-base key set ({len(sd)} tensors, gamma/beta, pooler, NSP head, position_ids)")
    d = os.path.join(cpp.tmp, "bert_legacy")
    os.makedirs(d)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(bc.to_json_string())
    cfg = {"kind": "bert", "vocab_size": 200, "seq_len": 128, "n_layer": 12, "n_head": 2, "d_model": 32, "d_ff": 64}
    x, y, log = cpp.load(cfg, d, "bert_legacy")
    check(y is not None and "ignored" in log, "bert legacy: loaded, the pooler / NSP head / position_ids ignored")
    if y is None:
        return
    mlm = BertForMaskedLM(bc).eval()
    missing, unexpected = mlm.load_state_dict(pre.state_dict(), strict=False)
    check(not missing, f"bert legacy: the reference BertForMaskedLM gets every weight (missing {missing})")
    with torch.no_grad():
        ref = mlm(x).logits
    r = rel_diff(y, ref)
    RESULTS.append(f"bert legacy (12 layers) in: max rel diff {r:.2e}")
    check(r <= REL_TOL, f"bert legacy: leantrain logits = transformers' (max rel diff {r:.2e})")


def test_resnet(cpp: Cpp) -> None:
    torch.manual_seed(4)
    tv = torchvision.models.resnet50(num_classes=10).eval()
    perturb(tv, 4)
    pth = os.path.join(cpp.tmp, "resnet50.pth")
    st = os.path.join(cpp.tmp, "resnet50.safetensors")
    torch.save(tv.state_dict(), pth)
    conv = run([sys.executable, os.path.join(ROOT, "tools", "torchvision_to_safetensors.py"), pth, st])
    check(conv.returncode == 0 and "320 tensors" in conv.stdout, "resnet: torchvision_to_safetensors.py converts the .pth")
    cfg = {"kind": "resnet", "depth": 50, "num_classes": 10, "in_channels": 3, "image_size": 64}
    x, y, _ = cpp.load(cfg, st, "resnet50")
    check(y is not None, "resnet: leantrain loads a torchvision resnet50 state dict")
    if y is None:
        return
    with torch.no_grad():
        ref = tv(x)
    r = rel_diff(y, ref)
    RESULTS.append(f"resnet50 in: max rel diff {r:.2e}")
    check(r <= REL_TOL, f"resnet: leantrain logits = torchvision's (max rel diff {r:.2e})")

    out, r_exp = cpp.export("resnet50", "hf")
    check(r_exp.returncode == 0 and not os.path.exists(os.path.join(out, "config.json")),
          "resnet: leantrain export --format hf writes a torchvision state dict")
    back = torchvision.models.resnet50(num_classes=10)
    back.load_state_dict(load_file(os.path.join(out, "model.safetensors")), strict=True)
    back.eval()
    check(int(back.bn1.num_batches_tracked) == 123, "resnet: running statistics and num_batches_tracked come back")
    with torch.no_grad():
        ref2 = back(x)
    r2 = rel_diff(ref2, y)
    RESULTS.append(f"resnet50 out: max rel diff {r2:.2e}")
    check(r2 <= REL_TOL, f"resnet: exported, torchvision's logits = leantrain's (max rel diff {r2:.2e})")

    # A new head: a 1000-class torchvision resnet18 into 10 classes.
    tv18 = torchvision.models.resnet18(num_classes=1000).eval()
    st18 = os.path.join(cpp.tmp, "resnet18.safetensors")
    save_file({k: v.contiguous() for k, v in tv18.state_dict().items()}, st18)
    cfg18 = {"kind": "resnet", "depth": 18, "num_classes": 10, "in_channels": 3, "image_size": 32}
    _, y_bad, log_bad = cpp.load(cfg18, st18, "resnet18_bad", expect_rc=2)
    check(y_bad is None and "fc.weight: shape [1000, 512] in the checkpoint, [10, 512] in the model" in log_bad
          and "fc.bias: shape [1000]" in log_bad, "resnet: another head's shapes are listed and refused")
    _, y_skip, log_skip = cpp.load(cfg18, st18, "resnet18_skip", extra=["--init-skip-mismatched"])
    check(y_skip is not None and "skipped: fc.weight" in log_skip and "loaded 120 tensors" in log_skip,
          "resnet: --init-skip-mismatched loads all but the new head")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not all(os.path.exists(p) for p in argv[1:3]):
        print("test_interop: skipped (give the leantrain and leantrain_dump_outputs binaries)")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="lt_interop_") as tmp:
        cpp = Cpp(argv[1], argv[2], tmp)
        for t in (test_gpt2, test_bert, test_bert_legacy, test_resnet):
            try:
                t(cpp)
            except Exception as e:  # noqa: BLE001 - a crash is a failure of that part
                import traceback
                traceback.print_exc()
                check(False, f"{t.__name__} raised {type(e).__name__}: {e}")
    print("\n".join(RESULTS))
    if FAILURES:
        print(f"test_interop: {len(FAILURES)} failure(s)")
        return 1
    print("test_interop: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
