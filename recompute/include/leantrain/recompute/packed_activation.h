#pragma once
// Lossless compact storage for tensors with many exact zeros (ReLU outputs), and a ReLU
// that keeps one bit per element for its backward instead of its output. Together they let
// a recomputed ResNet keep its block inputs at a fraction of their size (Note [Packed
// block inputs] in packed_activation.cpp).
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <torch/nn/modules/conv.h>
#include <torch/types.h>

namespace lt::recompute {

struct DeferredPack;  // packed_activation.cpp

/// A tensor kept as its nonzero elements and a bit mask of where they are, in the order the
/// elements lie in memory (so any dense layout, channels-last included, packs without a
/// copy); or, when packing would not be smaller, as itself (`bits` undefined, `values` the
/// tensor). A sync-free pack (on a GPU) gathers its values later (Note [Packing without a host
/// sync] in packed_activation.cpp): `deferred` is then set and shared by every copy, and
/// `bits` and `values` stay undefined; resolved_pack() gives the resolved fields.
struct PackedTensor {
  at::Tensor bits;    // uint8 [ceil(numel / 8)]: bit j of byte i is "element 8i + j in memory order != 0"
  at::Tensor values;  // the nonzero elements in memory order (1-D), or the tensor itself
  std::vector<int64_t> sizes, strides;  // of the packed tensor, which unpacking gives back
  std::shared_ptr<DeferredPack> deferred;
};

/// Packs x (no autograd history is recorded). unpack_tensor(pack_tensor(x)) has x's sizes
/// and, for a dense x, its strides; it equals x bitwise, except that a -0.0 comes back as
/// +0.0 (which no convolution, sum or product can tell apart from +0.0 but by its sign).
/// `sync_free` (unset: on any device but the CPU) reads nothing back at once: the values are
/// gathered at the thread's next pack_tensor or the first unpack, whichever comes first
/// (Note [Packing without a host sync]); the layout is the same.
PackedTensor pack_tensor(const at::Tensor& x, std::optional<bool> sync_free = std::nullopt);
at::Tensor unpack_tensor(const PackedTensor& p);
/// `p` with its deferred values gathered now (if any): bits and values as a pack made at
/// once would hold them, `deferred` unset.
PackedTensor resolved_pack(const PackedTensor& p);

/// Bytes a PackedTensor holds (gathering its deferred values first).
int64_t packed_bytes(const PackedTensor& p);

/// One bit per element of a dense tensor, in memory order: set where the element is not
/// zero (a NaN is not zero; -0.0 is). Bit j of byte i is element 8i + j.
at::Tensor nonzero_bits(const at::Tensor& x);

/// x * s, where s has x's sizes and strides and holds `value` (one element of x's dtype) where
/// `bits` (nonzero_bits of a tensor of x's layout) has a bit set and 0 elsewhere: the product
/// ATen computes for x * s (in float for bf16 and fp16, rounded to nearest even), in one pass
/// and without s. Only a NaN product's bit pattern can differ from ATen's vector loops.
at::Tensor scale_where(const at::Tensor& x, const at::Tensor& bits, const at::Tensor& value);
/// scale_where with autograd: its backward is scale_where of the gradient (read in x's
/// layout), what the product's backward computes; the graph keeps the bits, not s.
at::Tensor masked_scale(const at::Tensor& x, const at::Tensor& bits, const at::Tensor& value);

/// torch::relu(x) whose backward keeps one bit per element (where the output is not <= 0)
/// rather than the output itself: gradients equal relu's bitwise.
at::Tensor mask_relu(const at::Tensor& x);

/// conv(unpack_tensor(packed)) that keeps `packed` for its backward instead of the unpacked
/// input, which lives only while the forward runs; backward unpacks it again (Note [Packed
/// input kept through the rerun]). `x_edge` stands in for the input: the gradient flows to
/// it, it has the input's sizes and dtype, and its values are not read. Gradients are
/// conv's, bitwise. Needs explicit zero padding.
at::Tensor conv_keeping_packed_input(torch::nn::Conv2dImpl& conv, const at::Tensor& x_edge, const PackedTensor& packed,
                                     bool fp32_products = false);

/// Whether the CPU kernels above use AVX-512 (detected at startup: AVX-512 F, BW and VBMI2);
/// set_packing_vector_kernels(false) makes them use the portable loops (tests compare the
/// two). Returns the previous setting.
bool packing_vector_kernels();
bool set_packing_vector_kernels(bool on);

}  // namespace lt::recompute
