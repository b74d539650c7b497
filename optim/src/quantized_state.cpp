#include "leantrain/optim/quantized_state.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace lt::optim {

// Note [8-bit optimizer state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// AdamW keeps two FP32 moments per parameter: 8 bytes of state per 4-byte parameter, the
// largest item in memory after the weights for a big model on a small device. bitsandbytes'
// 8-bit Adam (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", arXiv
// 2110.02861) holds each moment in one byte per element plus one float per block and does the
// arithmetic in FP32: dequantise, update, quantise. adamw_step_8bit does the same around
// ATen's fused AdamW kernel, so the update itself is the kernel FusedAdamW runs.
//
// The map. A code indexes 256 values in [-1, 1]: the "dynamic" (dynamic-exponent, "tree")
// data type of Dettmers, "8-Bit Approximations for Parallelism in Deep Learning" (arXiv
// 1511.04561), as bitsandbytes builds it in create_dynamic_map(signed, max_exponent_bits=7,
// total_bits=8) (bitsandbytes/functional.py, github.com/bitsandbytes-foundation/bitsandbytes):
// for i = 0..6 the decade scaled by 10^(i-6) holds the means of adjacent points of
// linspace(0.1, 1, k + 1), k = 2^i per sign (signed) or 2^(i+1) (unsigned), then 0 and 1.
// The values are dense in relative terms over 7 decades rather than uniform: a block's moments
// spread over orders of magnitude, and a linear code would round everything below
// absmax / 256 to zero. build_dynamic_map repeats bitsandbytes' float32 torch ops, so the
// table is bitsandbytes' bit for bit (the test checks values printed by its construction).
// The signed map has 127 negative values and no -1: its most negative value is -0.99297 (the
// top decade's last mean); 1 is the one code without a mirror, as in bitsandbytes.
//
// Why the second moment uses the unsigned map: v >= 0, so the negative half of the signed map
// would never be used; the unsigned map spends the sign bit on twice the values per decade
// (largest half-gap 0.35 % of the block's absmax instead of 0.70 %), where Adam divides by
// sqrt(v).
//
// Blocks. Each block of kQuantBlock consecutive elements is divided by its absmax and each
// value goes to the NEAREST code, as bitsandbytes' optimizer kernels round. A block scale
// confines an outlier's damage to its block: every value is quantised relative to its block's
// largest. bitsandbytes' 8-bit optimizers used blocks of 2048 and use 256 since 0.45
// (optim/optimizer.py: `blocks = n // 256`); at 256 the scales add 4 / 256 = 1.6 %: 1.016
// bytes per element instead of 4, 0.254 of the FP32 bytes. Zero is a code and 0 / absmax = 0
// lands on it, so zero moments (a frozen slice, embedding rows never seen) stay exactly zero;
// an all-zero block stores absmax 0.
//
// No v to zero: the one departure from bitsandbytes. Rounding to nearest sends a positive
// second moment below half the map's smallest value (1.6e-7 of its block's absmax: v spans the
// square of the gradients' range, so a block whose gradients span 10^3.5 gets there) to 0. The
// next step then divides m, which kept its history, by the square root of a v that lost its
// history, (1 - beta2) g^2 alone: an update hundreds of times lr where g happens to be small (a
// test run of 20 steps moved a parameter by 83 with lr 0.01). So positive values go to the
// smallest positive code at least: v is overestimated there, which only shrinks the update.
//
// Min size. Tensors under kMin8bitNumel = 4096 elements (biases, norm gains) keep FP32
// moments, as bitsandbytes' min_8bit_size: together they are a negligible share of the bytes,
// so quantising them would cost precision for nothing. The caller decides (this file only
// quantises).
//
// Nearest code, two implementations that agree bitwise. Both compute
// code = #{midpoints m_k = (c_k + c_{k+1}) / 2 (float32) : m_k < x * (1 / absmax)} with the
// same float32 operations (a product: a division per element halves the CPU kernel's speed),
// so a value exactly on a midpoint goes to the lower code in both. The ATen
// path (any device; CUDA's) is torch::searchsorted over the 255 midpoints. The CPU kernel
// avoids a search of 256: the float's top kKeyBits bits (sign, exponent, 5 mantissa bits) pick
// a bucket of values, a table gives the number of midpoints below the bucket, and kSteps
// compares with the next midpoints finish the count: no bucket of either map holds more than
// 3 midpoints (asserted when the table is built).
//
// Chunks. adamw_step_8bit dequantises one chunk (a multiple of the block) of both moments into
// FP32 buffers, runs the kernel on the chunk, and quantises them back while they are in cache:
// the FP32 temporaries are 2 x chunk x 4 bytes per thread, not 8 bytes per element. On the CPU
// the chunks go to the threads whole (at::parallel_for over chunks; ATen's kernels inside run
// on their own thread); on a GPU they run one after another.
//
// Tables on the device (issue 39). The ATen path needs the 255 midpoints (searchsorted) and
// the 256 values (index_select) on the state's device. They were copied there per call,
// `t.mids.to(device)` / `t.map.to(device)`: four host-to-device copies per 64 Ki chunk, a few
// thousand per step for a GPT-2-sized model. device_tables() builds them once per device (both
// maps, under a mutex, kept for the process's life) and every later call uses those; on the
// CPU the entry holds the very tensors Tables owns, no copy. adamw_step_8bit looks the entry
// up once per call, not per chunk. detail::quant8_device_tables_built() counts the entries
// built, and the tests AdamW8bit.TablesReach{TheCpu,TheGpu}OncePerProcess check that steps build
// none and that no table-sized tensor is copied (aten::to, _to_copy, clone: a RecordFunction
// hook) during a step: 32 copies a step in that test before, 0 now.
// The chunking stays: it bounds the FP32 temporaries (above), and whole-tensor passes would
// raise the step's peak by 8 bytes or more per element of the largest tensor. Per chunk the ATen
// path now launches device kernels only: nothing of it waits for the host or copies from it.

namespace {

constexpr int kKeyBits = 14;  // sign + 8 exponent bits + 5 mantissa bits
constexpr int kSteps = 3;

// bitsandbytes' create_dynamic_map with its defaults, op for op in float32.
torch::Tensor build_dynamic_map(bool is_signed) {
  constexpr int kMaxExponentBits = 7, kTotalBits = 8;
  // bitsandbytes writes `total_bits - (1 if signed else 1)`: both maps have 7 "non-sign" bits;
  // the unsigned one spends the 8th on twice the fraction items below.
  constexpr int kNonSignBits = kTotalBits - 1;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  std::vector<torch::Tensor> parts;
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int64_t items = is_signed ? (int64_t{1} << (i + kNonSignBits - kMaxExponentBits)) + 1
                                    : (int64_t{1} << (i + kNonSignBits - kMaxExponentBits + 1)) + 1;
    auto bounds = torch::linspace(0.1, 1.0, items, f32);
    auto means = (bounds.slice(0, 0, -1) + bounds.slice(0, 1)) / 2.0;
    const double scale = std::pow(10.0, -(kMaxExponentBits - 1) + i);  // Python's 10 ** (i - 6)
    parts.push_back(means * scale);
    if (is_signed) parts.push_back(means * -scale);
  }
  // bitsandbytes' additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1 = 0 here.
  parts.push_back(torch::tensor({0.0f, 1.0f}, f32));
  auto map = std::get<0>(torch::cat(parts).sort());
  TORCH_INTERNAL_ASSERT(map.numel() == 256, "dynamic map has ", map.numel(), " values");
  return map;
}

uint32_t bits_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

float float_of(uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

struct Tables {
  float code[256];
  // mid[k] lies between code[k] and code[k + 1]; mid[255..] = +inf: steps past the last
  // midpoint count nothing.
  float mid[255 + kSteps];
  uint8_t below[1 << kKeyBits];  // midpoints below the smallest float of each key
  uint8_t zero_code = 0;
  // The unsigned map's code 0 is the value 0: positive values go to code 1 at least.
  uint32_t keep_positive = 0;
  torch::Tensor map, mids;  // CPU float32 [256], [255]: the ATen path's copies

  explicit Tables(bool is_signed) {
    map = build_dynamic_map(is_signed);
    std::memcpy(code, map.data_ptr<float>(), sizeof code);
    for (int k = 0; k < 255; ++k) mid[k] = (code[k] + code[k + 1]) / 2.0f;
    std::fill(mid + 255, mid + 255 + kSteps, std::numeric_limits<float>::infinity());
    mids = torch::from_blob(mid, {255}, torch::kFloat).clone();
    const auto zero_at = std::find(code, code + 256, 0.0f) - code;
    TORCH_INTERNAL_ASSERT(zero_at < 256, "the dynamic map has no 0");
    zero_code = static_cast<uint8_t>(zero_at);
    keep_positive = is_signed ? 0 : 1;
    const int shift = 32 - kKeyBits;
    int most = 0;
    for (uint32_t key = 0; key < (1u << kKeyBits); ++key) {
      const bool negative = key >> (kKeyBits - 1);
      const uint32_t first = key << shift, last = first | ((1u << shift) - 1);
      // In value order a negative key's floats run from `last` (most negative) to `first`.
      const float lo = float_of(negative ? last : first), hi = float_of(negative ? first : last);
      below[key] = static_cast<uint8_t>(std::count_if(mid, mid + 255, [&](float m) { return m < lo; }));
      if (std::isfinite(lo) && std::isfinite(hi))
        most = std::max<int>(most, std::count_if(mid, mid + 255, [&](float m) { return m >= lo && m <= hi; }));
    }
    TORCH_INTERNAL_ASSERT(most <= kSteps, "a bucket of the dynamic map holds ", most, " midpoints, more than ",
                          kSteps, " steps");
  }
};

const Tables& tables(bool is_signed) {
  // Immutable once built (thread-safe static initialisation).
  static const Tables signed_tables(true), unsigned_tables(false);
  return is_signed ? signed_tables : unsigned_tables;
}

// The ATen path's tables on one device (Note [8-bit optimizer state], "Tables on the device").
struct DeviceTables {
  torch::Tensor map[2], mids[2];  // [is_signed]: float32 [256], [255]
};

std::atomic<int64_t> g_device_tables_built{0};

// Built on a device's first use, then the same tensors for the process's life (never freed:
// a static holding CUDA memory would be destroyed after the CUDA runtime at exit).
const DeviceTables& device_tables(const torch::Device& device) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<torch::Device, std::unique_ptr<DeviceTables>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& entry = (*cache)[device];
  if (!entry) {
    auto built = std::make_unique<DeviceTables>();
    for (bool is_signed : {false, true}) {
      const Tables& t = tables(is_signed);
      // On the CPU the tensors themselves; elsewhere one copy each, for the process's life.
      built->map[is_signed] = device.is_cpu() ? t.map : t.map.to(device);
      built->mids[is_signed] = device.is_cpu() ? t.mids : t.mids.to(device);
    }
    entry = std::move(built);
    ++g_device_tables_built;
  }
  return *entry;
}

int64_t blocks_of(int64_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }

// x[0, n) to codes and one absmax per block; n <= kQuantBlock.
inline void quantize_block(const Tables& t, const float* x, int64_t n, uint8_t* codes, float* absmax) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(x[i]));
  const float inv = 1.0f / (amax > 0.0f ? amax : 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] * inv;
    const uint32_t c0 = t.below[bits_of(v) >> (32 - kKeyBits)];
    // The midpoints are sorted: counting the next kSteps of them below v needs no chain of
    // dependent loads.
    uint32_t c = c0;
    for (int s = 0; s < kSteps; ++s) c += t.mid[c0 + s] < v;
    c += t.keep_positive & (c == 0) & (v > 0.0f);  // Note [8-bit optimizer state], "No v to zero"
    codes[i] = static_cast<uint8_t>(c);
  }
  *absmax = amax;
}

inline void dequantize_block(const Tables& t, const uint8_t* codes, float absmax, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = t.code[codes[i]] * absmax;
}

void check_range(const Quantized8& q, int64_t begin, int64_t len, const char* what) {
  TORCH_CHECK(begin >= 0 && len >= 0 && begin + len <= q.numel, what, ": range [", begin, ", ", begin + len,
              ") outside the ", q.numel, " quantised elements");
  TORCH_CHECK(begin % kQuantBlock == 0, what, ": begin ", begin, " is not a multiple of the block (", kQuantBlock, ")");
}

bool use_cpu_kernel(const torch::Device& device, Quant8Path path) {
  if (path == Quant8Path::kCpuKernel)
    TORCH_CHECK(device.is_cpu(), "Quant8Path::kCpuKernel on a ", device, " tensor");
  return path == Quant8Path::kCpuKernel || (path == Quant8Path::kAuto && device.is_cpu());
}

// Elements [begin, begin + len) of q from x (CPU); whole blocks only, or the tail.
void quantize_cpu(Quantized8& q, int64_t begin, int64_t len, const float* x, bool parallel) {
  const Tables& t = tables(q.is_signed);
  uint8_t* codes = q.codes.data_ptr<uint8_t>() + begin;
  float* absmax = q.absmax.data_ptr<float>() + begin / kQuantBlock;
  auto run = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * kQuantBlock;
      quantize_block(t, x + lo, std::min(kQuantBlock, len - lo), codes + lo, absmax + b);
    }
  };
  // 64 blocks (16K elements, tens of microseconds) per task keep the scheduling overhead small.
  if (parallel) at::parallel_for(0, blocks_of(len), 64, run);
  else run(0, blocks_of(len));
}

void dequantize_cpu(const Quantized8& q, int64_t begin, int64_t len, float* out, bool parallel) {
  const Tables& t = tables(q.is_signed);
  const uint8_t* codes = q.codes.data_ptr<uint8_t>() + begin;
  const float* absmax = q.absmax.data_ptr<float>() + begin / kQuantBlock;
  auto run = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * kQuantBlock;
      dequantize_block(t, codes + lo, absmax[b], std::min(kQuantBlock, len - lo), out + lo);
    }
  };
  if (parallel) at::parallel_for(0, blocks_of(len), 64, run);
  else run(0, blocks_of(len));
}

// The ATen path: codes_out uint8 [n], absmax_out float32 [blocks_of(n)], views into q.
// mids: the 255 midpoints on x's device (device_tables()).
void quantize_aten(const Tables& t, const torch::Tensor& mids, const torch::Tensor& x, torch::Tensor codes_out,
                   torch::Tensor absmax_out) {
  const int64_t n = x.numel(), nb = blocks_of(n), pad = nb * kQuantBlock - n;
  auto blocks = (pad ? at::constant_pad_nd(x, {0, pad}) : x).view({nb, kQuantBlock});
  auto amax = blocks.abs().amax(1);
  auto inv = torch::where(amax > 0, amax, torch::ones_like(amax)).reciprocal();
  auto v = (blocks * inv.unsqueeze(1)).view({-1}).narrow(0, 0, n);
  auto idx = torch::searchsorted(mids, v, /*out_int32=*/true, /*right=*/false);
  // Note [8-bit optimizer state], "No v to zero".
  if (t.keep_positive) idx.masked_fill_((idx == 0) & (v > 0), 1);
  codes_out.copy_(idx);
  absmax_out.copy_(amax);
}

// map: the 256 values on codes' device (device_tables()).
torch::Tensor dequantize_aten(const torch::Tensor& map, const torch::Tensor& codes, const torch::Tensor& absmax) {
  const int64_t n = codes.numel(), nb = absmax.numel();
  // int32 indices: index_select takes them, at half the bytes of int64 ones.
  auto values = map.index_select(0, codes.to(torch::kInt));
  auto scale = absmax.unsqueeze(1).expand({nb, kQuantBlock}).reshape({-1}).narrow(0, 0, n);
  return values * scale;
}

void check_input(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() == 1 && x.is_contiguous(), what,
              ": needs a 1-D contiguous float32 tensor, got ", x.scalar_type(), " ", x.sizes(), " strides ",
              x.strides());
}

}  // namespace

namespace detail {
int64_t quant8_device_tables_built() { return g_device_tables_built.load(); }
}  // namespace detail

int64_t Quantized8::nbytes() const {
  return (codes.defined() ? codes.nbytes() : 0) + (absmax.defined() ? absmax.nbytes() : 0);
}

const torch::Tensor& dynamic_map(bool is_signed) { return tables(is_signed).map; }

Quantized8 quantized_zeros(int64_t numel, bool is_signed, const torch::TensorOptions& device_opts) {
  TORCH_CHECK(numel >= 0, "quantized_zeros: numel ", numel);
  Quantized8 q;
  q.is_signed = is_signed;
  q.numel = numel;
  q.codes = torch::full({numel}, tables(is_signed).zero_code, device_opts.dtype(torch::kUInt8));
  q.absmax = torch::zeros({blocks_of(numel)}, device_opts.dtype(torch::kFloat));
  return q;
}

Quantized8 quantize8(const torch::Tensor& x, bool is_signed, Quant8Path path) {
  check_input(x, "quantize8");
  Quantized8 q;
  q.is_signed = is_signed;
  q.numel = x.numel();
  q.codes = torch::empty({q.numel}, x.options().dtype(torch::kUInt8));
  q.absmax = torch::empty({blocks_of(q.numel)}, x.options().dtype(torch::kFloat));
  quantize8_into(q, 0, x, path);
  return q;
}

void quantize8_into(Quantized8& q, int64_t begin, const torch::Tensor& x, Quant8Path path) {
  check_input(x, "quantize8_into");
  const int64_t len = x.numel();
  check_range(q, begin, len, "quantize8_into");
  TORCH_CHECK(len % kQuantBlock == 0 || begin + len == q.numel, "quantize8_into: ", len,
              " elements would split a block (not a multiple of ", kQuantBlock, " and not the tensor's end)");
  TORCH_CHECK(x.device() == q.codes.device(), "quantize8_into: x on ", x.device(), ", state on ", q.codes.device());
  if (len == 0) return;
  if (use_cpu_kernel(x.device(), path)) return quantize_cpu(q, begin, len, x.data_ptr<float>(), /*parallel=*/true);
  quantize_aten(tables(q.is_signed), device_tables(x.device()).mids[q.is_signed], x, q.codes.narrow(0, begin, len),
                q.absmax.narrow(0, begin / kQuantBlock, blocks_of(len)));
}

torch::Tensor dequantize8(const Quantized8& q, Quant8Path path) { return dequantize8_range(q, 0, q.numel, path); }

torch::Tensor dequantize8_range(const Quantized8& q, int64_t begin, int64_t len, Quant8Path path) {
  check_range(q, begin, len, "dequantize8_range");
  if (use_cpu_kernel(q.codes.device(), path)) {
    auto out = torch::empty({len}, q.absmax.options());
    dequantize_cpu(q, begin, len, out.data_ptr<float>(), /*parallel=*/true);
    return out;
  }
  return dequantize_aten(device_tables(q.codes.device()).map[q.is_signed], q.codes.narrow(0, begin, len),
                         q.absmax.narrow(0, begin / kQuantBlock, blocks_of(len)));
}

void adamw_step_8bit(torch::Tensor param, const torch::Tensor& grad, Quantized8& exp_avg, Quantized8& exp_avg_sq,
                     const torch::Tensor& step, double lr, double beta1, double beta2, double weight_decay,
                     double eps, const std::optional<at::Tensor>& grad_scale, int64_t chunk_elems,
                     Quant8Path path) {
  check_input(param, "adamw_step_8bit (param)");
  const int64_t n = param.numel();
  TORCH_CHECK(grad.scalar_type() == torch::kFloat && grad.dim() == 1 && grad.numel() == n,
              "adamw_step_8bit: grad must be float32 1-D with ", n, " elements, got ", grad.scalar_type(), " ",
              grad.sizes());
  TORCH_CHECK(exp_avg.numel == n && exp_avg_sq.numel == n, "adamw_step_8bit: moments hold ", exp_avg.numel, " and ",
              exp_avg_sq.numel, " elements, the parameter ", n);
  // Swapped moments would still run, with v on the signed map (half its codes unused).
  TORCH_CHECK(exp_avg.is_signed && !exp_avg_sq.is_signed,
              "adamw_step_8bit: exp_avg takes the signed map, exp_avg_sq the unsigned one");
  TORCH_CHECK(chunk_elems > 0 && chunk_elems % kQuantBlock == 0, "adamw_step_8bit: chunk_elems ", chunk_elems,
              " must be a positive multiple of ", kQuantBlock);
  if (n == 0) return;
  const int64_t nchunks = (n + chunk_elems - 1) / chunk_elems;
  TORCH_CHECK(grad.device() == param.device() && exp_avg.codes.device() == param.device() &&
                  exp_avg_sq.codes.device() == param.device(),
              "adamw_step_8bit: param, grad and moments must be on one device");
  const bool cpu_kernel = use_cpu_kernel(param.device(), path);

  auto update = [&](const torch::Tensor& m, const torch::Tensor& v, int64_t lo, int64_t len) {
    auto g = grad.narrow(0, lo, len);
    if (!g.is_contiguous()) g = g.contiguous();
    at::_fused_adamw_({param.narrow(0, lo, len)}, {g}, {m}, {v}, /*max_exp_avg_sqs=*/{}, {step}, lr, beta1, beta2,
                      weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, grad_scale, /*found_inf=*/std::nullopt);
  };

  if (!cpu_kernel) {
    torch::NoGradGuard no_grad;
    // The tables once per call; the chunks launch device kernels only (Note [8-bit optimizer
    // state], "Tables on the device"). The ranges were checked above: whole blocks, in range.
    const DeviceTables& dt = device_tables(param.device());
    const Tables &ts = tables(true), &tu = tables(false);
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t lo = c * chunk_elems, len = std::min(chunk_elems, n - lo);
      const int64_t b0 = lo / kQuantBlock, nb = blocks_of(len);
      auto m_codes = exp_avg.codes.narrow(0, lo, len), m_absmax = exp_avg.absmax.narrow(0, b0, nb);
      auto v_codes = exp_avg_sq.codes.narrow(0, lo, len), v_absmax = exp_avg_sq.absmax.narrow(0, b0, nb);
      auto m = dequantize_aten(dt.map[true], m_codes, m_absmax);
      auto v = dequantize_aten(dt.map[false], v_codes, v_absmax);
      update(m, v, lo, len);
      quantize_aten(ts, dt.mids[true], m, m_codes, m_absmax);
      quantize_aten(tu, dt.mids[false], v, v_codes, v_absmax);
    }
    return;
  }
  at::parallel_for(0, nchunks, 1, [&](int64_t c0, int64_t c1) {
    // Grad mode is thread-local: a worker does not inherit the caller's no_grad, and the
    // parameter's in-place update must not be recorded.
    torch::NoGradGuard no_grad;
    const int64_t cap = std::min(chunk_elems, n);
    auto m_buf = torch::empty({cap}, param.options()), v_buf = torch::empty({cap}, param.options());
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * chunk_elems, len = std::min(chunk_elems, n - lo);
      auto m = m_buf.narrow(0, 0, len), v = v_buf.narrow(0, 0, len);
      dequantize_cpu(exp_avg, lo, len, m.data_ptr<float>(), /*parallel=*/false);
      dequantize_cpu(exp_avg_sq, lo, len, v.data_ptr<float>(), /*parallel=*/false);
      update(m, v, lo, len);
      quantize_cpu(exp_avg, lo, len, m.data_ptr<float>(), /*parallel=*/false);
      quantize_cpu(exp_avg_sq, lo, len, v.data_ptr<float>(), /*parallel=*/false);
    }
  });
}

}  // namespace lt::optim
