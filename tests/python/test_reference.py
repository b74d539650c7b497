#!/usr/bin/env python3
"""Tests of tools/leantrain_py that need no C++ build: the reference models' parameter counts
and names (against the numbers and names the C++ models document and report), their forward
semantics, and the checkpoint reader on fake checkpoints written here with h5py in the
documented layout (crc32 attributes, corruption, too-new format), plus the two command-line
tools.

Run with the project's virtualenv (unittest; pytest is not installed there):
    .venv/bin/python tests/python/test_reference.py
(CTest runs it as `python_reference`.)"""
from __future__ import annotations

import io
import json
import math
import os
import runpy
import subprocess
import sys
import tempfile
import tomllib
import unittest
import warnings
import zlib
from collections import OrderedDict
from contextlib import redirect_stderr, redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from leantrain_py import check_outputs, export  # noqa: E402
from leantrain_py.checkpoint import (CheckpointError, crc32_of, load_checkpoint,  # noqa: E402
                                     load_into_reference)
from leantrain_py.reference_models import (ModelConfigError, build_model,  # noqa: E402
                                           count_parameters)

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny models; and CTest may run this next to a build

# The C++ test helpers' configs (tests/unit/test_models.cpp): gpt_cfg / resnet_cfg / tiny_*.
GPT2_SMALL = dict(kind="gpt", vocab_size=50257, seq_len=1024, n_layer=12, n_head=12, d_model=768)
BERT_BASE = dict(kind="bert", vocab_size=30522, seq_len=512, n_layer=12, n_head=12, d_model=768,
                 type_vocab_size=2)


def resnet_cfg(depth):
    return dict(kind="resnet", depth=depth, in_channels=3, num_classes=1000, width=64,
                stem="imagenet", image_size=224)


TINY_GPT = dict(kind="gpt", vocab_size=37, seq_len=16, n_layer=3, n_head=2, d_model=32)
TINY_BERT = dict(kind="bert", vocab_size=41, seq_len=16, n_layer=2, n_head=4, d_model=32)
TINY_RESNET = dict(kind="resnet", depth=0, layers=[1, 2], block="basic", width=8, stem="small",
                   in_channels=1, num_classes=10, image_size=12)
TINY_BOTTLENECK = dict(kind="resnet", depth=0, layers=[1, 1], block="bottleneck", width=4,
                       stem="imagenet", in_channels=3, num_classes=5, image_size=32)
TINY_MLP = dict(kind="mlp", in_channels=1, image_size=6, hidden=[16, 8], num_classes=4)


def randomize_bn_stats(model):
    """Non-trivial running statistics so eval-mode BatchNorm is actually exercised."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.num_batches_tracked.fill_(7)


def sample_input(cfg, batch=2):
    if cfg["kind"] in ("gpt", "bert"):
        return torch.randint(cfg["vocab_size"], (batch, cfg["seq_len"]), dtype=torch.int64)
    return torch.randn(batch, cfg["in_channels"], cfg["image_size"], cfg["image_size"])


def fixed_string(attrs, name, text):
    """As the C++ write_attr: a scalar fixed-length UTF-8 string of exactly len(text) bytes
    (one NUL byte for "")."""
    data = text.encode() or b"\0"
    attrs.create(name, np.bytes_(data), dtype=h5py.string_dtype("utf-8", len(data)))


def write_fake_checkpoint(path, model_cfg, state_dict, *, format_version=1, step=42, configs=True):
    """A checkpoint in the documented layout (checkpoint.h), as the C++ writer
    (checkpoint_io/src/checkpoint.cpp) makes it: HDF5 latest format, fixed-length string and
    int64 / float64 attributes, one dataset per tensor directly under /model with a uint32 crc32
    attribute (0-d tensors as scalar datasets), optimizer state under /optimizer/<param>/.
    configs=False writes the config attributes empty, as C++ does for a config it lacks."""
    full = {"model": model_cfg, "train": {"optimizer": "adamw", "lr": 0.001}}
    with h5py.File(path, "w", libver="latest") as f:
        a = f.attrs
        fixed_string(a, "format", "leantrain-checkpoint")
        a["format_version"] = np.int64(format_version)
        for key, v in (("step", step), ("epoch", 1), ("samples_seen", 4096), ("world_size", 1),
                       ("global_batch", 8), ("micro_batch", 4), ("accumulation", 2)):
            a[key] = np.int64(v)
        fixed_string(a, "precision", "fp32")
        fixed_string(a, "model_config", json.dumps(model_cfg) if configs else "")
        if configs:
            a["train_config"] = json.dumps(full["train"])  # variable-length: read as well
        else:
            fixed_string(a, "train_config", "")
        fixed_string(a, "config", json.dumps(full) if configs else "")
        fixed_string(a, "leantrain_version", "0.1.0")
        fixed_string(a, "libtorch_version", torch.__version__)
        model = f.create_group("model")
        for name, t in state_dict.items():
            arr = t.detach().cpu().numpy()
            ds = model.create_dataset(name, data=arr)
            ds.attrs["crc32"] = np.uint32(zlib.crc32(np.ascontiguousarray(arr).tobytes()))
        opt = f.create_group("optimizer")
        fixed_string(opt.attrs, "kind", "adamw")
        opt.attrs["lr"] = 0.001
        for name, t in list(state_dict.items())[:2]:
            g = opt.create_group(name)
            for state, arr in (("exp_avg", np.full(t.shape, 0.5, np.float32)),
                               ("step", np.array(3.0, np.float32))):  # a 0-d dataset
                ds = g.create_dataset(state, data=arr)
                ds.attrs["crc32"] = np.uint32(zlib.crc32(np.ascontiguousarray(arr).tobytes()))
        f.create_group("scaler").attrs["scale"] = 1.0
        d = f.create_group("data")
        d.attrs["seed"] = np.int64(1234)
        d.attrs["position"] = np.int64(8)


def run_main(fn, argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = fn(argv)
    return code, out.getvalue(), err.getvalue()


def count_llama(model_cfg: dict) -> int:
    """Parameters of a [model] kind = "llama" section, counted on transformers' own model (meta
    device), with leantrain's defaults for what the section leaves out (llama.h)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    heads = model_cfg["num_attention_heads"]
    kw = dict(vocab_size=model_cfg["vocab_size"], hidden_size=model_cfg["hidden_size"],
              intermediate_size=model_cfg["intermediate_size"],
              num_hidden_layers=model_cfg["num_hidden_layers"], num_attention_heads=heads,
              num_key_value_heads=model_cfg.get("num_key_value_heads", 0) or heads,
              head_dim=model_cfg.get("head_dim", 0) or model_cfg["hidden_size"] // heads,
              tie_word_embeddings=model_cfg.get("tie_word_embeddings", False),
              attention_bias=model_cfg.get("attention_bias", False))
    config, cls = (Qwen3Config, Qwen3ForCausalLM) if model_cfg.get("qk_norm") else (LlamaConfig, LlamaForCausalLM)
    with torch.device("meta"):
        m = cls(config(**kw))
    return sum(p.numel() for p in m.parameters())


class ParameterCounts(unittest.TestCase):
    """The counts the C++ side reports (tests/unit/test_models.cpp) for the same configs."""

    def count(self, cfg):
        m = build_model(cfg, device="meta")
        return count_parameters(m), m

    def test_gpt2_small(self):
        n, m = self.count(GPT2_SMALL)
        self.assertEqual(n, 124_439_808)
        self.assertEqual(len(m.blocks), 12)

    def test_bert_base(self):
        n, m = self.count(BERT_BASE)
        self.assertEqual(n, 109_514_298)
        self.assertEqual(len(m.blocks), 12)

    def test_resnets(self):
        # 18 and 50 as the C++ test; 34/101/152 are torchvision's counts for the same layout.
        want = {18: (11_689_512, 8), 34: (21_797_672, 16), 50: (25_557_032, 16),
                101: (44_549_160, 33), 152: (60_192_808, 50)}
        for depth, (n_params, n_blocks) in want.items():
            n, m = self.count(resnet_cfg(depth))
            self.assertEqual(n, n_params, f"ResNet-{depth}")
            self.assertEqual(len(m.blocks), n_blocks, f"ResNet-{depth}")

    def test_shipped_configs(self):
        # Every configs/*.toml [model] section builds; the big ones have the counts above.
        want = {"gpt2_small.toml": 124_439_808, "bert_base.toml": 109_514_298,
                "resnet50.toml": 25_557_032, "resnet101.toml": 44_549_160,
                # SmolLM2-135M (134,515,008) with the shards' 4096-token vocabulary for its 49152.
                "smollm2_135m.toml": 134_515_008 - (49152 - 4096) * 576}
        cfg_dir = os.path.join(ROOT, "configs")
        seen = set()
        for name in sorted(os.listdir(cfg_dir)):
            if not name.endswith(".toml"):
                continue
            with open(os.path.join(cfg_dir, name), "rb") as fh:
                model_cfg = tomllib.load(fh).get("model", {})
            if model_cfg.get("kind") == "llama":
                # The llama kind's reference is transformers itself (python_llama_interop checks
                # names, shapes and logits against it); a fine-tuning config takes its shape from
                # --init-from's config.json and has none to count here.
                if "hidden_size" in model_cfg:
                    n = count_llama(model_cfg)
                    if name in want:
                        self.assertEqual(n, want[name], name)
                        seen.add(name)
                continue
            n, _ = self.count(model_cfg)
            if name in want:
                self.assertEqual(n, want[name], name)
                seen.add(name)
        self.assertEqual(seen, set(want))


class Names(unittest.TestCase):
    """state_dict keys equal the names documented in models/include/leantrain/models/*.h."""

    def test_gpt(self):
        names = list(build_model(TINY_GPT, device="meta").state_dict())
        want = ["wte.weight", "wpe.weight"]
        for i in range(3):
            p = f"blocks.{i}."
            want += [p + "ln1.weight", p + "ln1.bias", p + "attn.qkv.weight", p + "attn.qkv.bias",
                     p + "attn.proj.weight", p + "attn.proj.bias", p + "ln2.weight", p + "ln2.bias",
                     p + "mlp.fc.weight", p + "mlp.fc.bias", p + "mlp.proj.weight", p + "mlp.proj.bias"]
        want += ["ln_f.weight", "ln_f.bias"]
        self.assertEqual(names, want)

    def test_bert(self):
        m = build_model(TINY_BERT, device="meta")
        names = list(m.state_dict())
        want = ["tok_emb.weight", "pos_emb.weight", "type_emb.weight", "emb_ln.weight", "emb_ln.bias"]
        for i in range(2):
            p = f"blocks.{i}."
            want += [p + "attn.qkv.weight", p + "attn.qkv.bias", p + "attn.proj.weight",
                     p + "attn.proj.bias", p + "ln1.weight", p + "ln1.bias", p + "mlp.fc.weight",
                     p + "mlp.fc.bias", p + "mlp.proj.weight", p + "mlp.proj.bias", p + "ln2.weight",
                     p + "ln2.bias"]
        want += ["mlm.bias", "mlm.dense.weight", "mlm.dense.bias", "mlm.ln.weight", "mlm.ln.bias"]
        self.assertEqual(names, want)
        self.assertEqual(list(m.buffers()), [])
        self.assertEqual(m.blocks[0].ln1.eps, 1e-12)

    def test_resnet_buffers(self):
        m = build_model(TINY_RESNET)
        sd = m.state_dict()
        self.assertIn("blocks.1.down.conv.weight", sd)
        self.assertNotIn("blocks.0.down.conv.weight", sd)  # identity shortcut
        self.assertNotIn("blocks.2.down.conv.weight", sd)
        for bn in ("stem.bn", "blocks.0.bn1", "blocks.1.down.bn"):
            self.assertEqual(sd[bn + ".running_mean"].dtype, torch.float32)
            self.assertEqual(sd[bn + ".running_var"].dtype, torch.float32)
            t = sd[bn + ".num_batches_tracked"]
            self.assertEqual((t.dtype, t.dim()), (torch.int64, 0))
        self.assertEqual(list(sd)[:3], ["stem.conv.weight", "stem.bn.weight", "stem.bn.bias"])
        self.assertEqual(list(sd)[-2:], ["fc.weight", "fc.bias"])
        self.assertFalse(any(k.endswith("conv.bias") or ".conv1.bias" in k for k in sd))
        self.assertEqual(tuple(sd["stem.conv.weight"].shape), (8, 1, 3, 3))
        b = build_model(TINY_BOTTLENECK, device="meta").state_dict()
        self.assertEqual(tuple(b["stem.conv.weight"].shape), (4, 3, 7, 7))
        self.assertEqual(tuple(b["blocks.0.conv3.weight"].shape), (16, 4, 1, 1))
        self.assertEqual(tuple(b["blocks.0.down.conv.weight"].shape), (16, 4, 1, 1))
        self.assertEqual(tuple(b["blocks.1.conv2.weight"].shape), (8, 8, 3, 3))
        self.assertEqual(tuple(b["fc.weight"].shape), (5, 32))

    def test_mlp(self):
        names = list(build_model(TINY_MLP, device="meta").state_dict())
        self.assertEqual(names, ["blocks.0.fc.weight", "blocks.0.fc.bias", "blocks.1.fc.weight",
                                 "blocks.1.fc.bias", "head.weight", "head.bias"])
        names = list(build_model(dict(TINY_MLP, hidden=[]), device="meta").state_dict())
        self.assertEqual(names, ["head.weight", "head.bias"])

    def test_config_errors(self):
        for bad, key in ((dict(TINY_GPT, n_head=3), "model.n_head"),
                         (dict(TINY_GPT, colour=1), "model.colour"),
                         (dict(kind="resnet", depth=19), "model.depth"),
                         (dict(kind="resnet", depth=18, layers=[1]), "model.layers"),
                         (dict(kind="resnet", stem="big"), "model.stem"),
                         (dict(TINY_GPT, attention="flash"), "model.attention"),
                         (dict(kind="transformer"), "model.kind")):
            with self.assertRaises(ModelConfigError) as cm:
                build_model(bad, device="meta")
            self.assertIn(key, str(cm.exception))


def functional_gpt(m, ids, n_head):
    """GPT forward written independently from gpt.h's documentation (fused SDPA, F.layer_norm),
    to check the module's wiring."""
    d = m.wte.weight.size(1)
    t = ids.size(1)
    x = m.wte.weight[ids] + m.wpe.weight[:t]
    for blk in m.blocks:
        h = F.layer_norm(x, (d,), blk.ln1.weight, blk.ln1.bias, 1e-5)
        q, k, v = F.linear(h, blk.attn.qkv.weight, blk.attn.qkv.bias).chunk(3, -1)
        q, k, v = (z.unflatten(-1, (n_head, d // n_head)).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        x = x + F.linear(y, blk.attn.proj.weight, blk.attn.proj.bias)
        h = F.layer_norm(x, (d,), blk.ln2.weight, blk.ln2.bias, 1e-5)
        h = F.linear(h, blk.mlp.fc.weight, blk.mlp.fc.bias)
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
        x = x + F.linear(h, blk.mlp.proj.weight, blk.mlp.proj.bias)
    x = F.layer_norm(x, (d,), m.ln_f.weight, m.ln_f.bias, 1e-5)
    return x @ m.wte.weight.T


def functional_bert(m, ids, n_head):
    """BERT forward written independently from bert.h's documentation."""
    d = m.tok_emb.weight.size(1)
    t = ids.size(1)
    x = m.tok_emb.weight[ids] + m.pos_emb.weight[:t] + m.type_emb.weight[0]
    x = F.layer_norm(x, (d,), m.emb_ln.weight, m.emb_ln.bias, 1e-12)
    for blk in m.blocks:
        q, k, v = F.linear(x, blk.attn.qkv.weight, blk.attn.qkv.bias).chunk(3, -1)
        q, k, v = (z.unflatten(-1, (n_head, d // n_head)).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        x = F.layer_norm(x + F.linear(y, blk.attn.proj.weight, blk.attn.proj.bias), (d,),
                         blk.ln1.weight, blk.ln1.bias, 1e-12)
        h = F.linear(x, blk.mlp.fc.weight, blk.mlp.fc.bias)
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
        x = F.layer_norm(x + F.linear(h, blk.mlp.proj.weight, blk.mlp.proj.bias), (d,),
                         blk.ln2.weight, blk.ln2.bias, 1e-12)
    h = F.linear(x, m.mlm.dense.weight, m.mlm.dense.bias)
    h = F.layer_norm(0.5 * h * (1 + torch.erf(h / math.sqrt(2))), (d,), m.mlm.ln.weight, m.mlm.ln.bias, 1e-12)
    return h @ m.tok_emb.weight.T + m.mlm.bias


class Forward(unittest.TestCase):
    def perturbed(self, cfg):
        """A model whose biases and norms are not at their init values (so the test sees them)."""
        m = build_model(cfg)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        return m.eval()

    def test_gpt_matches_documented_math(self):
        m = self.perturbed(dict(TINY_GPT, dropout=0.1))
        ids = sample_input(TINY_GPT)
        with torch.no_grad():
            y = m(ids)
            self.assertEqual(tuple(y.shape), (2, 16, 37))
            torch.testing.assert_close(y, functional_gpt(m, ids, 2), atol=1e-5, rtol=1e-5)
            self.assertEqual(tuple(m(ids[:, :5]).shape), (2, 5, 37))  # shorter than seq_len

    def test_gpt_is_causal(self):
        m = self.perturbed(TINY_GPT)
        ids = sample_input(TINY_GPT)
        ids2 = ids.clone()
        ids2[:, 10:] = (ids2[:, 10:] + 1) % 37
        with torch.no_grad():
            a, b = m(ids), m(ids2)
        torch.testing.assert_close(a[:, :10], b[:, :10], atol=0, rtol=0)
        self.assertGreater((a[:, 10:] - b[:, 10:]).abs().max().item(), 1e-4)

    def test_bert_matches_documented_math(self):
        m = self.perturbed(dict(TINY_BERT, dropout=0.1))
        ids = sample_input(TINY_BERT)
        with torch.no_grad():
            y = m(ids)
            self.assertEqual(tuple(y.shape), (2, 16, 41))
            torch.testing.assert_close(y, functional_bert(m, ids, 4), atol=1e-5, rtol=1e-5)
            ids2 = ids.clone()
            ids2[:, -1] = (ids2[:, -1] + 1) % 41
            self.assertGreater((m(ids2)[:, 0] - y[:, 0]).abs().max().item(), 1e-5)  # bidirectional

    def test_attention_options_compute_the_same_function(self):
        # model.attention: "sdpa" (the default, F.scaled_dot_product_attention) and "plain"
        # (the textbook core) on the same weights, GPT causal and BERT bidirectional.
        for cfg in (TINY_GPT, TINY_BERT):
            torch.manual_seed(0)
            sdpa = self.perturbed(cfg)
            self.assertEqual(sdpa.blocks[0].attn.attention, "sdpa")
            plain = build_model(dict(cfg, attention="plain")).eval()
            plain.load_state_dict(sdpa.state_dict())
            ids = sample_input(cfg)
            with torch.no_grad():
                torch.testing.assert_close(sdpa(ids), plain(ids), atol=1e-5, rtol=1e-5)

    def test_token_checks(self):
        m = build_model(TINY_GPT).eval()
        with self.assertRaises(ValueError):
            m(torch.zeros(1, 17, dtype=torch.int64))  # longer than seq_len
        with self.assertRaises(ValueError):
            m(torch.zeros(1, 4, dtype=torch.int32))

    def test_dropout_only_in_training(self):
        m = build_model(dict(TINY_GPT, dropout=0.5))
        ids = sample_input(TINY_GPT)
        with torch.no_grad():
            m.train()
            self.assertFalse(torch.equal(m(ids), m(ids)))
            m.eval()
            self.assertTrue(torch.equal(m(ids), m(ids)))

    def test_resnet_eval(self):
        for cfg in (TINY_RESNET, TINY_BOTTLENECK):
            m = build_model(cfg)
            randomize_bn_stats(m)
            m.eval()
            x = sample_input(cfg)
            with torch.no_grad():
                y = m(x)
            self.assertEqual(tuple(y.shape), (2, cfg["num_classes"]))
            self.assertTrue(torch.isfinite(y).all())
            with self.assertRaises(ValueError):
                m(x[0])

    def test_mlp_flattens(self):
        m = build_model(dict(TINY_MLP, dropout=0.2)).eval()
        x = sample_input(TINY_MLP)
        with torch.no_grad():
            y = m(x)
            torch.testing.assert_close(y, m(x.reshape(2, 36)), atol=0, rtol=0)
            h = x.reshape(2, 36)
            for blk in m.blocks:
                h = torch.relu(blk.fc(h))
            torch.testing.assert_close(y, m.head(h), atol=0, rtol=0)
        with self.assertRaises(ValueError):
            m(torch.zeros(2, 35))


class Checkpoints(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_roundtrip_and_reference_forward(self):
        for cfg in (TINY_GPT, TINY_BERT, TINY_RESNET, TINY_BOTTLENECK, TINY_MLP):
            src = build_model(cfg)
            randomize_bn_stats(src)
            src.eval()
            sd = src.state_dict()
            p = self.path(f"{cfg['kind']}.h5")
            write_fake_checkpoint(p, cfg, sd)

            info = load_checkpoint(p)
            self.assertEqual(list(info["state_dict"]), sorted(sd))  # h5py lists by name
            for name, t in sd.items():
                got = info["state_dict"][name]
                self.assertEqual((got.dtype, tuple(got.shape)), (t.dtype, tuple(t.shape)), name)
                self.assertTrue(torch.equal(got, t), name)
            a = info["attrs"]
            self.assertEqual((a["format"], a["format_version"], a["step"], a["precision"]),
                             ("leantrain-checkpoint", 1, 42, "fp32"))
            self.assertIsInstance(a["step"], int)
            self.assertEqual(info["model_config"], cfg)
            self.assertEqual(info["train_config"]["optimizer"], "adamw")
            self.assertEqual(info["optimizer_attrs"]["kind"], "adamw")
            first = list(sd)[0]
            self.assertEqual(info["optimizer"][f"{first}/step"].dim(), 0)
            self.assertEqual(info["optimizer"][f"{first}/step"].item(), 3.0)
            self.assertEqual(info["data"], {"seed": 1234, "position": 8})

            ref, _ = load_into_reference(p)
            self.assertFalse(ref.training)
            x = sample_input(cfg)
            with torch.no_grad():
                torch.testing.assert_close(ref(x), src(x), atol=0, rtol=0)
            if cfg["kind"] == "resnet":
                self.assertEqual(ref.stem.bn.num_batches_tracked.item(), 7)
                self.assertEqual(ref.stem.bn.num_batches_tracked.dtype, torch.int64)
            self.assertTrue(all(q.requires_grad for q in ref.parameters()))

    def test_crc_names_the_tensor(self):
        cfg = TINY_GPT
        p = self.path("flip.h5")
        write_fake_checkpoint(p, cfg, build_model(cfg).state_dict())
        victim = "blocks.1.attn.qkv.weight"
        with h5py.File(p, "r") as f:
            offset = f["model"][victim].id.get_offset()  # contiguous layout: raw bytes at offset
        self.assertIsNotNone(offset)
        with open(p, "r+b") as fh:  # flip one byte on disk, behind HDF5's back
            fh.seek(offset + 100)
            byte = fh.read(1)
            fh.seek(offset + 100)
            fh.write(bytes([byte[0] ^ 0x10]))
        with self.assertRaises(CheckpointError) as cm:
            load_checkpoint(p)
        msg = str(cm.exception)
        self.assertIn(f"'{victim}'", msg)
        self.assertIn("checksum mismatch", msg)
        self.assertIn(p, msg)
        code, _, err = run_main(export.main, [p, self.path("x.pt")])
        self.assertEqual(code, 2)
        self.assertIn(victim, err)

    def test_crc_of_optimizer_state_and_missing_crc(self):
        cfg = TINY_MLP
        p = self.path("opt.h5")
        write_fake_checkpoint(p, cfg, build_model(cfg).state_dict())
        with h5py.File(p, "r+") as f:
            f["optimizer"]["blocks.0.fc.weight"]["exp_avg"][0, 0] = 9.0
        with self.assertRaises(CheckpointError) as cm:
            load_checkpoint(p)
        self.assertIn("blocks.0.fc.weight/exp_avg", str(cm.exception))
        write_fake_checkpoint(p, cfg, build_model(cfg).state_dict())
        with h5py.File(p, "r+") as f:
            del f["model"]["head.bias"].attrs["crc32"]
        with self.assertRaises(CheckpointError) as cm:
            load_checkpoint(p)
        self.assertIn("head.bias", str(cm.exception))
        self.assertIn("no crc32", str(cm.exception))

    def test_crc_matches_definition(self):
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        self.assertEqual(crc32_of(a), zlib.crc32(a.tobytes()))
        self.assertEqual(crc32_of(a.T), zlib.crc32(np.ascontiguousarray(a.T).tobytes()))
        self.assertEqual(crc32_of(a.astype(">f4")), zlib.crc32(a.tobytes()))  # little-endian bytes
        self.assertEqual(crc32_of(np.int64(5)), zlib.crc32(np.int64(5).tobytes()))

    def test_refuses_newer_format(self):
        p = self.path("v2.h5")
        write_fake_checkpoint(p, TINY_MLP, build_model(TINY_MLP).state_dict(), format_version=2)
        with self.assertRaises(CheckpointError) as cm:
            load_checkpoint(p)
        msg = str(cm.exception)
        self.assertIn("format_version 2", msg)
        self.assertIn("newer than this reader supports", msg)
        self.assertIn("<= 1", msg)

    def test_without_configs(self):
        p = self.path("noconfig.h5")
        sd = build_model(TINY_MLP).state_dict()
        write_fake_checkpoint(p, TINY_MLP, sd, configs=False)
        info = load_checkpoint(p)
        self.assertEqual((info["model_config"], info["config"], info["train_config"]), (None, None, None))
        self.assertEqual(info["attrs"]["model_config"], "")
        self.assertEqual(list(info["state_dict"]), sorted(sd))
        with self.assertRaises(CheckpointError) as cm:
            load_into_reference(p)
        self.assertIn("no model_config", str(cm.exception))
        self.assertEqual(run_main(export.main, [p, self.path("n.pt")])[0], 2)
        self.assertEqual(run_main(export.main, [p, self.path("n.pt"), "--no-verify"])[0], 0)

    def test_refuses_other_files(self):
        p = self.path("other.h5")
        with h5py.File(p, "w") as f:
            f.attrs["format"] = "something-else"
        with self.assertRaises(CheckpointError) as cm:
            load_checkpoint(p)
        self.assertIn("not a leantrain checkpoint", str(cm.exception))
        junk = self.path("junk.h5")
        with open(junk, "wb") as fh:
            fh.write(b"not hdf5 at all")
        with self.assertRaises(CheckpointError):
            load_checkpoint(junk)
        with self.assertRaises(CheckpointError):
            load_checkpoint(self.path("missing.h5"))

    def test_model_mismatch_lists_every_problem(self):
        sd = build_model(TINY_MLP).state_dict()
        sd = OrderedDict((k, v) for k, v in sd.items() if k != "head.bias")
        sd["extra.weight"] = torch.zeros(2)
        sd["blocks.0.fc.weight"] = torch.zeros(3, 3)
        p = self.path("mismatch.h5")
        write_fake_checkpoint(p, TINY_MLP, sd)
        with self.assertRaises(CheckpointError) as cm:
            load_into_reference(p)
        msg = str(cm.exception)
        for needle in ("missing head.bias", "unexpected extra.weight", "blocks.0.fc.weight: shape [3, 3]"):
            self.assertIn(needle, msg)

    def test_command_line_tools(self):
        cfg = TINY_RESNET
        src = build_model(cfg)
        randomize_bn_stats(src)
        src.eval()
        ckpt, io_h5, out_pt = self.path("c.h5"), self.path("io.h5"), self.path("c.pt")
        write_fake_checkpoint(ckpt, cfg, src.state_dict())
        x = sample_input(cfg, batch=3)
        with torch.no_grad():
            y = src(x)
        with h5py.File(io_h5, "w") as f:  # stands in for the C++ model's eval-mode output
            f["input"] = x.numpy()
            f["output"] = y.numpy()

        # As a user runs it: python -m leantrain_py.export with PYTHONPATH=tools (one fresh
        # interpreter: importing torch takes seconds), ...
        env = dict(os.environ, PYTHONPATH=TOOLS, OMP_NUM_THREADS="1")
        r = subprocess.run([sys.executable, "-m", "leantrain_py.export", ckpt, out_pt], env=env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"wrote {out_pt}", r.stdout)
        # ... and check_outputs through its __main__ block, in this interpreter.
        argv, out = sys.argv, io.StringIO()
        try:
            sys.argv = ["check_outputs", ckpt, io_h5]
            with redirect_stdout(out), self.assertRaises(SystemExit) as cm, warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # "found in sys.modules": intended
                runpy.run_module("leantrain_py.check_outputs", run_name="__main__")
        finally:
            sys.argv = argv
        self.assertEqual(cm.exception.code, 0, out.getvalue())
        self.assertIn("OK: resnet output [3, 10]", out.getvalue())
        loaded = torch.load(out_pt, weights_only=True)
        self.assertEqual(list(loaded), sorted(src.state_dict()))
        for k, v in src.state_dict().items():
            self.assertTrue(torch.equal(loaded[k], v), k)

        # Outside the tolerance -> 1; tokens for a GPT checkpoint; unreadable -> 2.
        with h5py.File(io_h5, "r+") as f:
            f["output"][0, 0] += 1e-3
        code, out, _ = run_main(check_outputs.main, [ckpt, io_h5])
        self.assertEqual(code, 1, out)
        self.assertIn("FAIL", out)
        code, out, _ = run_main(check_outputs.main, [ckpt, io_h5, "--tol", "1e-2"])
        self.assertEqual(code, 0, out)

        gpt = build_model(TINY_GPT).eval()
        gckpt, gio = self.path("g.h5"), self.path("gio.h5")
        write_fake_checkpoint(gckpt, TINY_GPT, gpt.state_dict())
        ids = sample_input(TINY_GPT)
        with torch.no_grad():
            gy = gpt(ids)
        with h5py.File(gio, "w") as f:
            f["input"] = ids.numpy()
            f["output"] = gy.numpy()
            f["output"].attrs["crc32"] = np.uint32(crc32_of(gy.numpy()))
        code, out, err = run_main(check_outputs.main, [gckpt, gio])
        self.assertEqual(code, 0, out + err)
        self.assertIn("max abs diff 0.000e+00", out)

        junk = self.path("junk.h5")
        with open(junk, "wb") as fh:
            fh.write(b"garbage")
        self.assertEqual(run_main(check_outputs.main, [junk, gio])[0], 2)
        self.assertEqual(run_main(check_outputs.main, [gckpt, junk])[0], 2)
        with h5py.File(gio, "r+") as f:
            del f["input"]
        self.assertEqual(run_main(check_outputs.main, [gckpt, gio])[0], 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
