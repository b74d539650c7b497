"""A torchtitan-style Llama in plain PyTorch: the second Llama peer of bench/peers
(llama_recipe.py --impl titan / titan-compiled).

It follows torchtitan's torchtitan/models/llama3/model/model.py as a torchtitan user runs it:
module names tok_embeddings / layers.<i>.attention.{wq,wk,wv,wo} / feed_forward.{w1,w2,w3} /
attention_norm / ffn_norm / norm / output; torch.nn.RMSNorm; rotary embeddings as complex
`freqs_cis` (precompute_freqs_cis with the llama3 frequency scaling, apply_rotary_emb through
view_as_complex, in fp32); SwiGLU. Two changes a user of these models makes: attention is
`F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)` (torchtitan repeats k/v
heads with repeat_kv first; enable_gqa lets SDPA do it without the copies), and
tie_word_embeddings shares the output weight with the embedding (SmolLM2 is tied; torchtitan's
Qwen3 does the same with enable_weight_tying).

Weights arrive in Hugging Face's layout (leantrain's `llama` kind stores them so:
embed_tokens / blocks.<i>.self_attn.q_proj ...). torchtitan's RoPE rotates interleaved pairs,
HF's rotates the two halves of each head, so the Llama3StateDictAdapter.from_hf conversion
permutes the rows of wq and wk (reverse_permute below, the same function): q.k is unchanged, and
so are the logits and the loss. AdamW is element-wise, so training the permuted weights is
training the same model.

    shape = LlamaShape.from_config(model_section)     # leantrain's config.json "model"
    model = Transformer(shape)
    model.load_state_dict(from_leantrain(leantrain_state_dict, shape))
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Mapping

import torch
import torch.nn.functional as F
from torch import nn


class LlamaShapeError(ValueError):
    """A model section the Llama peers cannot reproduce; the message names model.<key>."""


@dataclasses.dataclass(frozen=True)
class LlamaShape:
    """The `llama` kind's options (named as Hugging Face's config.json), resolved."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: str  # "none" | "llama3"
    rope_factor: float
    rope_low_freq_factor: float
    rope_high_freq_factor: float
    rope_original_max_position_embeddings: int
    max_position_embeddings: int
    seq_len: int
    tie_word_embeddings: bool

    @staticmethod
    def from_config(m: Mapping[str, Any]) -> "LlamaShape":
        """From the `model` section of leantrain's resolved config.json. Only what both peers
        implement is accepted: a plain Llama (no attention bias, no qk_norm, SiLU, dropout 0);
        anything else is an error naming the key."""
        def need(key: str) -> Any:
            if key not in m:
                raise LlamaShapeError(f"model.{key}: missing from the config (a leantrain `llama` config has it)")
            return m[key]

        if m.get("kind") != "llama":
            raise LlamaShapeError(f"model.kind = {m.get('kind')!r}: the Llama peers take kind 'llama'")
        for key, plain in (("attention_bias", False), ("qk_norm", False)):
            if bool(m.get(key, plain)) != plain:
                raise LlamaShapeError(f"model.{key} = {m[key]!r}: the Llama peers build plain Llama blocks "
                                      f"(set it to {str(plain).lower()})")
        if m.get("hidden_act", "silu") != "silu":
            raise LlamaShapeError(f"model.hidden_act = {m['hidden_act']!r}: the Llama peers use SwiGLU with silu")
        if float(m.get("dropout", 0.0)) != 0.0:
            raise LlamaShapeError(f"model.dropout = {m['dropout']!r}: the peer bench runs dropout 0 "
                                  "(Note [No dropout at CPU scale] in compare.py)")
        heads = int(need("num_attention_heads"))
        kv = int(m.get("num_key_value_heads", 0)) or heads
        hidden = int(need("hidden_size"))
        head_dim = int(m.get("head_dim", 0)) or hidden // heads
        if heads % kv != 0:
            raise LlamaShapeError(f"model.num_key_value_heads = {kv}: must divide num_attention_heads = {heads}")
        scaling = str(m.get("rope_scaling", "none"))
        if scaling not in ("none", "llama3"):
            raise LlamaShapeError(f"model.rope_scaling = {scaling!r}: the Llama peers do none or llama3")
        return LlamaShape(
            vocab_size=int(need("vocab_size")), hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")), num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
            rms_norm_eps=float(need("rms_norm_eps")), rope_theta=float(need("rope_theta")), rope_scaling=scaling,
            rope_factor=float(m.get("rope_factor", 8.0)),
            rope_low_freq_factor=float(m.get("rope_low_freq_factor", 1.0)),
            rope_high_freq_factor=float(m.get("rope_high_freq_factor", 4.0)),
            rope_original_max_position_embeddings=int(m.get("rope_original_max_position_embeddings", 8192)),
            max_position_embeddings=int(m.get("max_position_embeddings", 0)) or int(need("seq_len")),
            seq_len=int(need("seq_len")), tie_word_embeddings=bool(m.get("tie_word_embeddings", False)))


# ---- rotary embeddings (torchtitan's precompute_freqs_cis / apply_rotary_emb) ----------------

def apply_llama3_scaling(freqs: torch.Tensor, s: LlamaShape) -> torch.Tensor:
    low_freq_wavelen = s.rope_original_max_position_embeddings / s.rope_low_freq_factor
    high_freq_wavelen = s.rope_original_max_position_embeddings / s.rope_high_freq_factor
    wavelen = 2 * torch.pi / freqs
    new_freqs = torch.where(wavelen > low_freq_wavelen, freqs / s.rope_factor, freqs)
    smooth = (s.rope_original_max_position_embeddings / wavelen - s.rope_low_freq_factor) / (
        s.rope_high_freq_factor - s.rope_low_freq_factor)
    return torch.where((wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen),
                       (1 - smooth) * new_freqs / s.rope_factor + smooth * new_freqs, new_freqs)


def precompute_freqs_cis(s: LlamaShape, end: int) -> torch.Tensor:
    dim = s.head_dim
    freqs = 1.0 / (s.rope_theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    if s.rope_scaling == "llama3":
        freqs = apply_llama3_scaling(freqs, s)
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64 [end, head_dim / 2]


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """xq [B, T, H, D], xk [B, T, Hkv, D]; freqs_cis [>= T, D / 2]."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis[: xq.shape[1]].view(1, xq.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * f).flatten(3)
    xk_out = torch.view_as_real(xk_ * f).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


# ---- the model ------------------------------------------------------------------------------------

class Attention(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        self.wq = nn.Linear(s.hidden_size, s.num_attention_heads * s.head_dim, bias=False)
        self.wk = nn.Linear(s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.wv = nn.Linear(s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.wo = nn.Linear(s.num_attention_heads * s.head_dim, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                             is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.w1 = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.w2 = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)
        self.w3 = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.attention = Attention(s)
        self.feed_forward = FeedForward(s)
        self.attention_norm = nn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)
        self.ffn_norm = nn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.shape = s
        self.tok_embeddings = nn.Embedding(s.vocab_size, s.hidden_size)
        self.register_buffer("freqs_cis", precompute_freqs_cis(s, s.seq_len), persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(s) for i in range(s.num_hidden_layers)})
        self.norm = nn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)
        self.output = nn.Linear(s.hidden_size, s.vocab_size, bias=False)
        if s.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan's loss (components/loss.py): fp32 logits, mean over the tokens."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), ignore_index=-100)


# ---- weights in (torchtitan's Llama3StateDictAdapter.from_hf, on leantrain's names) --------------

_FROM_LEANTRAIN = {
    "embed_tokens.weight": "tok_embeddings.weight",
    "blocks.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "blocks.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "blocks.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "blocks.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "blocks.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "blocks.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "blocks.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "blocks.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "blocks.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}


def reverse_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """HF's half-rotation rows of q_proj / k_proj -> torchtitan's interleaved pairs."""
    dim1, dim2 = w.shape
    return w.view(n_heads, 2, dim1 // n_heads // 2, dim2).transpose(1, 2).reshape(dim1, dim2).contiguous()


def leantrain_to_hf_name(name: str) -> str:
    """leantrain's `llama` parameter name -> LlamaForCausalLM's (model. prefix, layers for blocks)."""
    if name == "lm_head.weight":
        return name
    return "model." + re.sub(r"^blocks\.", "layers.", name)


def from_leantrain(sd: Mapping[str, torch.Tensor], s: LlamaShape) -> Dict[str, torch.Tensor]:
    """leantrain's `llama` state dict -> Transformer's (tied: no output.weight, as the module
    shares it). Unknown names are errors: a tensor this peer would not train."""
    out: Dict[str, torch.Tensor] = {}
    for name, value in sd.items():
        m = re.match(r"^blocks\.(\d+)\.(.*)$", name)
        key, layer = (f"blocks.{{}}.{m.group(2)}", m.group(1)) if m else (name, None)
        if key not in _FROM_LEANTRAIN:
            raise LlamaShapeError(f"leantrain tensor {name}: the titan-style Llama has no such parameter")
        if key == "blocks.{}.self_attn.q_proj.weight":
            value = reverse_permute(value, s.num_attention_heads)
        elif key == "blocks.{}.self_attn.k_proj.weight":
            value = reverse_permute(value, s.num_key_value_heads)
        out[_FROM_LEANTRAIN[key].format(layer)] = value
    if s.tie_word_embeddings:
        out.pop("output.weight", None)
    return out


def load_leantrain_weights(model: Transformer, sd: Mapping[str, torch.Tensor]) -> None:
    """Copies leantrain's tensors into the model; a missing or misshapen tensor is an error naming it."""
    want = from_leantrain(sd, model.shape)
    params = dict(model.named_parameters())  # a tied output.weight is listed once, as tok_embeddings
    missing = sorted(set(params) - set(want))
    if missing:
        raise LlamaShapeError(f"no leantrain tensor for parameter(s) {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, p in params.items():
            src = want[name]
            if tuple(src.shape) != tuple(p.shape):
                raise LlamaShapeError(f"{name}: the checkpoint has shape {list(src.shape)}, the model {list(p.shape)}")
            p.copy_(src)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

