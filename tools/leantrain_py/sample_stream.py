"""leantrain's data-layer random numbers and synthetic training stream, rebuilt in Python:
for the PyTorch peer (bench/peers/ddp_recipe.py) and tests/python/test_against_cpp.py.

The peer must train on exactly the samples leantrain trains on, in the same order and split
the same way across ranks and micro-batches. leantrain's data layer is deterministic and
documented (docs/ARCHITECTURE.md "Sampling invariant"); this file follows, function for
function:

    data/src/rng.h        bounded, uniform01, normal_pair (Box-Muller), stream tags
    data/src/sampling.cpp splitmix64, mix_seed, epoch_permutation (Fisher-Yates over
                          std::mt19937_64), micro_batch_indices
    data/src/samples.cpp  bert_mask, TokenRules, ImageTemplates
    data/src/datasets.cpp the synthetic LM / image datasets (BERT: [MASK] = vocab_size-1)

std::mt19937_64 is implemented with numpy (the twist vectorised in three slices), so a
224x224x3 image (150,528 raw draws) costs milliseconds, not seconds. If the C++ data layer
changes, this file has to follow; bench/peers/compare.py --scale smoke checks that both sides
report the same losses (a different sample shows at once with its high learning rate).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

M64 = (1 << 64) - 1
_N, _M = 312, 156
_MATRIX_A = np.uint64(0xB5026F5AA96619E9)
_UPPER = np.uint64(0xFFFFFFFF80000000)
_LOWER = np.uint64(0x7FFFFFFF)

STREAM_MASK = 0x6D61736B
STREAM_SYNTH_TRAIN = 0x74726E
STREAM_SYNTH_EVAL = 0x65766C
STREAM_TEMPLATES = 0x746D706C
STREAM_RULES = 0x72756C65


class MT19937_64:
    """std::mt19937_64 seeded with one integer; draw(n) returns the next n outputs (uint64)."""

    def __init__(self, seed: int):
        mt = [seed & M64]
        for i in range(1, _N):
            mt.append((6364136223846793005 * (mt[-1] ^ (mt[-1] >> 62)) + i) & M64)
        self.mt = np.array(mt, dtype=np.uint64)
        self.buf = np.empty(0, dtype=np.uint64)
        self.pos = _N  # the first draw twists

    def _twist(self) -> None:
        mt = self.mt
        one, s1 = np.uint64(1), np.uint64(1)
        # k in [0, 156): mt[k+1] and mt[k+156] are still the old values.
        x = (mt[0:_M] & _UPPER) | (mt[1:_M + 1] & _LOWER)
        mt[0:_M] = mt[_M:_N] ^ (x >> s1) ^ np.where(x & one, _MATRIX_A, np.uint64(0))
        # k in [156, 311): mt[k+1] old, mt[k-156] new (just computed).
        x = (mt[_M:_N - 1] & _UPPER) | (mt[_M + 1:_N] & _LOWER)
        mt[_M:_N - 1] = mt[0:_N - 1 - _M] ^ (x >> s1) ^ np.where(x & one, _MATRIX_A, np.uint64(0))
        # k = 311: mt[0] is new.
        x = (int(mt[_N - 1]) & 0xFFFFFFFF80000000) | (int(mt[0]) & 0x7FFFFFFF)
        mt[_N - 1] = np.uint64(int(mt[_M - 1]) ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0))
        y = mt.copy()
        y ^= (y >> np.uint64(29)) & np.uint64(0x5555555555555555)
        y ^= (y << np.uint64(17)) & np.uint64(0x71D67FFFEDA60000)
        y ^= (y << np.uint64(37)) & np.uint64(0xFFF7EEE000000000)
        y ^= y >> np.uint64(43)
        self.buf = y
        self.pos = 0

    def draw(self, n: int) -> np.ndarray:
        out = []
        while n > 0:
            if self.pos >= _N:
                self._twist()
            take = min(n, _N - self.pos)
            out.append(self.buf[self.pos:self.pos + take])
            self.pos += take
            n -= take
        return np.concatenate(out) if len(out) != 1 else out[0].copy()

    def __call__(self) -> int:
        if self.pos >= _N:
            self._twist()
        v = int(self.buf[self.pos])
        self.pos += 1
        return v


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def mix_seed(parts: Sequence[int]) -> int:
    h = 0x6A09E667F3BCC909
    for p in parts:
        h = splitmix64(h ^ splitmix64(p & M64))
    return h


def bounded(rng: MT19937_64, n: int) -> int:
    threshold = ((1 << 64) - n) % n
    while True:
        x = rng()
        if x >= threshold:
            return x % n


def uniform01(rng: MT19937_64) -> float:
    return (rng() >> 11) * 2.0**-53


def _uniform01_array(raw: np.ndarray) -> np.ndarray:
    return (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53


def normals(rng: MT19937_64, n: int) -> np.ndarray:
    """n N(0,1) draws as rng.h normal_pair produces them, pair by pair (n rounded up to even)."""
    pairs = (n + 1) // 2
    u = _uniform01_array(rng.draw(2 * pairs)).reshape(pairs, 2)
    u1 = 1.0 - u[:, 0]
    u2 = u[:, 1]
    r = np.sqrt(-2.0 * np.log(u1))
    out = np.empty((pairs, 2), dtype=np.float64)
    out[:, 0] = r * np.cos(6.283185307179586 * u2)
    out[:, 1] = r * np.sin(6.283185307179586 * u2)
    return out.reshape(-1)[:n]


# ---- sampling.cpp ----

def epoch_permutation(n: int, seed: int, epoch: int) -> List[int]:
    perm = list(range(n))
    rng = MT19937_64(mix_seed([seed, epoch]))
    for i in range(n - 1, 0, -1):
        j = bounded(rng, i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def micro_batch_indices(perm: Sequence[int], k: int, micro: int, accumulation: int, world: int,
                        rank: int, j: int) -> List[int]:
    g = world * accumulation * micro
    begin = k * g + (rank * accumulation + j) * micro
    return list(perm[begin:begin + micro])


# ---- samples.cpp ----

def bert_mask(tokens: List[int], seed: int, epoch: int, index: int, p: float, mask_token: int,
              random_vocab: int) -> Tuple[List[int], List[int]]:
    rng = MT19937_64(mix_seed([seed, STREAM_MASK, epoch, index]))
    inp, t = list(tokens), len(tokens)
    chosen = [uniform01(rng) < p for _ in range(t)]
    if not any(chosen):
        chosen[bounded(rng, t)] = True
    target = [-100] * t
    for q in range(t):
        if chosen[q]:
            target[q] = inp[q]
            r = uniform01(rng)
            if r < 0.8:
                inp[q] = mask_token
            elif r < 0.9:
                inp[q] = bounded(rng, random_vocab)
    return inp, target


class TokenRules:
    def __init__(self, seed: int, vocab: int):
        self.vocab = vocab
        rng = MT19937_64(mix_seed([seed, STREAM_RULES]))
        self.a, self.b = [], []
        for _ in range(4):
            self.a.append(1 + bounded(rng, vocab - 1) if vocab > 1 else 1)
            self.b.append(bounded(rng, vocab))

    def sample(self, length: int, seed: int, stream: int, index: int) -> List[int]:
        rng = MT19937_64(mix_seed([seed, stream, index]))
        r = bounded(rng, 4)
        t = bounded(rng, self.vocab)
        a, b, v = self.a[r], self.b[r], self.vocab
        out = []
        for _ in range(length):
            out.append(t)
            t = (a * t + b) % v
        return out


class ImageTemplates:
    def __init__(self, seed: int, channels: int, size: int, classes: int):
        self.channels, self.size, self.classes = channels, size, classes
        self.grid = min(4, size)
        rng = MT19937_64(mix_seed([seed, STREAM_TEMPLATES]))
        f = channels * self.grid * self.grid
        self.weights = normals(rng, classes * f).reshape(classes, f)

    def sample(self, seed: int, stream: int, index: int) -> Tuple[np.ndarray, int]:
        c, s, g = self.channels, self.size, self.grid
        rng = MT19937_64(mix_seed([seed, stream, index]))
        img = normals(rng, c * s * s).astype(np.float32).reshape(c, s, s)
        # Average pool to g x g cells (boundaries i*size/grid), in double as samples.cpp.
        feat = np.empty((c, g, g), dtype=np.float64)
        for gy in range(g):
            y0, y1 = gy * s // g, (gy + 1) * s // g
            for gx in range(g):
                x0, x1 = gx * s // g, (gx + 1) * s // g
                feat[:, gy, gx] = img[:, y0:y1, x0:x1].astype(np.float64).sum(axis=(1, 2)) / ((y1 - y0) * (x1 - x0))
        scores = self.weights @ feat.reshape(-1)
        return img, int(np.argmax(scores))  # argmax: the first maximum, as the strict > in C++


# ---- datasets.cpp: the synthetic train split ----

class SyntheticTrain:
    """The training split of data.kind = "synthetic" for a model config (leantrain's JSON)."""

    def __init__(self, model: dict, data: dict):
        self.kind = model["kind"]
        self.seed = int(data.get("seed", 1234))
        self.size = int(data.get("synthetic_samples", 4096))
        if data.get("limit", 0):
            self.size = min(self.size, int(data["limit"]))
        if self.kind in ("gpt", "bert", "llama"):  # token models: the data depends only on seq_len and vocab_size
            self.bert = self.kind == "bert"
            self.seq_len = int(model["seq_len"])
            vocab = int(model["vocab_size"]) - (1 if self.bert else 0)
            self.mask_token = int(model["vocab_size"]) - 1
            self.random_vocab = vocab
            self.mask_prob = float(data.get("mask_prob", 0.15))
            self.rules = TokenRules(self.seed, vocab)
        elif self.kind == "resnet":
            self.templates = ImageTemplates(self.seed, int(model["in_channels"]), int(model["image_size"]),
                                            int(model["num_classes"]))
        else:
            raise ValueError(f"model.kind {self.kind!r}: the peer bench covers gpt, bert, llama and resnet")

    def get(self, indices: Sequence[int], epoch: int) -> Tuple[np.ndarray, np.ndarray]:
        if self.kind == "resnet":
            xs, ys = zip(*(self.templates.sample(self.seed, STREAM_SYNTH_TRAIN, i) for i in indices))
            return np.stack(xs), np.array(ys, dtype=np.int64)
        t = self.seq_len
        xs, ys = [], []
        for i in indices:
            w = self.rules.sample(t + 1, self.seed, STREAM_SYNTH_TRAIN, i)
            if self.bert:
                x, y = bert_mask(w[:t], self.seed, epoch, i, self.mask_prob, self.mask_token, self.random_vocab)
            else:
                x, y = w[:t], w[1:]
            xs.append(x)
            ys.append(y)
        return np.array(xs, dtype=np.int64), np.array(ys, dtype=np.int64)
