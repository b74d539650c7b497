#pragma once
// Block-wise dynamic 8-bit quantisation of AdamW's moments (bitsandbytes' 8-bit Adam): a
// quarter of the FP32 optimizer state, and an AdamW step that updates a parameter from moments
// held that way. Self-contained: the optimizer decides which parameters use it (Note
// [8-bit optimizer state] in quantized_state.cpp).
#include <cstdint>
#include <optional>

#include <torch/types.h>

namespace lt::optim {

/// Block-wise dynamic 8-bit quantisation (bitsandbytes' "dynamic" data type with a per-block
/// absmax scale): `codes` uint8 [numel], `absmax` float32 [ceil(numel / kQuantBlock)], on the
/// tensor's device. is_signed: the signed dynamic map (first moment); else the unsigned one
/// (second moment, >= 0).
struct Quantized8 {
  torch::Tensor codes, absmax;
  bool is_signed = true;
  int64_t numel = 0;
  int64_t nbytes() const;  // codes + absmax
};

/// Elements per absmax scale: bitsandbytes' 8-bit optimizers since 0.45 (2048 before). A
/// smaller block bounds the damage of one outlier to fewer neighbours for 4 / 256 = 1.6 % more
/// bytes (Note [8-bit optimizer state]).
constexpr int64_t kQuantBlock = 256;
/// Tensors with fewer elements than this keep FP32 moments (callers check; bitsandbytes'
/// min_8bit_size is 4096).
constexpr int64_t kMin8bitNumel = 4096;

/// Which implementation quantises: kAuto takes the CPU kernel for CPU tensors and the ATen
/// one (any device) otherwise; the two agree bitwise (tests force each).
enum class Quant8Path { kAuto, kCpuKernel, kAten };

/// The 256 sorted values of bitsandbytes' create_dynamic_map(signed), float32, on the CPU.
const torch::Tensor& dynamic_map(bool is_signed);

Quantized8 quantized_zeros(int64_t numel, bool is_signed, const torch::TensorOptions& device_opts);
/// x: fp32, 1-D, contiguous.
Quantized8 quantize8(const torch::Tensor& x, bool is_signed, Quant8Path path = Quant8Path::kAuto);
/// fp32 [numel], on q's device.
torch::Tensor dequantize8(const Quantized8& q, Quant8Path path = Quant8Path::kAuto);
/// Elements [begin, begin + x.numel()) of q from x; begin a multiple of kQuantBlock, and
/// x.numel() one too unless the range ends at q.numel (a block is never split).
void quantize8_into(Quantized8& q, int64_t begin, const torch::Tensor& x, Quant8Path path = Quant8Path::kAuto);
/// Elements [begin, begin + len) of q, fp32; begin a multiple of kQuantBlock.
torch::Tensor dequantize8_range(const Quantized8& q, int64_t begin, int64_t len, Quant8Path path = Quant8Path::kAuto);

/// One AdamW update of the 1-D contiguous fp32 `param` (a view into a real parameter's memory,
/// updated in place) with `grad` (same numel, fp32, 1-D), moments held in 8 bits, in chunks of
/// at most `chunk_elems` elements (a multiple of kQuantBlock, so the temporaries stay small):
/// dequantise the chunk's moments to fp32, run at::_fused_adamw_ on (param chunk, grad chunk,
/// m, v) with `step` (a float32 scalar tensor on param's device holding the step count AFTER
/// increment, as torch.optim keeps it) and grad_scale (divides the gradient inside the kernel;
/// nullopt = none), quantise the moments back. On the CPU the chunks run in parallel, each on
/// one thread. No found_inf: a caller that skips non-finite steps does so before calling.
/// `path` as for quantize8 (kAten runs the chunks one after another, as on a GPU).
void adamw_step_8bit(torch::Tensor param, const torch::Tensor& grad, Quantized8& exp_avg, Quantized8& exp_avg_sq,
                     const torch::Tensor& step, double lr, double beta1, double beta2, double weight_decay,
                     double eps, const std::optional<at::Tensor>& grad_scale, int64_t chunk_elems = 1 << 16,
                     Quant8Path path = Quant8Path::kAuto);

namespace detail {
/// Test hook: how many devices the ATen path's tables (both maps' values and midpoints) have
/// been built for in this process. One per device, at its first 8-bit call; a step builds none
/// and copies no table (Note [8-bit optimizer state], "Tables on the device").
int64_t quant8_device_tables_built();
}  // namespace detail

}  // namespace lt::optim
