// Packed block inputs (Note [Packed block inputs]): pack/unpack is exact in every dtype and
// layout, the AVX-512 and portable kernels agree bit for bit, mask_relu's gradients are
// relu's, the bits shared with mask_relu are not reused after the tensor changed, and a
// convolution keeping its input packed has conv's gradients and holds only the pack.
#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <limits>

#include "leantrain/recompute/packed_activation.h"
#include "leantrain/runtime/memory_meter.h"
#include "host_reads.h"

namespace {

using lt::recompute::mask_relu;
using lt::recompute::nonzero_bits;
using lt::recompute::pack_tensor;
using lt::recompute::packed_bytes;
using lt::recompute::unpack_tensor;

// Restores the kernel choice a test changed.
struct KernelChoice {
  bool before;
  explicit KernelChoice(bool vector) : before(lt::recompute::set_packing_vector_kernels(vector)) {}
  ~KernelChoice() { lt::recompute::set_packing_vector_kernels(before); }
};

// A ReLU-like tensor: about `zeros` of its elements exactly zero, the rest random.
torch::Tensor sparse(at::IntArrayRef sizes, double zeros, torch::Dtype dtype, uint64_t seed) {
  torch::manual_seed(seed);
  auto x = torch::randn(sizes);
  x.masked_fill_(torch::rand(sizes) < zeros, 0.0);
  return x.to(dtype).add_(0.0);  // a value that rounds to -0.0 becomes +0.0, which packing keeps exactly
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() && a.scalar_type() == b.scalar_type() &&
         torch::equal(a.contiguous().view(torch::kByte), b.contiguous().view(torch::kByte));
}

TEST(PackedActivation, RoundTripIsExactInEveryDtypeLayoutAndKernel) {
  // Sizes that leave partial bytes, partial vectors and partial chunks (32768 elements).
  const std::vector<std::vector<int64_t>> shapes = {{3, 5, 7, 11}, {2, 64, 24, 24}, {1, 1, 1, 13}, {70001}};
  for (bool vector : {true, false}) {
    KernelChoice kc(vector);
    for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble})
      for (const auto& shape : shapes)
        for (bool channels_last : {false, true}) {
          if (channels_last && shape.size() != 4) continue;
          SCOPED_TRACE(c10::str("vector ", vector, " ", dtype, " ", at::IntArrayRef(shape), " cl ", channels_last));
          auto x = sparse(shape, 0.5, dtype, 11);
          if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
          const auto p = pack_tensor(x);
          ASSERT_TRUE(p.bits.defined());
          EXPECT_LT(packed_bytes(p), static_cast<int64_t>(x.nbytes()));
          EXPECT_EQ(p.values.numel(), x.ne(0).sum().item<int64_t>());
          const auto y = unpack_tensor(p);
          EXPECT_TRUE(bitwise_equal(x, y));  // same strides too: channels-last stays channels-last
        }
  }
}

TEST(PackedActivation, VectorAndPortableKernelsAgree) {
  if (!lt::recompute::set_packing_vector_kernels(true)) GTEST_SKIP() << "no AVX-512 (F, BW, VBMI2) on this CPU";
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto x = sparse({4, 33, 17, 19}, 0.4, dtype, 5);
    lt::recompute::PackedTensor pv, pp;
    torch::Tensor bv, bp;
    {
      KernelChoice kc(true);
      pv = pack_tensor(x);
      bv = nonzero_bits(x);
    }
    {
      KernelChoice kc(false);
      pp = pack_tensor(x);
      bp = nonzero_bits(x);
      // Unpacking what the other kernel packed gives x back.
      EXPECT_TRUE(bitwise_equal(unpack_tensor(pv), x));
    }
    EXPECT_TRUE(torch::equal(pv.bits, pp.bits)) << dtype;
    EXPECT_TRUE(torch::equal(bv, bp)) << dtype;
    EXPECT_TRUE(torch::equal(pv.bits, bv)) << dtype;
    EXPECT_TRUE(bitwise_equal(pv.values, pp.values)) << dtype;
  }
}

TEST(PackedActivation, SignedZeroNaNAndInfinity) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (bool vector : {true, false}) {
    KernelChoice kc(vector);
    auto x = torch::tensor({0.0f, -0.0f, nan, 1.5f, 0.0f, -inf, 0.0f, 0.0f, 2.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
                            0.0f, 0.0f, 0.0f, 0.0f});
    const auto p = pack_tensor(x);
    ASSERT_TRUE(p.bits.defined());
    EXPECT_EQ(p.values.numel(), 4);  // NaN, 1.5, -inf, 2.0: -0.0 counts as zero
    const auto y = unpack_tensor(p);
    EXPECT_TRUE(std::isnan(y[2].item<float>()));
    EXPECT_EQ(y[5].item<float>(), -inf);
    EXPECT_FALSE(std::signbit(y[1].item<float>()));  // -0.0 comes back as +0.0
    auto expected = x.clone();
    expected[1] = 0.0f;
    EXPECT_TRUE(bitwise_equal(y.nan_to_num(7.0f), expected.nan_to_num(7.0f)));
  }
}

TEST(PackedActivation, DenseAndNonFloatTensorsAreKeptWhole) {
  auto dense = torch::randn({64, 64}) + 10.0;  // no zeros: packing would be larger
  const auto p = pack_tensor(dense);
  EXPECT_FALSE(p.bits.defined());
  EXPECT_TRUE(p.values.is_same(dense));
  EXPECT_TRUE(unpack_tensor(p).is_same(dense));
  auto ints = torch::zeros({100}, torch::kLong);
  EXPECT_TRUE(unpack_tensor(pack_tensor(ints)).is_same(ints));
  // A non-dense view packs as its contiguous copy and unpacks to equal values.
  auto view = sparse({16, 16}, 0.7, torch::kFloat, 3).narrow(1, 2, 9);
  EXPECT_TRUE(torch::equal(unpack_tensor(pack_tensor(view)), view));
}

TEST(PackedActivation, MaskReluGradientsEqualRelu) {
  for (bool vector : {true, false}) {
    KernelChoice kc(vector);
    for (auto dtype : {torch::kFloat, torch::kBFloat16})
      for (bool channels_last : {false, true}) {
        SCOPED_TRACE(c10::str("vector ", vector, " ", dtype, " cl ", channels_last));
        auto base = sparse({3, 9, 13, 7}, 0.2, dtype, 9);  // exact zeros: relu's backward passes none there
        if (channels_last) base = base.contiguous(at::MemoryFormat::ChannelsLast);
        auto g = torch::randn(base.sizes()).to(dtype);
        auto a = base.clone().requires_grad_(true), b = base.clone().requires_grad_(true);
        auto ya = torch::relu(a), yb = mask_relu(b);
        EXPECT_TRUE(bitwise_equal(ya, yb));
        ya.backward(g);
        yb.backward(g);
        EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
        EXPECT_GT(b.grad().abs().sum().item<double>(), 0);
        // An incoming gradient in another layout is read correctly.
        auto c = base.clone().requires_grad_(true);
        mask_relu(c).backward(g.contiguous().permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2}));
        EXPECT_TRUE(torch::equal(a.grad(), c.grad()));
      }
  }
}

// Note [Shared ReLU bits]: packing a mask_relu output takes its bits, unless the output was
// changed in place since; then it is packed from what it holds now.
TEST(PackedActivation, SharedReluBitsFollowTheTensorsVersion) {
  for (bool vector : {true, false}) {
    KernelChoice kc(vector);
    auto x = sparse({2, 8, 9, 9}, 0.1, torch::kFloat, 4).requires_grad_(true);
    auto out = mask_relu(x);
    auto p = pack_tensor(out);
    EXPECT_TRUE(torch::equal(unpack_tensor(p), out));
    {
      torch::NoGradGuard ng;
      out.view(-1).narrow(0, 0, 100).zero_();  // new zeros where the bits say nonzero
    }
    auto q = pack_tensor(out);
    EXPECT_TRUE(torch::equal(unpack_tensor(q), out));
    EXPECT_EQ(q.values.numel(), out.ne(0).sum().item<int64_t>());
    // Another tensor of the same shape never gets the ReLU's bits.
    auto other = sparse({2, 8, 9, 9}, 0.6, torch::kFloat, 8);
    EXPECT_TRUE(torch::equal(unpack_tensor(pack_tensor(other)), other));
  }
}

// A replayed dropout (Note [Dropout masks kept as bits]): scale_where(x, bits, value) is
// x * noise bitwise, noise being the drawn mask divided by 1 - p as ATen divides it, in every
// dtype, both kernels, NCHW and channels-last, with negative values, zeros and (fp32, fp64)
// infinities, whose products with 0 are NaN.
TEST(PackedActivation, ScaleWhereIsTheProductWithTheNoise) {
  for (bool vector : {true, false}) {
    KernelChoice kc(vector);
    for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble})
      for (bool channels_last : {false, true})
        for (double p : {0.1, 0.3, 0.77}) {
          SCOPED_TRACE(c10::str("vector ", vector, " ", dtype, " cl ", channels_last, " p ", p));
          torch::manual_seed(3);
          auto x = torch::randn({5, 7, 33, 3}).mul_(100);
          x.view(-1).narrow(0, 0, 40).zero_();
          if (dtype == torch::kFloat || dtype == torch::kDouble) {
            x.view(-1)[41] = std::numeric_limits<float>::infinity();
            x.view(-1)[42] = -std::numeric_limits<float>::infinity();
          }
          x = x.to(dtype);
          if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
          auto draw = torch::empty_like(x).bernoulli_(1 - p);
          const auto expected = x * draw.clone().div_(1 - p);
          const auto got = lt::recompute::scale_where(x, nonzero_bits(draw), torch::ones({1}, x.options()).div_(1 - p));
          EXPECT_TRUE(bitwise_equal(got, expected));
        }
  }
}

// CPU autocast to bf16 for a scope (the state a checkpoint's rerun restores).
struct Bf16Autocast {
  Bf16Autocast() {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
  }
  ~Bf16Autocast() {
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
};

// Note [Packed input kept through the rerun]: conv_keeping_packed_input's output and
// gradients (input, weight, bias) are conv's bitwise: fp32 and under bf16 autocast, NCHW and
// channels-last, with stride, padding, dilation, groups and a bias.
TEST(PackedActivation, ConvKeepingPackedInputHasConvsGradientsBitwise) {
  struct Case {
    torch::nn::Conv2dOptions options;
    int64_t in_channels;
  };
  const std::vector<Case> cases{
      {torch::nn::Conv2dOptions(8, 16, 1).bias(false), 8},
      {torch::nn::Conv2dOptions(8, 6, 3).stride(2).padding(1).bias(true), 8},
      {torch::nn::Conv2dOptions(8, 4, 3).padding(2).dilation(2).groups(2).bias(true), 8},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci)
    for (bool autocast : {false, true})
      for (bool channels_last : {false, true}) {
        SCOPED_TRACE(c10::str("case ", ci, " autocast ", autocast, " channels-last ", channels_last));
        torch::manual_seed(11);
        torch::nn::Conv2d conv(cases[ci].options);
        auto x = sparse({3, cases[ci].in_channels, 11, 9}, 0.4, torch::kFloat, 12);
        if (channels_last) {
          x = x.contiguous(at::MemoryFormat::ChannelsLast);
          conv->weight.set_data(conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
        }
        auto run = [&](bool packed) {
          for (auto& p : conv->parameters()) p.mutable_grad() = torch::Tensor();
          auto in = x.clone().requires_grad_(true);
          torch::Tensor y;
          {
            std::optional<Bf16Autocast> ac;
            if (autocast) ac.emplace();
            y = packed ? lt::recompute::conv_keeping_packed_input(*conv, in, pack_tensor(x)) : conv->forward(in);
          }
          torch::manual_seed(13);
          y.backward(torch::randn(y.sizes()).to(y.scalar_type()));
          std::vector<torch::Tensor> out{y.detach(), in.grad()};
          for (auto& p : conv->parameters()) out.push_back(p.grad());
          return out;
        };
        const auto plain = run(false), packed = run(true);
        ASSERT_EQ(plain.size(), packed.size());
        EXPECT_EQ(plain[0].scalar_type(), autocast ? torch::kBFloat16 : torch::kFloat);
        for (size_t i = 0; i < plain.size(); ++i) {
          ASSERT_TRUE(packed[i].defined()) << i;
          EXPECT_EQ(plain[i].scalar_type(), packed[i].scalar_type()) << i;
          EXPECT_TRUE(torch::equal(plain[i], packed[i])) << i;
        }
      }
}

// The unpacked input lives only while the forward runs; the node keeps the pack, lets it go
// in its backward, and refuses a second backward by name.
TEST(PackedActivation, ConvKeepingPackedInputHoldsOnlyThePack) {
  lt::MemoryMeter meter(-1);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(16, 4, 1).bias(false));
  const auto x = sparse({4, 16, 32, 32}, 0.5, torch::kFloat, 3);
  auto stand_in = torch::zeros({}).expand(x.sizes()).contiguous().requires_grad_(true);
  auto packed = std::make_optional(pack_tensor(x));
  const int64_t pack_bytes = packed_bytes(*packed);
  ASSERT_LT(pack_bytes, x.nbytes());
  const auto before = meter.stats().current_bytes;
  auto y = lt::recompute::conv_keeping_packed_input(*conv, stand_in, *packed);
  packed.reset();  // the node's copy is what is left
  const auto held = meter.stats().current_bytes - before;
  EXPECT_LE(held, static_cast<int64_t>(y.nbytes()) + 4096) << "more than the output is held beyond the pack";
  EXPECT_GE(held, static_cast<int64_t>(y.nbytes())) << "the pack was let go before the backward";
  auto loss = y.sum();
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_TRUE(stand_in.grad().defined());
  try {
    loss.backward();
    FAIL() << "a second backward through the packed convolution was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv_keeping_packed_input: differentiated twice"), std::string::npos)
        << e.what();
  }
}

// Note [Packing without a host sync]: the path a GPU takes, run on the CPU, calls no operator
// that reads a value on the host (HostReads) and builds the CPU's
// layout bit for bit (bits and values) in every dtype and layout, over several gather chunks
// (the last one short), with NaN, infinities and signed zeros, and keeps a dense tensor whole;
// unpacking gives the tensor back.
TEST(PackedActivation, SyncFreePackIsTheCpuLayoutBitwise) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<std::pair<std::string, torch::Tensor>> cases;
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble}) {
    cases.emplace_back(c10::str(dtype, " odd"), sparse({3, 5, 7, 11}, 0.5, dtype, 11));
    cases.emplace_back(c10::str(dtype, " channels-last"),
                       sparse({2, 64, 24, 24}, 0.4, dtype, 12).contiguous(at::MemoryFormat::ChannelsLast));
  }
  cases.emplace_back("3 gather chunks", sparse({(int64_t{5} << 19) + 3}, 0.6, torch::kFloat, 13));
  auto special = torch::zeros({40});
  special.index_put_({torch::tensor({1, 2, 5, 8, 30})}, torch::tensor({-0.0f, nan, -inf, 2.0f, inf}));
  cases.emplace_back("special values", special);
  cases.emplace_back("dense", torch::randn({32, 32}) + 10.0);
  for (const auto& [name, x] : cases) {
    SCOPED_TRACE(name);
    const auto at_once = pack_tensor(x, /*sync_free=*/false);
    lt::recompute::PackedTensor deferred, r;
    {
      lt_test::HostReads reads;  // the pack and its gather read nothing on the host
      deferred = pack_tensor(x, /*sync_free=*/true);
      ASSERT_TRUE(deferred.deferred);
      EXPECT_FALSE(deferred.values.defined());
      r = lt::recompute::resolved_pack(deferred);
      EXPECT_EQ(reads.count(), 0) << reads.names();
    }
    EXPECT_FALSE(r.deferred);
    ASSERT_EQ(r.bits.defined(), at_once.bits.defined());
    if (r.bits.defined()) {
      EXPECT_TRUE(torch::equal(r.bits, at_once.bits));
      EXPECT_TRUE(bitwise_equal(r.values, at_once.values));
    } else {
      EXPECT_TRUE(r.values.is_same(x));  // kept whole, as the CPU keeps it
    }
    EXPECT_EQ(packed_bytes(deferred), packed_bytes(at_once));
    EXPECT_TRUE(bitwise_equal(unpack_tensor(deferred), unpack_tensor(at_once)));
  }
}

// A sync-free pack holds its tensor until the thread's next sync-free pack gathers its values
// (or an unpack does), then lets it go; its copies share the gather. A tensor changed in place
// before the gather is refused by name.
TEST(PackedActivation, SyncFreePackIsGatheredByTheNextPack) {
  const auto x = sparse({4, 16, 8, 8}, 0.5, torch::kFloat, 21);
  const auto y = sparse({4, 16, 8, 8}, 0.5, torch::kFloat, 22);
  const auto refs = x.use_count();
  const auto p = pack_tensor(x, /*sync_free=*/true);
  const auto copy = p;
  EXPECT_EQ(x.use_count(), refs + 1);  // the pack keeps x until it is gathered
  const auto q = pack_tensor(y, /*sync_free=*/true);
  EXPECT_EQ(x.use_count(), refs);  // gathered by the next pack
  EXPECT_TRUE(bitwise_equal(unpack_tensor(copy), x));
  EXPECT_TRUE(bitwise_equal(unpack_tensor(q), y));  // an unpack gathers too
  {
    auto z = sparse({64}, 0.5, torch::kFloat, 23);
    const auto r = pack_tensor(z, /*sync_free=*/true);
    z.add_(1.0);
    try {
      unpack_tensor(r);
      FAIL() << "a pack of a tensor changed in place was unpacked";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("pack_tensor: the packed tensor was modified in place"), std::string::npos)
          << e.what();
    }
  }  // r is gone: the next sync-free pack has nothing to gather
  EXPECT_TRUE(bitwise_equal(unpack_tensor(pack_tensor(x, /*sync_free=*/true)), x));
}

// A convolution keeping a sync-free pack of its input has conv's gradients bitwise, as with a
// pack made at once (ConvKeepingPackedInputHasConvsGradientsBitwise).
TEST(PackedActivation, ConvKeepingASyncFreePackHasConvsGradientsBitwise) {
  torch::manual_seed(14);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(8, 6, 3).stride(2).padding(1).bias(true));
  const auto x = sparse({3, 8, 11, 9}, 0.4, torch::kFloat, 15);
  auto run = [&](bool packed) {
    for (auto& p : conv->parameters()) p.mutable_grad() = torch::Tensor();
    auto in = x.clone().requires_grad_(true);
    auto y = packed ? lt::recompute::conv_keeping_packed_input(*conv, in, pack_tensor(x, /*sync_free=*/true))
                    : conv->forward(in);
    y.backward(torch::ones_like(y));
    std::vector<torch::Tensor> out{y.detach(), in.grad()};
    for (auto& p : conv->parameters()) out.push_back(p.grad());
    return out;
  };
  const auto plain = run(false), packed = run(true);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], packed[i])) << i;
}

TEST(PackedActivation, BadInputIsRefusedByName) {
  try {
    nonzero_bits(torch::zeros({4}, torch::kInt));
    FAIL() << "an int tensor was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nonzero_bits: expected a dense floating-point tensor"), std::string::npos)
        << e.what();
  }
  lt::recompute::PackedTensor p = pack_tensor(sparse({64}, 0.9, torch::kFloat, 2));
  ASSERT_TRUE(p.bits.defined());
  p.values = p.values.narrow(0, 0, p.values.numel() - 1);  // one value lost
  try {
    unpack_tensor(p);
    FAIL() << "a truncated pack was unpacked";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unpack_tensor: the mask has"), std::string::npos) << e.what();
  }
}

}  // namespace
