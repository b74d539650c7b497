#include "leantrain/recompute/packed_activation.h"
#include "leantrain/recompute/conv_products.h"
#include "leantrain/recompute/host_readback.h"
#include "conv_geometry.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <optional>
#include <type_traits>
#include <variant>

#include <atomic>
#include <cstring>
#include <mutex>
#include <immintrin.h>

namespace lt::recompute {

// Note [Packed block inputs]
// A recomputed ResNet keeps one tensor per block: its input, the previous block's ReLU
// output (Note [ResNet recompute units]). At ResNet-50's size those inputs alone are
// 0.26x of the whole plain activation memory, so `full` could not reach 0.25x
// however small its reruns. ReLU outputs are exactly zero in a third to a half of their
// elements, so each split block keeps its input as the nonzero values plus one bit per
// element (pack_tensor) and rebuilds it exactly in the rerun (Note [Packed input kept
// through the rerun]); a tensor where that would not be smaller (the stem's max-pool
// output is nearly dense) is kept as it is. For that to free anything, nothing else may
// hold the full tensor: the ReLU after the residual sum, whose autograd node would save
// its output, is mask_relu, which saves one bit per element instead. Packing and unpacking
// copy bit patterns exactly (only -0.0 becomes +0.0, which no convolution can tell apart),
// so fp32 gradients stay bitwise equal.
// This is "sparse storage, dense compute" of Gist (Jain et al., ISCA 2018), without its
// lossy encodings.
//
// The work is in memory order, so a channels-last tensor packs and unpacks as it lies. On
// the CPU each pass is a parallel loop over chunks of 32768 elements: the first writes the
// bits and counts each chunk's nonzeros, which gives each chunk's first position in
// `values`; the second moves the values. With AVX-512 (F, BW, VBMI2) a vector compresses
// or expands 16 fp32 or 32 bf16/fp16 elements under its 16- or 32-bit piece of the mask
// (vpcompress/vpexpand), so both passes run at memory speed (8-10x the portable loops
// measured on a [8, 256, 56, 56] tensor). The portable loops move only the set bits of
// each byte. Zero is tested on the bit pattern without its sign bit, which is "x != 0" for
// IEEE floats, NaN included. On other devices the same layout is built from torch ops
// (Note [Packing without a host sync]) and unpacked with masked_scatter_.

// Note [Packing without a host sync]
// `values` cannot be allocated before the number of nonzeros is known on the host, and on a
// GPU reading it (a count's `.item()`, or masked_select, which counts inside) drains the
// stream: twice per split ResNet unit under `full`. So a sync-free pack (on any device but the
// CPU) queues, at once, the bits and the nonzeros of each of at most 8 chunks of the tensor,
// copied to the host behind the queue (Note [Counts read behind the queue],
// host_readback.cpp), and keeps the tensor. Its values are gathered later, once the counts
// have long arrived: at the thread's next sync-free pack (the next block's, when this block's
// forward has been queued behind the counts) or at the first unpack or packed_bytes (backward),
// whichever comes first. Each chunk's nonzeros are then nonzero_static of the chunk, sized by
// its count (no read-back), and index_select into their place in `values`; the tensor is let
// go. The layout is the one the CPU builds, bit for bit (tested on the CPU against it). The
// price: a block input lives on until the next block's pack, when its successor is alive
// anyway; the gather's int64 indices are one chunk's (max(2^20, numel / 8) elements), not the
// whole tensor's. The pack is shared by its copies (the units that keep it),
// and a mutex makes the gather happen once whichever thread asks first.

namespace {

constexpr int64_t kChunk = 1 << 15;  // elements per parallel chunk; a multiple of every vector width

std::atomic<bool>& vector_kernels_flag() {
  static std::atomic<bool> on{__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                              __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("popcnt")};
  return on;
}

template <typename U>
constexpr U magnitude_mask() {
  return static_cast<U>(~(U(1) << (8 * sizeof(U) - 1)));
}

int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

// ---- portable loops, one chunk [lo, hi) each (lo a multiple of 8) ----

template <typename U>
int64_t bits_portable(const U* x, int64_t lo, int64_t hi, uint8_t* bits) {
  int64_t count = 0;
  for (int64_t k = lo; k < hi; k += 8) {
    unsigned v = 0;
    for (int64_t j = 0; j < 8 && k + j < hi; ++j) v |= static_cast<unsigned>((x[k + j] & magnitude_mask<U>()) != 0) << j;
    bits[k >> 3] = static_cast<uint8_t>(v);
    count += __builtin_popcount(v);
  }
  return count;
}

template <typename U>
void compress_portable(const U* x, int64_t lo, int64_t hi, const uint8_t* bits, U* dst) {
  for (int64_t k = lo; k < hi; k += 8)
    for (unsigned b = bits[k >> 3]; b; b &= b - 1) *dst++ = x[k + __builtin_ctz(b)];
}

template <typename U>
void expand_portable(const U* src, int64_t lo, int64_t hi, const uint8_t* bits, U* dst) {
  std::memset(dst + lo, 0, static_cast<size_t>(hi - lo) * sizeof(U));
  for (int64_t k = lo; k < hi; k += 8)
    for (unsigned b = bits[k >> 3]; b; b &= b - 1) dst[k + __builtin_ctz(b)] = *src++;
}

// All ones where element k's bit is set, else zero.
template <typename U>
U lane_mask(const uint8_t* bits, int64_t k) {
  return static_cast<U>(-static_cast<U>((bits[k >> 3] >> (k & 7)) & 1));
}

template <typename U>
void select_portable(const U* g, int64_t lo, int64_t hi, const uint8_t* bits, U* dst) {
  for (int64_t k = lo; k < hi; ++k) dst[k] = g[k] & lane_mask<U>(bits, k);
}

// x[k] * (value where bit k is set, else 0), as ATen multiplies two tensors of T: in
// at::opmath_type<T> (float for bf16 and fp16), rounded to T.
template <typename T>
void scale_portable(const T* x, T value, int64_t lo, int64_t hi, const uint8_t* bits, T* dst) {
  using Op = at::opmath_type<T>;
  const Op v = static_cast<Op>(value);
  for (int64_t k = lo; k < hi; ++k)
    dst[k] = static_cast<T>(static_cast<Op>(x[k]) * (((bits[k >> 3] >> (k & 7)) & 1) ? v : Op(0)));
}

// ---- AVX-512: 16 lanes of 32 bits or 32 lanes of 16 bits per step ----

#define LT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi2,popcnt,bmi2")))

template <int W>
struct Lanes;  // W = element bytes

template <>
struct Lanes<4> {
  using Mask = __mmask16;
  static constexpr int64_t kN = 16;
  LT_AVX512 static Mask low(int64_t n) { return static_cast<Mask>(n >= 16 ? 0xFFFFu : (1u << n) - 1); }
  LT_AVX512 static __m512i load(Mask m, const void* p) { return _mm512_maskz_loadu_epi32(m, p); }
  LT_AVX512 static void store(void* p, Mask m, __m512i v) { _mm512_mask_storeu_epi32(p, m, v); }
  LT_AVX512 static Mask nonzero(Mask m, __m512i v) {
    return _mm512_mask_test_epi32_mask(m, v, _mm512_set1_epi32(0x7FFFFFFF));
  }
  LT_AVX512 static __m512i compress(Mask m, __m512i v) { return _mm512_maskz_compress_epi32(m, v); }
  LT_AVX512 static __m512i expand(Mask m, __m512i v) { return _mm512_maskz_expand_epi32(m, v); }
  LT_AVX512 static __m512i keep(Mask m, __m512i v) { return _mm512_maskz_mov_epi32(m, v); }
  LT_AVX512 static int count(Mask m) { return _mm_popcnt_u32(m); }
};

template <>
struct Lanes<2> {
  using Mask = __mmask32;
  static constexpr int64_t kN = 32;
  LT_AVX512 static Mask low(int64_t n) { return n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1; }
  LT_AVX512 static __m512i load(Mask m, const void* p) { return _mm512_maskz_loadu_epi16(m, p); }
  LT_AVX512 static void store(void* p, Mask m, __m512i v) { _mm512_mask_storeu_epi16(p, m, v); }
  LT_AVX512 static Mask nonzero(Mask m, __m512i v) {
    return _mm512_mask_test_epi16_mask(m, v, _mm512_set1_epi16(0x7FFF));
  }
  LT_AVX512 static __m512i compress(Mask m, __m512i v) { return _mm512_maskz_compress_epi16(m, v); }
  LT_AVX512 static __m512i expand(Mask m, __m512i v) { return _mm512_maskz_expand_epi16(m, v); }
  LT_AVX512 static __m512i keep(Mask m, __m512i v) { return _mm512_maskz_mov_epi16(m, v); }
  LT_AVX512 static int count(Mask m) { return _mm_popcnt_u32(m); }
};

// The mask of elements [k, k + kN), read from or written to `bits` (k a multiple of 8;
// only the bytes that cover elements below `hi` are touched).
// Whole masks are copied with a fixed size, which compiles to one move: a copy of a size
// known only at run time is a call to memcpy, and per 16 elements that call was most of
// the kernels' time (unpacking a [8, 256, 56, 56] fp32 tensor took 5.8 ms, 4x a clone).
template <typename L>
LT_AVX512 typename L::Mask read_mask(const uint8_t* bits, int64_t k, int64_t hi) {
  typename L::Mask m = 0;
  if (hi - k >= L::kN) {
    std::memcpy(&m, bits + (k >> 3), sizeof(m));
  } else {
    std::memcpy(&m, bits + (k >> 3), static_cast<size_t>((hi - k + 7) / 8));
  }
  return m;
}

template <typename L>
LT_AVX512 void write_mask(uint8_t* bits, int64_t k, int64_t hi, typename L::Mask m) {
  if (hi - k >= L::kN) {
    std::memcpy(bits + (k >> 3), &m, sizeof(m));
  } else {
    std::memcpy(bits + (k >> 3), &m, static_cast<size_t>((hi - k + 7) / 8));
  }
}

template <int W>
LT_AVX512 int64_t bits_avx512(const void* xv, int64_t lo, int64_t hi, uint8_t* bits) {
  using L = Lanes<W>;
  const char* x = static_cast<const char*>(xv);
  int64_t count = 0;
  for (int64_t k = lo; k < hi; k += L::kN) {
    const auto in = L::low(hi - k);
    const auto m = L::nonzero(in, L::load(in, x + k * W));
    write_mask<L>(bits, k, hi, m);
    count += L::count(m);
  }
  return count;
}

template <int W>
LT_AVX512 void compress_avx512(const void* xv, int64_t lo, int64_t hi, const uint8_t* bits, void* dstv) {
  using L = Lanes<W>;
  const char* x = static_cast<const char*>(xv);
  char* dst = static_cast<char*>(dstv);
  for (int64_t k = lo; k < hi; k += L::kN) {
    const auto m = read_mask<L>(bits, k, hi);
    if (!m) continue;
    const int c = L::count(m);
    L::store(dst, L::low(c), L::compress(m, L::load(L::low(hi - k), x + k * W)));
    dst += c * W;
  }
}

template <int W>
LT_AVX512 void expand_avx512(const void* srcv, int64_t lo, int64_t hi, const uint8_t* bits, void* dstv) {
  using L = Lanes<W>;
  const char* src = static_cast<const char*>(srcv);
  char* dst = static_cast<char*>(dstv);
  int64_t k = lo;
  // 64 elements per step from one 64-bit piece of the mask: the vectors' source offsets come
  // from popcounts of that one load, so the expands do not wait on each other (0.8 ms instead
  // of 1.1-1.4 ms for a [8, 256, 56, 56] fp32 tensor into touched memory, 2 threads).
  constexpr int kPer = 64 / L::kN;
  for (; k + 64 <= hi; k += 64) {
    uint64_t m64;
    std::memcpy(&m64, bits + (k >> 3), sizeof(m64));
    const char* s[kPer + 1];
    s[0] = src;
    for (int q = 0; q < kPer; ++q) s[q + 1] = s[q] + L::count(static_cast<typename L::Mask>(m64 >> (q * L::kN))) * W;
    for (int q = 0; q < kPer; ++q) {
      const auto m = static_cast<typename L::Mask>(m64 >> (q * L::kN));
      L::store(dst + (k + q * L::kN) * W, L::low(L::kN), L::expand(m, L::load(L::low((s[q + 1] - s[q]) / W), s[q])));
    }
    src = s[kPer];
  }
  for (; k < hi; k += L::kN) {
    const auto m = read_mask<L>(bits, k, hi);
    const int c = L::count(m);
    L::store(dst + k * W, L::low(hi - k), L::expand(m, L::load(L::low(c), src)));
    src += c * W;
  }
}

template <int W>
LT_AVX512 void select_avx512(const void* gv, int64_t lo, int64_t hi, const uint8_t* bits, void* dstv) {
  using L = Lanes<W>;
  const char* g = static_cast<const char*>(gv);
  char* dst = static_cast<char*>(dstv);
  for (int64_t k = lo; k < hi; k += L::kN) {
    const auto in = L::low(hi - k);
    L::store(dst + k * W, in, L::keep(read_mask<L>(bits, k, hi), L::load(in, g + k * W)));
  }
}

LT_AVX512 void scale_avx512(const float* x, float value, int64_t lo, int64_t hi, const uint8_t* bits, float* dst) {
  using L = Lanes<4>;
  const __m512 v = _mm512_set1_ps(value);
  int64_t k = lo;
  for (; k + L::kN <= hi; k += L::kN) {
    const __m512 s = _mm512_maskz_mov_ps(read_mask<L>(bits, k, hi), v);
    _mm512_storeu_ps(dst + k, _mm512_mul_ps(_mm512_loadu_ps(x + k), s));
  }
  if (k < hi) {
    const auto in = L::low(hi - k);
    const __m512 s = _mm512_maskz_mov_ps(read_mask<L>(bits, k, hi), v);
    _mm512_mask_storeu_ps(dst + k, in, _mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + k), s));
  }
}

// float -> bfloat16 as c10::BFloat16(float) rounds: to nearest even, a NaN to 0x7FC0.
LT_AVX512 __m256i bf16_from_float(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

LT_AVX512 __m512 float_from_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

LT_AVX512 void scale_avx512(const c10::BFloat16* x, c10::BFloat16 value, int64_t lo, int64_t hi, const uint8_t* bits,
                            c10::BFloat16* dst) {
  using L = Lanes<2>;
  const __m512 v = _mm512_set1_ps(static_cast<float>(value));
  for (int64_t k = lo; k < hi; k += L::kN) {
    const auto in = L::low(hi - k);
    const auto m = read_mask<L>(bits, k, hi);
    const __m512i raw = _mm512_maskz_loadu_epi16(in, x + k);
    const __m512 a = _mm512_mul_ps(float_from_bf16(_mm512_castsi512_si256(raw)),
                                   _mm512_maskz_mov_ps(static_cast<__mmask16>(m), v));
    const __m512 b = _mm512_mul_ps(float_from_bf16(_mm512_extracti64x4_epi64(raw, 1)),
                                   _mm512_maskz_mov_ps(static_cast<__mmask16>(m >> 16), v));
    const __m512i out = _mm512_inserti64x4(_mm512_castsi256_si512(bf16_from_float(a)), bf16_from_float(b), 1);
    _mm512_mask_storeu_epi16(dst + k, in, out);
  }
}

#undef LT_AVX512

// One chunk of scale_where: the vector kernel for fp32 and bf16 where there is one.
template <typename T>
void scale_chunk(bool vec, const T* x, T value, int64_t lo, int64_t hi, const uint8_t* bits, T* dst) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>)
    if (vec) return scale_avx512(x, value, lo, hi, bits, dst);
  scale_portable(x, value, lo, hi, bits, dst);
}

// ---- one element width, one chunk: the vector kernel where there is one, else the loop ----

template <int W>
struct Uint;
template <>
struct Uint<2> { using T = uint16_t; };
template <>
struct Uint<4> { using T = uint32_t; };
template <>
struct Uint<8> { using T = uint64_t; };

template <int W>
struct Kernels {
  using U = typename Uint<W>::T;
  static constexpr bool kVector = W == 2 || W == 4;
  static int64_t bits(bool vec, const void* x, int64_t lo, int64_t hi, uint8_t* b) {
    if constexpr (kVector) if (vec) return bits_avx512<W>(x, lo, hi, b);
    return bits_portable(static_cast<const U*>(x), lo, hi, b);
  }
  static void compress(bool vec, const void* x, int64_t lo, int64_t hi, const uint8_t* b, void* dst) {
    if constexpr (kVector) if (vec) return compress_avx512<W>(x, lo, hi, b, dst);
    compress_portable(static_cast<const U*>(x), lo, hi, b, static_cast<U*>(dst));
  }
  static void expand(bool vec, const void* src, int64_t lo, int64_t hi, const uint8_t* b, void* dst) {
    if constexpr (kVector) if (vec) return expand_avx512<W>(src, lo, hi, b, dst);
    expand_portable(static_cast<const U*>(src), lo, hi, b, static_cast<U*>(dst));
  }
  static void select(bool vec, const void* g, int64_t lo, int64_t hi, const uint8_t* b, void* dst) {
    if constexpr (kVector) if (vec) return select_avx512<W>(g, lo, hi, b, dst);
    select_portable(static_cast<const U*>(g), lo, hi, b, static_cast<U*>(dst));
  }
};

template <typename F>
void by_width(int64_t w, F&& f) {
  switch (w) {
    case 2: return f(Kernels<2>{});
    case 4: return f(Kernels<4>{});
    case 8: return f(Kernels<8>{});
    default: TORCH_CHECK(false, "packed activations: no kernel for ", w, "-byte elements");
  }
}

// Runs f(c, lo, hi) for every chunk c = [lo, hi) of n elements, chunks in parallel.
template <typename F>
void parallel_chunks(int64_t n, F&& f) {
  at::parallel_for(0, chunks_of(n), 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) f(c, c * kChunk, std::min(n, (c + 1) * kChunk));
  });
}

// parallel_chunks with the kernels of w-byte elements: f(kernels, c, lo, hi).
template <typename F>
void for_each_chunk(int64_t n, int64_t w, F&& f) {
  by_width(w, [&](auto k) { parallel_chunks(n, [&](int64_t c, int64_t lo, int64_t hi) { f(k, c, lo, hi); }); });
}

bool packable(const at::Tensor& x) {
  return at::isFloatingType(x.scalar_type()) && x.numel() > 0 && x.is_non_overlapping_and_dense();
}

// x's elements in memory order, as a 1-D view (x dense and non-overlapping).
at::Tensor flat(const at::Tensor& x) { return x.as_strided({x.numel()}, {1}, x.storage_offset()); }

// Bits of flat CPU tensor x and each chunk's first position among its nonzeros (the last
// entry is the count).
std::vector<int64_t> cpu_bits(const at::Tensor& x, uint8_t* bits) {
  const int64_t n = x.numel();
  std::vector<int64_t> offset(chunks_of(n) + 1, 0);
  const bool vec = packing_vector_kernels();
  for_each_chunk(n, x.element_size(), [&](auto k, int64_t c, int64_t lo, int64_t hi) {
    offset[c + 1] = k.bits(vec, x.data_ptr(), lo, hi, bits);
  });
  for (size_t c = 1; c < offset.size(); ++c) offset[c] += offset[c - 1];
  return offset;
}

std::vector<int64_t> cpu_offsets(const uint8_t* bits, int64_t n) {
  std::vector<int64_t> offset(chunks_of(n) + 1, 0);
  parallel_chunks(n, [&](int64_t c, int64_t lo, int64_t hi) {
    int64_t count = 0;
    const int64_t end = (hi + 7) / 8;  // bytes
    int64_t i = lo / 8;
    for (; i + 8 <= end; i += 8) {
      uint64_t w;
      std::memcpy(&w, bits + i, 8);
      count += __builtin_popcountll(w);
    }
    for (; i < end; ++i) count += __builtin_popcount(bits[i]);
    offset[c + 1] = count;
  });
  for (size_t c = 1; c < offset.size(); ++c) offset[c] += offset[c - 1];
  return offset;
}

// bool [n] <-> bits, with torch ops (any device).
at::Tensor bool_to_bits(const at::Tensor& mask) {
  auto m = mask.reshape(-1);
  const int64_t n = m.numel();
  if (n % 8) m = at::cat({m, at::zeros({8 - n % 8}, m.options())});
  auto bytes = m.view({-1, 8}).to(at::kByte);
  return bytes.bitwise_left_shift(at::arange(8, bytes.options())).sum(1, false, at::kByte);
}

// Note [Packing without a host sync]: at least 2^20 elements a chunk, at most 8 chunks.
int64_t gather_chunk(int64_t n) { return std::max<int64_t>(int64_t{1} << 20, (n + 7) / 8); }

c10::Stream current_stream(const c10::Device& device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

at::Tensor bits_to_bool(const at::Tensor& bits, int64_t n) {
  return bits.unsqueeze(1).bitwise_right_shift(at::arange(8, bits.options())).bitwise_and(1).to(at::kBool).reshape(-1).narrow(0, 0, n);
}

// Note [Shared ReLU bits]: a block input is the previous block's mask_relu output, whose
// backward keeps exactly the bits pack_tensor would compute (a ReLU output is nonzero where
// it is not <= 0). mask_relu leaves its output and bits here, and pack_tensor of that same
// tensor, not modified since (same version), takes them instead of computing a second copy:
// one pass and 1/32 of an fp32 tensor (1/16 of a bf16 one) less per block. One entry per
// thread; it holds the output only weakly.
struct LastReluBits {
  c10::weak_intrusive_ptr<c10::TensorImpl> out{c10::intrusive_ptr<c10::TensorImpl>()};
  int64_t version = 0;
  at::Tensor bits;
};

LastReluBits& last_relu_bits() {
  thread_local LastReluBits last;
  return last;
}

at::Tensor shared_bits_of(const at::Tensor& x) {
  auto& last = last_relu_bits();
  if (!last.bits.defined() || last.out.lock().get() != x.unsafeGetTensorImpl() || x._version() != last.version)
    return at::Tensor();
  return last.bits;
}

}  // namespace

// A sync-free pack until its values are gathered (Note [Packing without a host sync]).
struct DeferredPack {
  std::mutex mutex;
  at::Tensor x;              // the packed tensor (dense), until gathered
  int64_t version = 0;       // x's when packed: it must not change before the gather
  int64_t chunk = 0;         // elements per chunk of the gather
  HostReadback counts;       // nonzeros per chunk
  std::optional<c10::Stream> stream;  // where the pack's kernels were queued
  at::Tensor bits, values;   // the pack's, once gathered
  bool gathered = false;
};

namespace {

// The thread's last sync-free pack, gathered by its next one (held weakly: a pack nobody
// keeps any more is gone, its tensor with it).
std::weak_ptr<DeferredPack>& last_deferred() {
  thread_local std::weak_ptr<DeferredPack> last;
  return last;
}

void gather(DeferredPack& d) {
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.gathered) return;
  TORCH_CHECK(d.x._version() == d.version,
              "pack_tensor: the packed tensor was modified in place before its values were gathered");
  at::NoGradGuard no_grad;
  const auto f = flat(d.x);
  // The gather runs on the caller's stream (backward's may differ from the forward's): it
  // waits for the pack's kernels, and x's memory is not reused before the gather has read it.
  const auto here = current_stream(f.device());
  if (here != *d.stream) {
    c10::Event packed(here.device_type());
    packed.record(*d.stream);
    packed.block(here);
    d.x.record_stream(here);
  }
  const auto& counts = d.counts.values();
  const int64_t n = f.numel(), w = f.element_size(), nbytes = (n + 7) / 8;
  const int64_t nnz = d.counts.sum();
  if (nbytes + nnz * w >= n * w) {  // not smaller: kept as it is, as pack_tensor decides
    d.values = d.x;
    d.bits = at::Tensor();
  } else {
    d.values = at::empty({nnz}, f.options());
    int64_t to = 0;
    for (size_t c = 0; c < counts.size(); ++c) {
      if (counts[c] == 0) continue;
      const int64_t lo = static_cast<int64_t>(c) * d.chunk;
      const auto part = f.narrow(0, lo, std::min(d.chunk, n - lo));
      auto dst = d.values.narrow(0, to, counts[c]);
      // nonzero_static tests `!= 0` on the values themselves: the bits' rule, NaN kept, -0.0 not.
      at::index_select_out(dst, part, 0, at::nonzero_static(part, counts[c]).view({-1}));
      to += counts[c];
    }
  }
  d.x = at::Tensor();
  d.gathered = true;
}

PackedTensor pack_deferred(const at::Tensor& x, PackedTensor p) {
  if (auto previous = last_deferred().lock()) gather(*previous);
  const auto f = flat(x);
  const int64_t n = f.numel(), chunk = gather_chunk(n), chunks = (n + chunk - 1) / chunk;
  const auto mask = f != 0;
  const int64_t whole = (chunks - 1) * chunk;  // the chunks before the last, which may be short
  auto counts = mask.narrow(0, whole, n - whole).sum().reshape({1});
  if (chunks > 1) counts = at::cat({mask.narrow(0, 0, whole).view({chunks - 1, chunk}).sum(1), counts});
  auto d = std::make_shared<DeferredPack>();
  d->counts = HostReadback(counts);
  d->bits = bool_to_bits(mask);
  d->x = x;
  d->version = x._version();
  d->chunk = chunk;
  d->stream = current_stream(x.device());
  last_deferred() = d;
  p.values = at::Tensor();
  p.deferred = std::move(d);
  return p;
}

}  // namespace

PackedTensor resolved_pack(const PackedTensor& p) {
  if (!p.deferred) return p;
  gather(*p.deferred);  // its fields are final once gathered
  return {p.deferred->bits, p.deferred->values, p.sizes, p.strides, nullptr};
}

bool packing_vector_kernels() { return vector_kernels_flag().load(std::memory_order_relaxed); }

bool set_packing_vector_kernels(bool on) {
  static const bool available = vector_kernels_flag().load();
  return vector_kernels_flag().exchange(on && available);
}

at::Tensor nonzero_bits(const at::Tensor& x) {
  TORCH_CHECK(packable(x), "nonzero_bits: expected a dense floating-point tensor, got ", x.scalar_type(), " ",
              x.sizes(), " with strides ", x.strides());
  at::NoGradGuard no_grad;
  const int64_t n = x.numel();
  if (!x.device().is_cpu()) return bool_to_bits(flat(x) != 0);
  auto bits = at::empty({(n + 7) / 8}, x.options().dtype(at::kByte));
  cpu_bits(flat(x), bits.data_ptr<uint8_t>());
  return bits;
}

PackedTensor pack_tensor(const at::Tensor& x_in, std::optional<bool> sync_free) {
  at::NoGradGuard no_grad;
  if (!at::isFloatingType(x_in.scalar_type()) || x_in.numel() == 0) return {at::Tensor(), x_in, {}, {}};
  const at::Tensor x = x_in.is_non_overlapping_and_dense() ? x_in : x_in.contiguous();
  const int64_t n = x.numel(), w = x.element_size(), nbytes = (n + 7) / 8;
  PackedTensor p{at::Tensor(), x_in, x.sizes().vec(), x.strides().vec()};
  if (sync_free.value_or(!x.device().is_cpu())) return pack_deferred(x, std::move(p));
  if (!x.device().is_cpu()) {  // two host syncs: the count and masked_select's own
    auto mask = flat(x) != 0;
    const int64_t nnz = mask.sum().item<int64_t>();
    if (nbytes + nnz * w >= n * w) return p;
    p.bits = bool_to_bits(mask);
    p.values = flat(x).masked_select(mask);
    return p;
  }
  at::Tensor bits = shared_bits_of(x_in);
  std::vector<int64_t> offset;
  if (bits.defined()) {
    offset = cpu_offsets(bits.data_ptr<uint8_t>(), n);
  } else {
    bits = at::empty({nbytes}, x.options().dtype(at::kByte));
    offset = cpu_bits(flat(x), bits.data_ptr<uint8_t>());
  }
  if (nbytes + offset.back() * w >= n * w) return p;
  p.values = at::empty({offset.back()}, x.options());
  const bool vec = packing_vector_kernels();
  char* dst = static_cast<char*>(p.values.data_ptr());
  for_each_chunk(n, w, [&](auto k, int64_t c, int64_t lo, int64_t hi) {
    k.compress(vec, x.data_ptr(), lo, hi, bits.data_ptr<uint8_t>(), dst + offset[c] * w);
  });
  p.bits = std::move(bits);
  return p;
}

at::Tensor unpack_tensor(const PackedTensor& p) {
  if (p.deferred) return unpack_tensor(resolved_pack(p));
  if (!p.bits.defined()) return p.values;
  auto out = at::empty_strided(p.sizes, p.strides, p.values.options());
  const int64_t n = out.numel(), w = out.element_size();
  TORCH_CHECK(p.bits.numel() == (n + 7) / 8, "unpack_tensor: ", p.bits.numel(), " mask bytes for ", n, " elements");
  if (!out.device().is_cpu()) {
    auto f = flat(out);
    f.zero_();
    f.masked_scatter_(bits_to_bool(p.bits, n), p.values);
    return out;
  }
  const uint8_t* bits = p.bits.data_ptr<uint8_t>();
  const auto offset = cpu_offsets(bits, n);
  TORCH_CHECK(offset.back() == p.values.numel(), "unpack_tensor: the mask has ", offset.back(),
              " nonzeros, the values ", p.values.numel());
  const bool vec = packing_vector_kernels();
  const char* src = static_cast<const char*>(p.values.data_ptr());
  for_each_chunk(n, w, [&](auto k, int64_t c, int64_t lo, int64_t hi) {
    k.expand(vec, src + offset[c] * w, lo, hi, bits, out.data_ptr());
  });
  return out;
}

at::Tensor scale_where(const at::Tensor& x, const at::Tensor& bits, const at::Tensor& value) {
  TORCH_CHECK(packable(x), "scale_where: expected a dense floating-point tensor, got ", x.scalar_type(), " ",
              x.sizes(), " with strides ", x.strides());
  TORCH_CHECK(value.numel() == 1 && value.scalar_type() == x.scalar_type(), "scale_where: the value must be one ",
              x.scalar_type(), " element, got ", value.numel(), " of ", value.scalar_type());
  at::NoGradGuard no_grad;
  const int64_t n = x.numel();
  TORCH_CHECK(bits.scalar_type() == at::kByte && bits.numel() == (n + 7) / 8, "scale_where: ", bits.numel(),
              " mask bytes for ", n, " elements");
  if (!x.device().is_cpu()) {
    const auto scale = at::where(bits_to_bool(bits, n), value.reshape({}).to(x.device()), at::zeros({}, x.options()));
    return x * scale.as_strided(x.sizes(), x.strides());  // bits are in x's memory order
  }
  auto out = at::empty_like(x);
  const bool vec = packing_vector_kernels();
  const uint8_t* b = bits.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "scale_where", [&] {
    const scalar_t v = value.cpu().item<scalar_t>();
    const scalar_t* src = x.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    parallel_chunks(n, [&](int64_t, int64_t lo, int64_t hi) { scale_chunk(vec, src, v, lo, hi, b, dst); });
  });
  return out;
}

int64_t packed_bytes(const PackedTensor& p) {
  if (p.deferred) return packed_bytes(resolved_pack(p));
  return (p.bits.defined() ? static_cast<int64_t>(p.bits.nbytes()) : 0) +
         (p.values.defined() ? static_cast<int64_t>(p.values.nbytes()) : 0);
}

namespace {

// The bits of mask_relu and masked_scale are in their tensor's memory order, so the backward
// reads the gradient in that layout: save_layout keeps it, in_saved_layout copies a gradient
// that arrives in another.
void save_layout(torch::autograd::AutogradContext* ctx, const at::Tensor& t) {
  ctx->saved_data["sizes"] = t.sizes().vec();
  ctx->saved_data["strides"] = t.strides().vec();
}

at::Tensor in_saved_layout(torch::autograd::AutogradContext* ctx, const at::Tensor& g) {
  const auto strides = ctx->saved_data["strides"].toIntVector();
  if (g.strides() == at::IntArrayRef(strides)) return g;
  return at::empty_strided(ctx->saved_data["sizes"].toIntVector(), strides, g.options()).copy_(g);
}

// scale_where with autograd: the gradient is scaled by the same noise, as the product's
// backward (grad * noise) does; the graph keeps the bits, not the noise.
class MaskedScale : public torch::autograd::Function<MaskedScale> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                at::Tensor bits, at::Tensor value) {
    ctx->saved_data["bits"] = bits;
    ctx->saved_data["value"] = value;
    save_layout(ctx, x);
    return {scale_where(x, bits, value)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    return {scale_where(in_saved_layout(ctx, grad_out[0]), ctx->saved_data["bits"].toTensor(),
                        ctx->saved_data["value"].toTensor()),
            at::Tensor(), at::Tensor()};
  }
};

class MaskRelu : public torch::autograd::Function<MaskRelu> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    auto out = at::relu(x.is_non_overlapping_and_dense() ? x : x.contiguous());
    // relu's backward (threshold_backward) passes the gradient where the output is not
    // <= 0: a positive value or a NaN, which is what nonzero_bits keeps of a ReLU output.
    auto bits = nonzero_bits(out);
    ctx->save_for_backward({bits});
    if (out.device().is_cpu()) {
      auto& last = last_relu_bits();
      last.out = c10::weak_intrusive_ptr<c10::TensorImpl>(out.getIntrusivePtr());
      last.version = out._version();
      last.bits = bits;
    }
    save_layout(ctx, out);
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto bits = ctx->get_saved_variables()[0];
    const at::Tensor g = in_saved_layout(ctx, grad_out[0]);
    auto out = at::empty_strided(g.sizes(), g.strides(), g.options());
    const int64_t n = out.numel();
    if (!g.device().is_cpu()) {
      flat(out).copy_(at::where(bits_to_bool(bits, n), flat(g), at::zeros({}, g.options())));
      return {out};
    }
    const bool vec = packing_vector_kernels();
    for_each_chunk(n, g.element_size(), [&](auto k, int64_t, int64_t lo, int64_t hi) {
      k.select(vec, g.data_ptr(), lo, hi, bits.data_ptr<uint8_t>(), out.data_ptr());
    });
    return {out};
  }
};

// Note [Packed input kept through the rerun]
// A split unit begins with a convolution of the block input x (conv1 of the branch, or the
// shortcut's 1x1 conv), and a convolution saves its input for the weight gradient, its
// last step in backward. Rebuilding x before the rerun kept it whole for the whole of the
// unit's backward: in ResNet-50's stage 1 a 24.5 MiB tensor, while BatchNorm's CPU backward
// allocates its input gradient twice over (ATen's batch_norm_backward_cpu_template makes
// one, then a second for its contiguous path before letting go of the first), which was
// where `full` peaked. Here the rerun's convolution unpacks x inside its own forward and
// lets it go once it has run; the packed copy (smaller by a third or more) is what stays,
// and backward unpacks it again for at::convolution_backward, the function autograd's own
// ConvolutionBackward0 calls, with the same arguments: the gradients are bitwise those of
// conv(x). Under autocast the forward ran in a lower precision; backward casts x and the
// weight as autocast did (Tensor.to) and casts the gradients back to the inputs' dtypes, as
// the graph's ToCopyBackward0 nodes do. One more unpack per unit is the price.
struct PackHolder : torch::CustomClassHolder {
  PackedTensor pack;
};

class PackedInputConv : public torch::autograd::Function<PackedInputConv> {
 public:
  // params: the weight, and the bias if the convolution has one (a TensorList, so that
  // LibTorch sees them as inputs and an absent bias is no input at all).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_edge,
                                                at::TensorList params, c10::intrusive_ptr<PackHolder> holder, std::vector<int64_t> stride,
                                                std::vector<int64_t> padding, std::vector<int64_t> dilation,
                                                int64_t groups, bool fp32_products, bool training) {
    at::Tensor out;
    detail::ConvGeometry geometry{params.size() > 1 ? params[1].sizes().vec() : std::vector<int64_t>{},
                                  std::move(stride), std::move(padding), std::move(dilation), groups};
    {
      const auto x = unpack_tensor(holder->pack);
      TORCH_CHECK(x.sizes() == x_edge.sizes() && x.scalar_type() == x_edge.scalar_type(),
                  "conv_keeping_packed_input: the packed input is ", x.scalar_type(), " ", x.sizes(),
                  ", its stand-in ", x_edge.scalar_type(), " ", x_edge.sizes());
      const at::Tensor bias = params.size() > 1 ? params[1] : at::Tensor();
      // What lt::recompute::conv2d runs: Conv2d's forward, or as GEMMs (conv_runs_as_gemm's
      // choice, for the unpacked input: Note [1x1 convolutions as GEMMs]), or with fp32
      // products (Note [Convolutions in fp32 where bf16 is slow]).
      geometry.gemm = detail::gemm_conv_applies(x, params[0], geometry.stride, geometry.padding, geometry.dilation,
                                                groups, fp32_products, training);
      out = geometry.forward(x, params[0], bias, fp32_products);
    }
    ctx->save_for_backward({params[0]});
    ctx->saved_data["pack"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["run_dtype"] = static_cast<int64_t>(fp32_products ? at::kFloat : out.scalar_type());
    ctx->saved_data["fp32_products"] = fp32_products;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x_edge.scalar_type());
    geometry.save(ctx);
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto holder = c10::static_intrusive_pointer_cast<PackHolder>(ctx->saved_data["pack"].toCapsule());
    TORCH_CHECK(holder->pack.values.defined() || holder->pack.deferred,
                "conv_keeping_packed_input: differentiated twice (its packed input is released by the first backward)");
    auto x = unpack_tensor(holder->pack);
    holder->pack = PackedTensor{};  // this node's hold on it ends here
    const auto weight = ctx->get_saved_variables()[0];
    const auto run = static_cast<at::ScalarType>(ctx->saved_data["run_dtype"].toInt());
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const bool fp32_products = ctx->saved_data["fp32_products"].toBool();
    // fp32 products: the operands as the forward rounded them.
    x = fp32_products ? rounded_fp32(x) : (x.scalar_type() != run ? x.to(run) : x);
    const auto w = fp32_products ? rounded_fp32(weight) : (weight.scalar_type() == run ? weight : weight.to(run));
    const auto g = grad_out[0].scalar_type() == run ? grad_out[0] : grad_out[0].to(run);
    const auto geometry = detail::ConvGeometry::load(ctx);
    auto [gx, gw, gb] = geometry.backward(ctx, g, x, w);
    x.reset();
    if (gx.defined() && gx.scalar_type() != x_dtype) gx = gx.to(x_dtype);
    if (gw.defined() && gw.scalar_type() != weight.scalar_type()) gw = gw.to(weight.scalar_type());
    if (gb.defined() && gb.scalar_type() != weight.scalar_type()) gb = gb.to(weight.scalar_type());
    torch::autograd::variable_list grads{gx, gw};
    if (!geometry.bias_sizes.empty()) grads.push_back(gb);
    grads.resize(grads.size() + 7);  // holder, stride, padding, dilation, groups, fp32_products, training
    return grads;
  }
};

}  // namespace

at::Tensor conv_keeping_packed_input(torch::nn::Conv2dImpl& conv, const at::Tensor& x_edge,
                                     const PackedTensor& packed, bool fp32_products) {
  if (!torch::GradMode::is_enabled())
    return lt::recompute::conv2d(conv, unpack_tensor(packed), fp32_products ? HeadMatmul::kFp32 : HeadMatmul::kAutocast);
  const auto& o = conv.options;
  const auto* padding = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  TORCH_CHECK(padding != nullptr && std::holds_alternative<torch::enumtype::kZeros>(o.padding_mode()) && !o.transposed(),
              "conv_keeping_packed_input: only a convolution with explicit zero padding");
  auto holder = c10::make_intrusive<PackHolder>();
  holder->pack = packed;
  std::vector<at::Tensor> params{conv.weight};
  if (conv.bias.defined()) params.push_back(conv.bias);
  return PackedInputConv::apply(x_edge, at::TensorList(params), holder, at::IntArrayRef(o.stride()).vec(),
                                at::IntArrayRef(*padding).vec(), at::IntArrayRef(o.dilation()).vec(), o.groups(),
                                fp32_products, conv.is_training())[0];
}

at::Tensor masked_scale(const at::Tensor& x, const at::Tensor& bits, const at::Tensor& value) {
  return MaskedScale::apply(x, bits, value)[0];
}

at::Tensor mask_relu(const at::Tensor& x) {
  if (!torch::GradMode::is_enabled() || !x.requires_grad() || !at::isFloatingType(x.scalar_type()))
    return at::relu(x);
  return MaskRelu::apply(x)[0];
}

}  // namespace lt::recompute
