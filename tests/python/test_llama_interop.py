#!/usr/bin/env python3
"""Llama-family Hugging Face weights in and out (model.kind = "llama"), against transformers
itself, with no download.

Tiny random-weight models that transformers builds from a config and saves with
save_pretrained (safetensors): Llama with llama3 RoPE scaling, tied (transformers 5.x's
rope_parameters spelling) and untied (4.x's rope_scaling + rope_theta spelling); Qwen2 with
its q/k/v biases; Qwen3 with q/k norms and head_dim != hidden/heads; Mistral with grouped-query
attention and a sliding window longer than the context. For each, leantrain loads the directory
as `train --init-from` does (leantrain_dump_outputs --model '{"kind":"llama","seq_len":T}'
--init-from DIR: the other options come from config.json, trainers::model_section_for_init)
and its fp32 eval-mode logits must equal transformers' within REL_TOL (max|a-b| / max|b|) at
several sequence lengths. Then `leantrain export --format hf` writes the weights back,
AutoModelForCausalLM.from_pretrained must open them as the original architecture and give
the same logits again. Also: sharded directories in and out (model.safetensors.index.json),
a bf16 export, --source (tokenizer files and token ids kept), `leantrain train --init-from
DIR` with no model options (and with no model.kind), and the bad inputs (exit 2, the key or
file named): an unsupported architecture (Gemma with model.kind = llama, Mamba with none),
rope_scaling yarn, heads not divisible by key/value heads, a shard named in the index missing,
a missing and a mis-shaped tensor, a set option disagreeing with config.json, model.kind =
gpt on a Llama directory, a Mistral window shorter than seq_len.

    .venv/bin/python tests/python/test_llama_interop.py build/bin/leantrain build/bin/leantrain_dump_outputs
Exit codes: 0 pass, 1 fail, 77 skipped (binaries or transformers missing)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
REL_TOL = 1e-5  # the bound on fp32 logits
LENGTHS = (1, 7, 32, 64)  # sequence lengths; 64 = max_position_embeddings

try:
    import torch
    import transformers
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
except ImportError as e:  # pragma: no cover
    print(f"test_llama_interop: skipped ({e})")
    sys.exit(SKIP)

transformers.logging.set_verbosity_error()
torch.set_num_threads(1)

# The result lists and the small helpers are test_interop's (the GPT-2/BERT/ResNet interop test in
# this folder): one definition of what a check, a relative difference and a perturbed model are.
from test_interop import FAILURES, RESULTS, check, perturb, rel_diff, run  # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
COMMON = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64, bos_token_id=1, eos_token_id=2)


def models() -> list[tuple[str, object, type, str]]:
    """(name, config, class, family) of the five models."""
    return [
        ("llama3_tied", LlamaConfig(**COMMON, num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=True,
                                    rope_parameters={**LLAMA3_ROPE, "rope_theta": 500000.0}),
         LlamaForCausalLM, "llama"),
        ("llama3_untied", LlamaConfig(**COMMON, num_key_value_heads=4, tie_word_embeddings=False,
                                      rope_parameters={**LLAMA3_ROPE, "rope_theta": 10000.0}),
         LlamaForCausalLM, "llama"),
        ("qwen2_bias", Qwen2Config(**COMMON, num_key_value_heads=2, tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         Qwen2ForCausalLM, "qwen2"),
        ("qwen3_qknorm", Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         Qwen3ForCausalLM, "qwen3"),
        ("mistral_gqa", MistralConfig(**COMMON, num_key_value_heads=1, sliding_window=64, tie_word_embeddings=False),
         MistralForCausalLM, "mistral"),
    ]


def legacy_rope_spelling(d: str) -> None:
    """config.json as transformers 4.x writes it: rope_theta + rope_scaling, no rope_parameters."""
    path = os.path.join(d, "config.json")
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp if rp.get("rope_type", "default") != "default" else None
    with open(path, "w") as f:
        json.dump(c, f, indent=2)


class Cpp:
    def __init__(self, leantrain: str, dump: str, tmp: str):
        self.leantrain, self.dump, self.tmp = leantrain, dump, tmp

    def load(self, source: str, name: str, seq_len: int, extra_model=None, expect_rc=0, batch=3, seed=0):
        """leantrain's logits of `source`: (input, output, stdout+stderr); a checkpoint NAME.h5 is saved."""
        import h5py
        io = os.path.join(self.tmp, name + "_io.h5")
        model = {"kind": "llama", "seq_len": seq_len, **(extra_model or {})}
        r = run([self.dump, "--model", json.dumps(model), "--init-from", source, io, "--batch", str(batch),
                 "--seed", str(seed), "--save-checkpoint", os.path.join(self.tmp, name + ".h5")], expect_rc)
        if r.returncode != 0:
            return None, None, r.stdout + r.stderr
        with h5py.File(io, "r") as f:
            return torch.from_numpy(f["input"][()]), torch.from_numpy(f["output"][()]), r.stdout + r.stderr

    def export(self, name: str, *extra: str, expect_rc=0) -> tuple[str, subprocess.CompletedProcess]:
        out = os.path.join(self.tmp, f"{name}_export")
        r = run([self.leantrain, "export", os.path.join(self.tmp, name + ".h5"), "--format", "hf", "--out", out,
                 *extra], expect_rc)
        return out, r

    def train(self, conf_text: str, name: str, init_from: str, *sets: str, expect_rc=0):
        conf = os.path.join(self.tmp, name + ".toml")
        with open(conf, "w") as f:
            f.write(conf_text)
        cmd = [self.leantrain, "train", "--config", conf, "--out", os.path.join(self.tmp, "run_" + name),
               "--init-from", init_from]
        for s in sets:
            cmd += ["--set", s]
        return run(cmd, expect_rc)


def logits_parity(cpp: Cpp, name: str, hf, d: str, family: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """leantrain's logits = transformers' at each of LENGTHS; returns the last (input, logits)."""
    worst, last = 0.0, None
    for i, t in enumerate(LENGTHS):
        x, y, log = cpp.load(d, name, t, seed=i)
        if y is None:
            check(False, f"{name}: leantrain loads the {type(hf).__name__} directory at seq_len {t}")
            return None
        with torch.no_grad():
            ref = hf(x).logits
        worst = max(worst, rel_diff(y, ref))
        last = (x, y)
    RESULTS.append(f"{name} in: max rel diff {worst:.2e} (seq_len {', '.join(map(str, LENGTHS))})")
    check(worst <= REL_TOL, f"{name}: leantrain logits = transformers' at seq_len {LENGTHS} (max rel diff {worst:.2e})")
    check(f"Hugging Face {type(hf).__name__}" in log and f'family = "{family}"' in log,
          f"{name}: read as {type(hf).__name__}, model.family = {family} from config.json")
    return last


def export_parity(cpp: Cpp, name: str, hf, x: torch.Tensor, y: torch.Tensor) -> None:
    out, r = cpp.export(name)
    check(r.returncode == 0, f"{name}: leantrain export --format hf")
    if r.returncode != 0:
        return
    back = AutoModelForCausalLM.from_pretrained(out).eval()
    arch = type(hf).__name__
    check(type(back).__name__ == arch, f"{name}: from_pretrained opens the export as {type(back).__name__}")
    with torch.no_grad():
        ref = back(x).logits
    r2 = rel_diff(ref, y)
    RESULTS.append(f"{name} out: max rel diff {r2:.2e}")
    check(r2 <= REL_TOL, f"{name}: exported, from_pretrained's logits = leantrain's (max rel diff {r2:.2e})")
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    src = hf.config
    head_dim = getattr(src, "head_dim", None) or src.hidden_size // src.num_attention_heads
    same = c["head_dim"] == head_dim and all(
        c[k] == getattr(src, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                                          "tie_word_embeddings"))
    rp, srp = back.config.rope_parameters, src.rope_parameters
    check(same and c["architectures"] == [arch] and c["model_type"] == src.model_type and c["dtype"] == "float32"
          and c["rms_norm_eps"] == src.rms_norm_eps and rp["rope_type"] == srp["rope_type"]
          and rp["rope_theta"] == srp["rope_theta"] and all(rp.get(k) == srp.get(k) for k in LLAMA3_ROPE)
          and c["bos_token_id"] is None,
          f"{name}: the export's config.json has the source's sizes, RoPE, tie, {arch}, no token ids without --source")
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    check(("lm_head.weight" in keys) == (not src.tie_word_embeddings),
          f"{name}: lm_head.weight written only when untied ({'tied' if src.tie_word_embeddings else 'untied'})")


def test_family(cpp: Cpp, name: str, cfg, cls, family: str, seed: int) -> None:
    torch.manual_seed(seed)
    hf = cls(cfg).eval()
    perturb(hf, seed)
    d = os.path.join(cpp.tmp, name + "_hf")
    hf.save_pretrained(d)
    if name == "llama3_untied":
        legacy_rope_spelling(d)
    last = logits_parity(cpp, name, hf, d, family)
    if last is not None:
        export_parity(cpp, name, hf, *last)


def test_shards_dtype_source(cpp: Cpp) -> None:
    """Sharded in and out, a bf16 export, --source."""
    name, cfg, cls, _ = models()[0]
    torch.manual_seed(11)
    hf = cls(cfg).eval()
    perturb(hf, 11)
    d, ds = os.path.join(cpp.tmp, "sh_single"), os.path.join(cpp.tmp, "sh_sharded")
    hf.save_pretrained(d)
    hf.save_pretrained(ds, max_shard_size="20KB")
    shards = [f for f in os.listdir(ds) if f.endswith(".safetensors")]
    check(os.path.exists(os.path.join(ds, "model.safetensors.index.json")) and len(shards) > 2,
          f"shards: save_pretrained wrote {len(shards)} shards and an index")
    x, y, _ = cpp.load(d, "sh_single", 32)
    xs, ys, _ = cpp.load(ds, "sh_sharded", 32)
    check(ys is not None and torch.equal(xs, x) and torch.equal(ys, y), "shards: a sharded directory gives the same logits bitwise")

    out, r = cpp.export("sh_sharded", "--max-shard-size", "30KB")
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        index = json.load(f)
    check(r.returncode == 0 and len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
          and set(index["weight_map"].values()) == set(files) and index["metadata"]["total_size"] > 0,
          f"shards: export --max-shard-size 30KB wrote {len(files)} shards and model.safetensors.index.json")
    back = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        r2 = rel_diff(back(x).logits, y)
    check(r2 <= REL_TOL, f"shards: from_pretrained of the sharded export gives leantrain's logits (max rel diff {r2:.2e})")
    # The same directory again, unsharded: the stale shards and index go.
    out2, r = cpp.export("sh_sharded")
    left = sorted(f for f in os.listdir(out2) if f.startswith("model"))
    check(r.returncode == 0 and left == ["model.safetensors"], f"shards: re-exported unsharded, only {left} remain")

    # bf16, with the source's tokenizer files and token ids.
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write('{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}\n')
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        f.write('{"tokenizer_class": "PreTrainedTokenizerFast"}\n')
    outb, r = cpp.export("sh_single", "--dtype", "bf16", "--source", d)
    check(r.returncode == 0, "bf16: export --dtype bf16 --source DIR")
    if r.returncode != 0:
        return
    sd = load_file(os.path.join(outb, "model.safetensors"))
    with open(os.path.join(outb, "config.json")) as f:
        c = json.load(f)
    check(all(t.dtype == torch.bfloat16 for t in sd.values()) and c["dtype"] == "bfloat16",
          "bf16: every tensor bf16, config.json dtype bfloat16")
    ref = {k: v.to(torch.bfloat16) for k, v in hf.state_dict().items() if k in sd}
    check(len(ref) == len(sd) and all(torch.equal(sd[k], ref[k]) for k in sd),
          "bf16: the tensors are the source's rounded to bf16")
    check(c["bos_token_id"] == 1 and c["eos_token_id"] == 2 and os.path.exists(os.path.join(outb, "tokenizer.json"))
          and os.path.exists(os.path.join(outb, "tokenizer_config.json"))
          and os.path.exists(os.path.join(outb, "generation_config.json")),
          "--source: token ids kept, tokenizer files and generation_config.json copied")
    back = AutoModelForCausalLM.from_pretrained(outb, dtype=torch.float32).eval()
    with torch.no_grad():
        r3 = rel_diff(back(x).logits, y)
    RESULTS.append(f"bf16 export: max rel diff {r3:.2e} (bf16 rounding of the weights)")
    check(r3 < 0.05, f"bf16: from_pretrained of the bf16 export, logits near leantrain's fp32 ones ({r3:.2e})")


def test_train_init_from(cpp: Cpp) -> None:
    """`leantrain train --init-from DIR` with no model options, then with no [model] at all."""
    name, cfg, cls, _ = models()[2]  # Qwen2 (tied)
    torch.manual_seed(12)
    hf = cls(cfg)
    d = os.path.join(cpp.tmp, "train_hf")
    hf.save_pretrained(d)
    rest = ('[data]\nkind = "synthetic"\nsynthetic_samples = 64\n'
            '[train]\nglobal_batch = 4\nmicro_batch = 4\nsteps = 2\neval_batch = 4\neval_max_batches = 1\nthreads = 1\n')
    n = len(hf.state_dict()) - 1  # lm_head.weight is tied to the embedding
    r = cpp.train('[model]\nkind = "llama"\nseq_len = 16\n' + rest, "kind_only", d)
    check(r.returncode == 0 and f"initialised {n} tensors from {d} (Hugging Face Qwen2ForCausalLM)" in r.stderr
          and "hidden_size = 64" in r.stderr, f"train: [model] kind = \"llama\" + --init-from DIR loads all {n} tensors")
    r = cpp.train(rest, "no_model", d, "model.seq_len=16")
    check(r.returncode == 0 and 'model.kind = "llama" from' in r.stderr and f"initialised {n} tensors" in r.stderr,
          "train: no model.kind, --init-from a Qwen2 directory: the kind and options come from config.json")
    # The run's config.json records the resolved options, so a resume needs no --init-from.
    with open(os.path.join(cpp.tmp, "run_no_model", "config.json")) as f:
        m = json.load(f)["model"]
    check(m["kind"] == "llama" and m["family"] == "qwen2" and m["attention_bias"] and m["tie_word_embeddings"],
          "train: the run's config.json holds the options from config.json")


def bad_dir(cpp: Cpp, name: str, config: dict, tensors: dict | None = None) -> str:
    d = os.path.join(cpp.tmp, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    save_file(tensors or {"model.embed_tokens.weight": torch.zeros(4, 4)}, os.path.join(d, "model.safetensors"))
    return d


def test_bad_inputs(cpp: Cpp) -> None:
    conf = ('[model]\nkind = "llama"\nseq_len = 32\n[data]\nkind = "synthetic"\nsynthetic_samples = 64\n'
            '[train]\nglobal_batch = 4\nmicro_batch = 4\nsteps = 1\n')
    base = {**COMMON, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_key_value_heads": 2}

    def refused(name: str, d: str, needles: list[str], what: str, sets=(), conf_text=conf, rc=2) -> None:
        r = cpp.train(conf_text, name, d, *sets, expect_rc=rc)
        ok = r.returncode == rc and all(s in r.stderr for s in needles)
        check(ok, f"bad input: {what} (exit {r.returncode}, naming {needles})")
        if not ok:
            print(r.stderr[-1500:])

    gemma = bad_dir(cpp, "gemma", {**COMMON, "model_type": "gemma", "architectures": ["GemmaForCausalLM"]})
    refused("gemma", gemma, ['"GemmaForCausalLM"', "LlamaForCausalLM (llama), Qwen2ForCausalLM (qwen2)"],
            "GemmaForCausalLM with model.kind = llama: named, the four supported listed")
    mamba = bad_dir(cpp, "mamba", {"model_type": "mamba", "architectures": ["MambaForCausalLM"], "vocab_size": 10})
    refused("mamba", mamba, ['"MambaForCausalLM"', "model.kind is not set", "llama"],
            "MambaForCausalLM with no model.kind: named, the kinds that read Hugging Face directories listed",
            conf_text=conf.replace('kind = "llama"\n', "", 1))
    yarn = bad_dir(cpp, "yarn", {**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 16}})
    refused("yarn", yarn, ['rope_scaling.rope_type = "yarn"', '"none" | "llama3"'], "rope_scaling yarn")
    dyn = bad_dir(cpp, "dynamic", {**base, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}})
    refused("dynamic", dyn, ['rope_parameters.rope_type = "dynamic"'], "rope_parameters dynamic (5.x spelling)")
    heads = bad_dir(cpp, "heads", {**base, "num_attention_heads": 6, "num_key_value_heads": 4, "head_dim": 16})
    refused("heads", heads, ["num_attention_heads = 6 is not a multiple of num_key_value_heads = 4"],
            "heads not divisible by key/value heads")
    window = bad_dir(cpp, "window", {**COMMON, "model_type": "mistral", "architectures": ["MistralForCausalLM"],
                                     "sliding_window": 16})
    refused("window", window, ["sliding_window = 16 is shorter than model.seq_len = 32"],
            "a Mistral sliding window shorter than seq_len")

    # A real directory: a shard missing, a tensor missing, a tensor of another shape, options disagreeing.
    _, cfg, cls, _ = models()[1]
    torch.manual_seed(13)
    hf = cls(cfg)
    d = os.path.join(cpp.tmp, "bad_sharded")
    hf.save_pretrained(d, max_shard_size="20KB")
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        shard = json.load(f)["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    os.remove(os.path.join(d, shard))
    refused("no_shard", d, ["model.safetensors.index.json", shard, "does not exist"], "a shard named in the index missing")

    good = os.path.join(cpp.tmp, "bad_single")
    hf.save_pretrained(good)
    sd = load_file(os.path.join(good, "model.safetensors"))
    for nm, change in (("missing", lambda s: s.pop("model.layers.1.mlp.up_proj.weight")),
                       ("shape", lambda s: s.__setitem__("model.layers.0.self_attn.k_proj.weight", torch.zeros(16, 64)))):
        bd = os.path.join(cpp.tmp, "bad_" + nm)
        shutil.copytree(good, bd)
        s = dict(sd)
        change(s)
        save_file(s, os.path.join(bd, "model.safetensors"), metadata={"format": "pt"})
        needle = "blocks.1.mlp.up_proj.weight" if nm == "missing" else "blocks.0.self_attn.k_proj.weight"
        refused("t_" + nm, bd, [needle], f"a {nm} tensor named")
    refused("disagree", good, ["num_hidden_layers = 2, but model.num_hidden_layers = 3",
                               "hidden_size = 64, but model.hidden_size = 32"],
            "set options disagreeing with config.json: every key, both values",
            sets=("model.num_hidden_layers=3", "model.hidden_size=32"))
    gpt = ('[model]\nkind = "gpt"\nvocab_size = 211\nseq_len = 32\nn_layer = 2\nn_head = 4\nd_model = 64\n'
           '[data]\nkind = "synthetic"\nsynthetic_samples = 64\n[train]\nglobal_batch = 4\nmicro_batch = 4\nsteps = 1\n')
    refused("as_gpt", good, ['set model.kind = "llama"'], "model.kind = gpt on a Llama directory says to use llama",
            conf_text=gpt)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not all(os.path.exists(p) for p in argv[1:3]):
        print("test_llama_interop: skipped (give the leantrain and leantrain_dump_outputs binaries)")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="lt_llama_interop_") as tmp:
        cpp = Cpp(argv[1], argv[2], tmp)
        tests = [lambda c, m=m, i=i: test_family(c, *m, seed=i + 1) for i, m in enumerate(models())]
        tests += [test_shards_dtype_source, test_train_init_from, test_bad_inputs]
        for t in tests:
            try:
                t(cpp)
            except Exception as e:  # noqa: BLE001 - a crash is a failure of that part
                import traceback
                traceback.print_exc()
                check(False, f"{getattr(t, '__name__', 'test')} raised {type(e).__name__}: {e}")
    print("\n".join(RESULTS))
    if FAILURES:
        print(f"test_llama_interop: {len(FAILURES)} failure(s)")
        return 1
    print("test_llama_interop: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
