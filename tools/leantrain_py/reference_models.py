"""PyTorch reference implementations of leantrain's four model kinds: gpt, bert, resnet, mlp.

Each class reproduces the C++ model in models/src/{model,transformer,resnet}.cpp op for op
(same math, same layer order, same order of additions), and registers its submodules under
the same names, so that `state_dict()` keys equal the C++ `named_parameters()` /
`named_buffers()` names (e.g. `blocks.0.attn.qkv.weight`, `blocks.3.bn1.num_batches_tracked`)
and a leantrain checkpoint's `/model` group loads with `load_state_dict(..., strict=True)`.

Activation recompute (Model::apply_recompute, models/src/recompute_model.cpp) registers no
modules (it installs a BlockRunner callback and switches CheapRegions on), so it changes
neither names nor eval-mode results; nothing of it appears here. The chunked LM loss likewise only
changes how the training loss is computed, not forward().

Dropout is applied at the same places as in C++ (training mode only); its random draws of
course differ from LibTorch's, so only eval-mode outputs are comparable.

build_model(model_cfg) takes the `model` section of leantrain's config JSON
(runtime/src/config.cpp, config_to_json; keys and defaults as lt::models::ModelConfig in
models/include/leantrain/models/model_config.h).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# lt::models::ModelConfig's fields and defaults (models/include/leantrain/models/model_config.h).
MODEL_DEFAULTS: Dict[str, Any] = {
    "kind": "mlp",
    "vocab_size": 257,
    "seq_len": 128,
    "n_layer": 2,
    "n_head": 2,
    "d_model": 64,
    "d_ff": 0,  # 0 means 4 * d_model
    "type_vocab_size": 2,
    "dropout": 0.0,
    "attention": "sdpa",  # gpt, bert: "sdpa" | "plain" (attention.h)
    "depth": 18,
    "layers": [],
    "block": "basic",
    "width": 64,
    "stem": "imagenet",
    "memory_format": "channels_last",
    "bn_relu": "fused",  # resnet: "fused" | "separate" (batch_norm_relu.h); the same function, so one code here
    "in_channels": 1,
    "image_size": 28,
    "num_classes": 10,
    "hidden": [256, 256],
}

# models/src/resnet.cpp, resnet_layout().
RESNET_DEPTHS: Dict[int, Tuple[List[int], str]] = {
    18: ([2, 2, 2, 2], "basic"),
    34: ([3, 4, 6, 3], "basic"),
    50: ([3, 4, 6, 3], "bottleneck"),
    101: ([3, 4, 23, 3], "bottleneck"),
    152: ([3, 8, 36, 3], "bottleneck"),
}


class ModelConfigError(ValueError):
    """An impossible model config; the message names model.<key> as the C++ ConfigError does."""


def _fail(key: str, value: Any, why: str) -> None:
    raise ModelConfigError(f"model.{key} = {value!r}: {why}")


def resolve_model_config(model_cfg: Mapping[str, Any]) -> Dict[str, Any]:
    """model_cfg merged over lt::models::ModelConfig's defaults and validated as
    check_model_config() (models/src/registry.cpp) does. Unknown keys are errors (the C++ config is
    strict too, and a key this reader does not know is an option it cannot reproduce)."""
    unknown = sorted(set(model_cfg) - set(MODEL_DEFAULTS))
    if unknown:
        raise ModelConfigError(f"model.{unknown[0]}: unknown key (known: {', '.join(MODEL_DEFAULTS)})")
    c = dict(MODEL_DEFAULTS)
    c.update(model_cfg)
    for key, default in MODEL_DEFAULTS.items():
        v = c[key]
        if isinstance(default, bool) or isinstance(v, bool):
            _fail(key, v, "wrong type")
        if isinstance(default, int) and not isinstance(v, int):
            _fail(key, v, "must be an integer")
        if isinstance(default, float) and not isinstance(v, (int, float)):
            _fail(key, v, "must be a number")
        if isinstance(default, str) and not isinstance(v, str):
            _fail(key, v, "must be a string")
        if isinstance(default, list) and not (isinstance(v, (list, tuple)) and all(
                isinstance(x, int) and not isinstance(x, bool) for x in v)):
            _fail(key, v, "must be a list of integers")
    c["dropout"] = float(c["dropout"])
    c["layers"] = list(c["layers"])
    c["hidden"] = list(c["hidden"])

    def positive(key: str) -> None:
        if c[key] < 1:
            _fail(key, c[key], "must be >= 1")

    def dropout_ok() -> None:
        if not 0.0 <= c["dropout"] < 1.0:
            _fail("dropout", c["dropout"], "must be in [0, 1)")

    kind = c["kind"]
    if kind in ("gpt", "bert"):
        for key in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model"):
            positive(key)
        if c["d_model"] % c["n_head"] != 0:
            _fail("n_head", c["n_head"], f"must divide model.d_model = {c['d_model']}")
        if c["d_ff"] < 0:
            _fail("d_ff", c["d_ff"], "must be >= 1, or 0 for 4 * d_model")
        dropout_ok()
        if c["attention"] not in ("sdpa", "plain"):
            _fail("attention", c["attention"], 'must be "sdpa" or "plain"')
        if kind == "bert":
            positive("type_vocab_size")
    elif kind == "resnet":
        for key in ("in_channels", "image_size", "num_classes"):
            positive(key)
        resnet_layout(c)
        positive("width")
        if c["stem"] not in ("imagenet", "small"):
            _fail("stem", c["stem"], 'must be "imagenet" or "small"')
        if c["memory_format"] not in ("channels_last", "contiguous"):
            _fail("memory_format", c["memory_format"], 'must be "channels_last" or "contiguous"')
        if c["bn_relu"] not in ("fused", "separate"):
            _fail("bn_relu", c["bn_relu"], 'must be "fused" or "separate"')
    elif kind == "mlp":
        for key in ("in_channels", "image_size", "num_classes"):
            positive(key)
        for i, h in enumerate(c["hidden"]):
            if h < 1:
                _fail("hidden", c["hidden"], f"every hidden width must be >= 1 (entry {i})")
        dropout_ok()
    else:
        _fail("kind", kind, "must be one of gpt, bert, resnet, mlp")
    return c


def resnet_layout(c: Mapping[str, Any]) -> Tuple[List[int], str]:
    """Blocks per stage and block kind, as resnet_layout() in models/src/resnet.cpp."""
    depth, layers = c["depth"], list(c["layers"])
    if depth == 0:
        if not layers:
            _fail("layers", layers, "with model.depth = 0 give the blocks per stage")
        if any(n < 1 for n in layers):
            _fail("layers", layers, "every stage needs >= 1 block")
        if c["block"] not in ("basic", "bottleneck"):
            _fail("block", c["block"], 'must be "basic" or "bottleneck"')
        return layers, c["block"]
    if layers:
        _fail("layers", layers, f"set model.depth = 0 to use model.layers (model.depth = {depth})")
    if depth not in RESNET_DEPTHS:
        _fail("depth", depth, "must be 18, 34, 50, 101 or 152, or 0 with model.layers")
    stages, block = RESNET_DEPTHS[depth]
    return list(stages), block


# ---------------------------------------------------------------------------------------------
# Transformer layers (models/include/leantrain/models/attention.h, models/src/transformer.cpp)


class SelfAttention(nn.Module):
    """qkv -> split q,k,v (D each) -> heads [B,H,T,hd] -> attention core -> proj.

    The core as attention_core (transformer.cpp), by model.attention:
    - "sdpa": F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p in
      training), the op the C++ calls (same kernel, same result). Where no fused kernel takes
      the inputs (on the CPU: training with dropout) the C++ runs the plain core instead of
      SDPA's math fallback (the same function; Note [SDPA's math fallback]); eval mode is the
      same on both sides;
    - "plain": scores = (q @ k^T) * (1/sqrt(hd)) (a multiply by the reciprocal, computed in
      double, not a division), masked_fill(-inf) strictly above the diagonal when causal,
      softmax over the last dim, dropout on the probabilities (training, p > 0), @ v.
    leantrain's models pass no padding mask (the C++ core takes one; its tests compare the two
    cores with it)."""

    def __init__(self, d_model: int, n_head: int, attn_dropout: float, causal: bool,
                 attention: str = "sdpa"):
        super().__init__()
        self.d_model, self.n_head = d_model, n_head
        self.attn_dropout, self.causal, self.attention = attn_dropout, causal, attention
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.attn_dropout if self.training else 0.0, is_causal=self.causal)
        t, hd = q.size(2), q.size(3)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
            att = att.masked_fill(mask, float("-inf"))
        att = torch.softmax(att, -1)
        if self.attn_dropout > 0.0:
            att = F.dropout(att, self.attn_dropout, self.training)
        return torch.matmul(att, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t = x.size(0), x.size(1)
        hd = self.d_model // self.n_head
        q, k, v = (y.view(b, t, self.n_head, hd).transpose(1, 2)
                   for y in self.qkv(x).split(self.d_model, dim=-1))
        y = self.core(q, k, v).transpose(1, 2).reshape(b, t, self.d_model)
        return self.proj(y)


class FeedForward(nn.Module):
    """proj(gelu(fc(x))); approximate "tanh" for GPT-2, "none" (exact erf) for BERT."""

    def __init__(self, d_model: int, d_ff: int, approximate: str):
        super().__init__()
        self.approximate = approximate
        self.fc = nn.Linear(d_model, d_ff)
        self.proj = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate=self.approximate))


def init_transformer_weights(module: nn.Module, std: float = 0.02) -> None:
    """init_transformer_weights (transformer.cpp): normal(0, std) Linear/Embedding weights,
    zero Linear biases, LayerNorm 1/0, on every descendant (not `module` itself)."""
    with torch.no_grad():
        for m in module.modules():
            if m is module:
                continue
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0.0, std)
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()


def _check_ids(ids: torch.Tensor, seq_len: int, who: str) -> torch.Tensor:
    """check_ids (transformer.cpp): [B,T] int64 with T <= seq_len; returns arange(T)."""
    if ids.dim() != 2:
        raise ValueError(f"{who}: expected token ids [B,T], got {list(ids.shape)}")
    if ids.dtype != torch.int64:
        raise ValueError(f"{who}: token ids must be int64, got {ids.dtype}")
    if ids.size(1) > seq_len:
        raise ValueError(f"{who}: sequence length {ids.size(1)} exceeds model.seq_len = {seq_len}")
    return torch.arange(ids.size(1), dtype=torch.int64, device=ids.device)


def _ff_width(c: Mapping[str, Any]) -> int:
    return c["d_ff"] if c["d_ff"] > 0 else 4 * c["d_model"]


# ---- GPT (models/include/leantrain/models/gpt.h) ----


class GPTBlock(nn.Module):
    """Pre-LN: x + dropout(attn(ln1(x))), then h + dropout(mlp(ln2(h))). LayerNorm eps 1e-5."""

    def __init__(self, d_model: int, n_head: int, d_ff: int, dropout: float, attention: str = "sdpa"):
        super().__init__()
        self.dropout = dropout
        # Registration order as GPTBlockImpl: ln1, attn, ln2, mlp.
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = SelfAttention(d_model, n_head, dropout, causal=True, attention=attention)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.mlp = FeedForward(d_model, d_ff, "tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # C++ calls torch::dropout unconditionally (p may be 0): a no-op then, and in eval.
        h = x + F.dropout(self.attn(self.ln1(x)), self.dropout, self.training)
        return h + F.dropout(self.mlp(self.ln2(h)), self.dropout, self.training)


class GPT(nn.Module):
    """GPT-2: wte, wpe, blocks, ln_f; logits = ln_f(x) @ wte.weight^T (tied, no head parameter)."""

    def __init__(self, c: Mapping[str, Any]):
        super().__init__()
        self.seq_len, self.dropout = c["seq_len"], c["dropout"]
        self.wte = nn.Embedding(c["vocab_size"], c["d_model"])
        self.wpe = nn.Embedding(c["seq_len"], c["d_model"])
        self.blocks = nn.ModuleList(
            GPTBlock(c["d_model"], c["n_head"], _ff_width(c), c["dropout"], c["attention"])
            for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["d_model"], eps=1e-5)
        init_transformer_weights(self)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        pos = _check_ids(ids, self.seq_len, "GPT")
        x = F.dropout(self.wte(ids) + self.wpe(pos), self.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.linear(self.hidden(ids), self.wte.weight)  # [B,T,V]


# ---- BERT (models/include/leantrain/models/bert.h) ----


class BertBlock(nn.Module):
    """Post-LN: ln1(x + dropout(attn(x))), then ln2(h + dropout(mlp(h))). eps 1e-12, erf GELU,
    bidirectional attention without any padding mask."""

    def __init__(self, d_model: int, n_head: int, d_ff: int, dropout: float, attention: str = "sdpa"):
        super().__init__()
        self.dropout = dropout
        # Registration order as BertBlockImpl: attn, ln1, mlp, ln2.
        self.attn = SelfAttention(d_model, n_head, dropout, causal=False, attention=attention)
        self.ln1 = nn.LayerNorm(d_model, eps=1e-12)
        self.mlp = FeedForward(d_model, d_ff, "none")
        self.ln2 = nn.LayerNorm(d_model, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x + F.dropout(self.attn(x), self.dropout, self.training))
        return self.ln2(h + F.dropout(self.mlp(h), self.dropout, self.training))


class MLMHead(nn.Module):
    """ln(gelu_erf(dense(x))) @ decoder_weight^T + bias; the decoder weight is tok_emb.weight."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.ln = nn.LayerNorm(d_model, eps=1e-12)
        # `mlm.bias`. Own parameters come before the children's in both LibTorch's and
        # PyTorch's named_parameters(), so the order matches the C++ one too.
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        h = self.ln(F.gelu(self.dense(x)))  # torch::gelu default: exact erf
        return F.linear(h, decoder_weight, self.bias)


class Bert(nn.Module):
    """BERT-base with the masked-LM head (no pooler, no NSP head); token type 0 everywhere."""

    def __init__(self, c: Mapping[str, Any]):
        super().__init__()
        self.seq_len, self.dropout = c["seq_len"], c["dropout"]
        d = c["d_model"]
        self.tok_emb = nn.Embedding(c["vocab_size"], d)
        self.pos_emb = nn.Embedding(c["seq_len"], d)
        self.type_emb = nn.Embedding(c["type_vocab_size"], d)
        self.emb_ln = nn.LayerNorm(d, eps=1e-12)
        self.blocks = nn.ModuleList(
            BertBlock(d, c["n_head"], _ff_width(c), c["dropout"], c["attention"]) for _ in range(c["n_layer"]))
        self.mlm = MLMHead(d, c["vocab_size"])
        init_transformer_weights(self)
        with torch.no_grad():
            self.mlm.bias.zero_()

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        pos = _check_ids(ids, self.seq_len, "BERT")
        # Same order of additions as Bert::hidden: (tok + pos) + type_emb.weight[0].
        x = self.tok_emb(ids) + self.pos_emb(pos) + self.type_emb.weight[0]
        x = F.dropout(self.emb_ln(x), self.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlm(self.hidden(ids), self.tok_emb.weight)  # [B,T,V]


# ---------------------------------------------------------------------------------------------
# ResNet (models/include/leantrain/models/resnet.h, models/src/resnet.cpp)
# BatchNorm2d with LibTorch's defaults, which equal PyTorch's: eps 1e-5, momentum 0.1, affine,
# tracking running stats; buffers running_mean, running_var, num_batches_tracked (0-d int64).


def _conv(cin: int, cout: int, k: int, stride: int, pad: int) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=pad, bias=False)


class Downsample(nn.Module):
    """Shortcut: bn(conv1x1/stride(x))."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv = _conv(cin, cout, 1, stride, 0)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = _conv(cin, planes, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv(planes, planes, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(planes)
        self.down = (Downsample(cin, planes * self.expansion, stride)
                     if stride != 1 or cin != planes * self.expansion else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.down(x) if self.down is not None else x))


class Bottleneck(nn.Module):
    """torchvision v1.5: the stride is on the 3x3 conv2."""
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = _conv(cin, planes, 1, 1, 0)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv(planes, planes, 3, stride, 1)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv(planes, planes * self.expansion, 1, 1, 0)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.down = (Downsample(cin, planes * self.expansion, stride)
                     if stride != 1 or cin != planes * self.expansion else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (self.down(x) if self.down is not None else x))


class ResNetStem(nn.Module):
    """imagenet: relu(bn(conv7x7/2 pad 3)) then max_pool 3x3/2 pad 1; small: relu(bn(conv3x3/1 pad 1))."""

    def __init__(self, in_channels: int, width: int, kind: str):
        super().__init__()
        self.pool = kind == "imagenet"
        self.conv = _conv(in_channels, width, 7, 2, 3) if self.pool else _conv(in_channels, width, 3, 1, 1)
        self.bn = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        if self.pool:
            y = F.max_pool2d(y, kernel_size=3, stride=2, padding=1)
        return y


class ResNet(nn.Module):
    """stem -> blocks (numbered across all stages) -> adaptive_avg_pool2d(1).flatten(1) -> fc.
    Stage s has planes = width * 2**s; its first block has stride 2 when s > 0."""

    def __init__(self, c: Mapping[str, Any]):
        super().__init__()
        layers, block = resnet_layout(c)
        cls = Bottleneck if block == "bottleneck" else BasicBlock
        self.stem = ResNetStem(c["in_channels"], c["width"], c["stem"])
        self.blocks = nn.ModuleList()
        cin = c["width"]
        for s, n in enumerate(layers):
            planes = c["width"] << s
            for j in range(n):
                self.blocks.append(cls(cin, planes, 2 if (s > 0 and j == 0) else 1))
                cin = planes * cls.expansion
        self.fc = nn.Linear(cin, c["num_classes"])
        # torchvision init as the C++ constructor: kaiming normal (fan_out, relu) convs,
        # BN weight 1 bias 0; fc keeps the default Linear init.
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, a=0.0, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    m.weight.fill_(1.0)
                    m.bias.zero_()
        # Note [Channels-last ResNet] in models/src/resnet.cpp: the same layout as the C++ model.
        self.channels_last = c["memory_format"] == "channels_last"
        if self.channels_last:
            self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"ResNet: expected images [B,C,H,W], got {list(x.shape)}")
        if self.channels_last:
            x = x.to(memory_format=torch.channels_last)
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        x = F.adaptive_avg_pool2d(x, (1, 1)).flatten(1)
        return self.fc(x)


# ---------------------------------------------------------------------------------------------
# MLP (models/include/leantrain/models/mlp.h, models/src/model.cpp)


class MLPBlock(nn.Module):
    """dropout(relu(fc(x))); dropout only when p > 0 (and training)."""

    def __init__(self, cin: int, cout: int, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.fc = nn.Linear(cin, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.fc(x))
        if self.dropout > 0.0:
            y = F.dropout(y, self.dropout, self.training)
        return y


class MLP(nn.Module):
    """Flatten to [B, C*H*W] (reshape, C order) -> blocks -> head."""

    def __init__(self, c: Mapping[str, Any]):
        super().__init__()
        self.in_features = c["in_channels"] * c["image_size"] * c["image_size"]
        # With hidden = [] the C++ model never registers `blocks`; an empty ModuleList here
        # holds no tensors, so the state_dict keys are the same.
        self.blocks = nn.ModuleList()
        cin = self.in_features
        for h in c["hidden"]:
            self.blocks.append(MLPBlock(cin, h, c["dropout"]))
            cin = h
        self.head = nn.Linear(cin, c["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 1 or x.numel() != x.size(0) * self.in_features:
            raise ValueError(f"MLP: expected {self.in_features} features per sample, got input {list(x.shape)}")
        x = x.reshape(x.size(0), self.in_features)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# ---------------------------------------------------------------------------------------------

_KINDS = {"gpt": GPT, "bert": Bert, "resnet": ResNet, "mlp": MLP}


def build_model(model_cfg: Mapping[str, Any], device: Optional[torch.device | str] = None) -> nn.Module:
    """The reference model for a leantrain `model` config section, initialised as the C++
    constructor does (same distributions, not the same numbers), in fp32, in training mode like
    a fresh nn.Module. device="meta" builds it without allocating (for counting parameters or
    for load_state_dict(..., assign=True))."""
    c = resolve_model_config(model_cfg)
    if device is None:
        return _KINDS[c["kind"]](c)
    if torch.device(device).type == "meta":
        with torch.device("meta"), _SkipInPlaceOnMeta():
            return _KINDS[c["kind"]](c)
    with torch.device(device):
        return _KINDS[c["kind"]](c)


class _SkipInPlaceOnMeta(torch.overrides.TorchFunctionMode):
    """Skips in-place ops (the initialisers' normal_, uniform_, fill_, zero_ ...) on meta
    tensors: they compute nothing there, and the first one imports torch's Python decompositions
    (about 3 s), which would make every checkpoint load pay for an init it does not need."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.endswith("__"):
            # Tensor.normal_(t, ...) passes t first; torch.nn.init.normal_ passes tensor=t.
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


def count_parameters(module: nn.Module) -> int:
    """Unique parameter elements, as lt::models::count_parameters (a tied weight counts once;
    here the tied heads have no parameter of their own anyway)."""
    return sum(p.numel() for p in module.parameters())
