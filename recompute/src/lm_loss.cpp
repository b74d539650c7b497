#include "leantrain/recompute/lm_loss.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "leantrain/recompute/cpu_kernels.h"
#include "leantrain/recompute/host_readback.h"
#include "leantrain/runtime/errors.h"


namespace lt::recompute {

// Note [Fused LM loss]
// A language model's head and loss are its largest activations: GPT-2 at micro-batch 8 and
// seq 512 has [4096, 50257] logits, 823 MB in fp32, which the plain path holds twice over
// (cross-entropy's saved log-softmax, and the fp32 copy of bf16 logits under autocast) and
// whose backward adds two more of that size — about 3 GB of a 5.7 GB bf16 step, and the same
// 3 GB in fp32, which is why bf16 halved only the blocks' part. Since the loss is a scalar,
// the gradients of hidden, weight and bias are known once the logits are: d loss/d logits =
// (softmax - onehot) / count. So forward walks the rows in chunks (one chunk's logits at a
// time, at most the weight gradient's size: Note [Fused LM loss chunks]), computes each chunk's loss sum, turns its logits into that gradient
// in place, and multiplies it into grad_hidden ([N, D]) and grad_weight ([V, D], summed over
// chunks in fp32), both kept in the matmul dtype; backward only scales them by the incoming
// gradient. The
// same three matmuls as the plain path, nothing recomputed (unlike Note [Chunked LM loss]),
// and the head's memory is ~3 chunks plus grad_weight (its per-chunk product is added in
// blocks of vocabulary rows). Rows whose target is ignored are
// dropped before the head (BERT's unmasked tokens: ~85 % of its head's work).
// Precision as the plain path under autocast (except where bf16 GEMMs are slow: Note [Head
// products in fp32 where bf16 GEMMs are slow], below): the matmuls in the autocast dtype (the weight
// cast once), the log-softmax in fp32, grad_hidden rounded through that dtype as autocast's
// cast backward would; grad_weight summed over chunks in fp32, then rounded to that dtype
// once (the plain path's bf16 matmul rounds it once too). Not under fp16: its
// gradients here would be computed before the loss scale multiplies them and could underflow
// (fused_lm_loss_applies). Tested against the plain loss: LmLoss.FusedAndChunkedMatchPlainLoss.
// Note [Head products in fp32 where bf16 GEMMs are slow]
// On an x86 CPU without AMX, oneDNN's bf16 GEMM (AVX512-BF16 dot products, or emulated on
// AVX2) runs below its fp32 GEMM: 139 against 218 GFLOP/s for GPT-2's head product
// [1024,768] x [768,50257] on 2 threads of the Xeon these benchmarks ran on, and 156 against
// 315 for the weight gradient's [5461,256] x [256,768] blocks. The head is the largest matmul
// of a GPT (a third of GPT-6L's step), and the fused loss owns its three products, so under
// precision.head_matmul = auto (the default) they run there as fp32 GEMMs: the logits from
// the weight and hidden rounded to bf16, as autocast rounds them, then widened (so the
// products are the bf16 GEMM's, which also accumulates in fp32, except that the logits are
// not rounded to bf16 before the fp32 log-softmax); grad_hidden and grad_weight from the fp32
// logit gradient (not rounded to bf16 first) and the same operands; grad_weight accumulates
// in fp32 inside the GEMM (beta = 1) instead of in bf16 blocks added to an fp32 sum. Each is
// at least as accurate as the bf16 product. It costs an fp32 copy of the rounded weight while
// the chunks run ([V, D]: 154 MB for GPT-2, instead of the bf16 copy's 77 MB). On CUDA and on
// CPUs with AMX-BF16 the products stay bf16; `autocast` keeps them bf16 everywhere, `fp32`
// forces this path (tests). GPT-6L seq 256 bf16 full step: docs/BENCH_PEERS.md.
namespace {
HeadMatmul parse_products(const std::string& key, const std::string& text) {
  if (text == "auto") return HeadMatmul::kAuto;
  if (text == "autocast") return HeadMatmul::kAutocast;
  if (text == "fp32") return HeadMatmul::kFp32;
  throw ConfigError(key + " = '" + text + "': allowed: auto | autocast | fp32");
}
}  // namespace

HeadMatmul parse_head_matmul(const std::string& text) { return parse_products("precision.head_matmul", text); }

HeadMatmul parse_conv_products(const std::string& text) { return parse_products("precision.conv_products", text); }

bool cpu_bf16_gemm_is_slow() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool slow = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return true;
    return (d & (1u << 22)) == 0;  // CPUID.(7,0):EDX[22] = AMX-BF16
  }();
  return slow;
#else
  return false;
#endif
}

bool head_products_in_fp32(HeadMatmul choice, c10::ScalarType compute, c10::DeviceType device) {
  if (compute == torch::kFloat || choice == HeadMatmul::kAutocast) return false;
  if (choice == HeadMatmul::kFp32) return true;
  return device == c10::DeviceType::CPU && compute == torch::kBFloat16 && cpu_bf16_gemm_is_slow();
}

// Note [Fused LM loss without host syncs]
// Two steps of the fused loss size a tensor by a count that lives on the device: dropping the
// rows whose target is ignored (valid.all().item() and nonzero()), and the tied embedding's
// backward grouping its rows by distinct token (_unique2). On the CPU reading the count costs
// nothing, and both stay: dropping rows saves the head's work on them, and grouping keeps the
// sums bitwise those of the plain embedding (Note [Tied embedding's gradient added into the
// head's]). On a GPU each read drains the stream once per micro-batch (Note [Counts read behind
// the queue], host_readback.cpp), so there (`sync_free`) every row goes through the head, an
// ignored row's target pointing at class 0 and its loss and gradient multiplied by a weight of
// 0 (the valid rows' by 1 / count, as before), and the embedding adds each token's row straight
// into the head's gradient. The loss and the gradients are the same up to fp32 rounding
// (summation order; LmLoss.SyncFreePathMatchesTheCpuPath runs both on the CPU). The head's
// extra work is the ignored rows': none for GPT, whose targets are all valid, and none for
// BERT, which hands the head only its masked rows (MaskedRows, read behind its encoder).

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FusedLinearCrossEntropy : torch::autograd::Function<FusedLinearCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor h, torch::Tensor w, torch::Tensor b,
                               torch::Tensor target, int64_t chunk, c10::ScalarType compute, bool has_bias,
                               bool fp32_products, c10::intrusive_ptr<TiedGradSlot> slot, bool sync_free) {
    // Explicit casts below; autocast would cast the weight again for every chunk.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto valid = target != kIgnoreIndex;
    const auto count = valid.sum().clamp_min(1).to(torch::kFloat);
    const auto inv_count = count.reciprocal();
    // Note [Fused LM loss without host syncs]: sync-free, every row runs through the head and
    // an ignored row's target points at class 0 with a weight of 0; else the ignored rows are
    // dropped, which reads their number on the host.
    torch::Tensor rows, tv, keep, row_weight;  // keep, row_weight: [m, 1], sync-free only
    if (sync_free) {
      tv = at::where(valid, target, at::zeros({}, target.options()));
      keep = valid.unsqueeze(1);
      row_weight = at::where(keep, inv_count, at::zeros({}, inv_count.options()));
    } else {
      if (!valid.all().item<bool>()) rows = valid.nonzero().squeeze(1);
      tv = rows.defined() ? target.index_select(0, rows) : target;
    }
    const auto hv = rows.defined() ? h.index_select(0, rows) : h;
    const int64_t m = hv.size(0);
    // Several chunks: grad_weight summed in fp32. One chunk (few tokens: a small micro-batch
    // or sequence): its one product, in the matmul dtype, is grad_weight, as in the plain path
    // (an fp32 sum would only add a [V, D] fp32 tensor to the peak).
    const bool one_chunk = m <= chunk;
    // Chunks of equal size: 1024 rows at a 768-row limit run as 2 x 512, not 768 + 256 (a
    // tail chunk streams the whole [V, D] weight twice for a few rows).
    if (!one_chunk) {
      const int64_t n = (m + chunk - 1) / chunk;
      chunk = (m + n - 1) / n;
    }
    // grad_weight's fp32 sum: written by the first chunk's product, so never zero-filled.
    auto grad_w = one_chunk ? torch::Tensor() : torch::empty(w.sizes(), w.options().dtype(torch::kFloat));
    auto grad_b = has_bias ? torch::zeros(b.sizes(), b.options().dtype(torch::kFloat)) : torch::Tensor();
    auto grad_hv = torch::empty({m, h.size(1)}, h.options().dtype(compute));
    auto total = torch::zeros({}, h.options().dtype(torch::kFloat));
    std::optional<double> inv_count_value;  // read once, by the first chunk that needs it on the host
    {  // the casts live only through the chunks
      // The products' operands: in the matmul dtype, or rounded to it and widened to fp32
      // (Note [Head products in fp32 where bf16 GEMMs are slow]).
      const auto operand = [&](const torch::Tensor& t) {
        return fp32_products ? t.to(compute).to(torch::kFloat) : t.to(compute);
      };
      const auto wc = operand(w);
      const auto bc = has_bias ? operand(b) : torch::Tensor();
      const auto xc = hv.to(compute);
      const int64_t vocab = w.size(0);
      const int64_t vblock = std::max<int64_t>(1, (int64_t{4} << 20) / std::max<int64_t>(1, w.size(1)));
      for (int64_t s = 0; s < m; s += chunk) {
        const int64_t len = std::min(chunk, m - s);
        const auto x = fp32_products ? xc.narrow(0, s, len).to(torch::kFloat) : xc.narrow(0, s, len);
        const auto t = tv.narrow(0, s, len).unsqueeze(1);
        auto logp = (bc.defined() ? at::linear(x, wc, bc) : at::linear(x, wc)).to(torch::kFloat);
        if (!sync_free && softmax_xent_kernel_applies(logp)) {
          // The CPU: the chunk's losses and d(their sum)/d logits / count in one kernel that
          // keeps each row in cache (Note [CPU kernels for the tanh GELU and the loss's softmax]).
          if (!inv_count_value) inv_count_value = inv_count.item<double>();
          total.add_(softmax_xent_grad_(logp, t.squeeze(1), *inv_count_value));
        } else {
          // One fused log-softmax (the kernel cross-entropy runs) instead of logsumexp's passes
          // and a subtraction: the chunk's losses are -log p[target].
          logp = at::_log_softmax(logp, 1, /*half_to_float=*/false);
          const auto picked = logp.gather(1, t);
          total.sub_((keep.defined() ? at::where(keep.narrow(0, s, len), picked, at::zeros({}, picked.options()))
                                     : picked).sum());
          // d(sum of the chunk's losses)/d logits = softmax - onehot; then / count (the mean),
          // sync-free times 0 for an ignored row (its weight).
          logp.exp_();
          logp.scatter_add_(1, t, torch::full({len, 1}, -1.0f, logp.options()));
          logp.mul_(keep.defined() ? row_weight.narrow(0, s, len) : inv_count);
        }
        if (fp32_products) {
          // fp32 GEMMs from the fp32 logit gradient; grad_weight accumulates inside the GEMM.
          grad_hv.narrow(0, s, len).copy_(at::mm(logp, wc));
          if (one_chunk) grad_w = at::mm(logp.t(), x);
          else if (s == 0) at::mm_out(grad_w, logp.t(), x);
          else grad_w.addmm_(logp.t(), x);
          if (grad_b.defined()) grad_b.add_(logp.sum(0));
          continue;
        }
        const auto g = logp.to(compute);
        logp = torch::Tensor();
        auto gh = grad_hv.narrow(0, s, len);
        at::mm_out(gh, g, wc);
        if (one_chunk) {
          grad_w = at::mm(g.t(), x);
        } else if (compute == torch::kFloat) {
          // fp32: the product accumulates inside the GEMM (beta = 1): no transient, no extra pass.
          if (s == 0) at::mm_out(grad_w, g.t(), x);
          else grad_w.addmm_(g.t(), x);
        } else {
          // bf16: grad_weight += g^T x in blocks of vocabulary rows (the GEMM cannot add its
          // bf16 product into fp32): the product's transient is one block (~4M elements), not [V, D].
          for (int64_t v0 = 0; v0 < vocab; v0 += vblock) {
            const int64_t vb = std::min(vblock, vocab - v0);
            auto blk = grad_w.narrow(0, v0, vb);
            const auto prod = at::mm(g.narrow(1, v0, vb).t(), x);
            if (s == 0) blk.copy_(prod);
            else blk.add_(prod);
          }
        }
        if (grad_b.defined()) grad_b.add_(g.sum(0, /*keepdim=*/false, torch::kFloat));
      }
    }
    // Kept until backward in the matmul dtype, as the plain path's matmuls produce them
    // (grad_hidden's values are that dtype's already; grad_weight is rounded once, after its
    // fp32 sum): under bf16 that halves what the head holds through the blocks' backward.
    torch::Tensor grad_h = grad_hv;
    if (rows.defined()) grad_h = torch::zeros({h.size(0), h.size(1)}, grad_hv.options()).index_copy_(0, rows, grad_hv);
    ctx->saved_data["grad_h"] = grad_h;
    if (!grad_w.defined()) grad_w = torch::zeros(w.sizes(), w.options().dtype(compute));  // no rows
    ctx->saved_data["grad_w"] = grad_w.to(compute);
    ctx->saved_data["grad_b"] = grad_b;
    ctx->saved_data["h_dtype"] = static_cast<int64_t>(h.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    if (slot) ctx->saved_data["slot"] = c10::IValue::make_capsule(slot);
    return total * inv_count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto g = grad_out[0];
    auto grad_b = ctx->saved_data["grad_b"].toTensor();
    const auto h_dtype = static_cast<c10::ScalarType>(ctx->saved_data["h_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    // The saved gradients leave the context and are scaled in place, so a gradient costs no
    // second allocation: with the dtype unchanged, `saved * g` would add one [V, D] tensor (a
    // fresh, page-faulting 154 MB for GPT-2's head in fp32) while the saved one is still held.
    // Like any graph whose saved tensors were freed, a second backward is refused.
    auto take = [ctx](const char* key) {
      auto it = ctx->saved_data.find(key);
      TORCH_CHECK(it != ctx->saved_data.end(),
                  "fused_linear_cross_entropy: backward ran a second time through the same graph; "
                  "its saved gradients were freed by the first backward (retain_graph is not supported)");
      auto t = it->second.toTensor();
      ctx->saved_data.erase(it);
      return t;
    };
    auto scaled = [&g](const torch::Tensor& saved, c10::ScalarType dtype) { return saved.to(dtype).mul_(g); };
    auto grad_h = scaled(take("grad_h"), h_dtype);
    auto grad_w = scaled(take("grad_w"), w_dtype);
    if (auto it = ctx->saved_data.find("slot"); it != ctx->saved_data.end()) {
      // Note [Tied embedding's gradient added into the head's]
      c10::static_intrusive_pointer_cast<TiedGradSlot>(it->second.toCapsule())->grad = grad_w;
      ctx->saved_data.erase(it);
    }
    return {grad_h, grad_w, grad_b.defined() ? grad_b * g : torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Note [Tied embedding's gradient added into the head's]
// GPT's wte and BERT's tok_emb are also their heads' weights, so backward makes two [V, D]
// gradients for one parameter and autograd adds them: the embedding's, which
// embedding_dense_backward builds by zero-filling a fresh [V, D] tensor (page faults and a
// pass: 38 ms for GPT-2's 154 MB on 2 threads) and adding each token's row into it, and then
// the sum of the two (another pass over three [V, D] tensors' bytes) — per micro-batch, though
// only the rows of the batch's distinct tokens are non-zero. The fused head's backward runs
// first (the embedding's gradient comes from the blocks' backward, which starts from the
// head's grad_hidden) and leaves its weight gradient in a TiedGradSlot; the embedding's
// backward then adds its rows into that tensor, which autograd is holding for the weight
// (it accumulates into .grad only once every edge to the weight has delivered), and returns
// no gradient. Bitwise the same sums: each distinct token's rows are first summed in token
// order from zero, as embedding_dense_backward sums them, then added to the head's row once,
// as autograd adds the two gradients. Without a fused head in the same forward (plain or
// chunked loss, fp16, eval) the slot stays empty and the dense gradient is returned.
struct TiedEmbedding : torch::autograd::Function<TiedEmbedding> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& weight, const torch::Tensor& ids,
                               c10::intrusive_ptr<TiedGradSlot> slot, bool sync_free) {
    ctx->saved_data["ids"] = ids;
    ctx->saved_data["rows"] = weight.size(0);
    ctx->saved_data["slot"] = c10::IValue::make_capsule(std::move(slot));
    ctx->saved_data["sync_free"] = sync_free;
    return at::embedding(weight, ids);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto ids = ctx->saved_data["ids"].toTensor();
    const int64_t rows = ctx->saved_data["rows"].toInt();
    auto slot = c10::static_intrusive_pointer_cast<TiedGradSlot>(ctx->saved_data["slot"].toCapsule());
    auto head = std::move(slot->grad);
    slot->grad = torch::Tensor();
    const auto& g = grad_out[0];
    if (!head.defined() || head.dim() != 2 || head.size(0) != rows || head.size(1) != g.size(-1) ||
        head.device() != g.device() || !head.is_contiguous())
      return {at::embedding_backward(g, ids, rows, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false,
                                     /*sparse=*/false),
              torch::Tensor(), torch::Tensor(), torch::Tensor()};
    const auto flat = ids.reshape({-1});
    const auto rows_of_g = g.reshape({-1, g.size(-1)});
    if (ctx->saved_data["sync_free"].toBool()) {
      // Note [Fused LM loss without host syncs]: each token's row straight into the head's
      // gradient. _unique2 below sizes its output by the number of distinct tokens, read on the
      // host; here the same sums in another order (CUDA's index_add_ adds with atomics anyway).
      head.index_add_(0, flat, rows_of_g.to(head.scalar_type()));
      return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    const auto [tokens, inverse, counts] = at::_unique2(flat, /*sorted=*/true, /*return_inverse=*/true);
    auto sums = torch::zeros({tokens.size(0), g.size(-1)}, g.options());
    sums.index_add_(0, inverse, rows_of_g);
    head.index_add_(0, tokens, sums.to(head.scalar_type()));
    return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_lm_loss_applies(c10::DeviceType device) {
  if (!torch::GradMode::is_enabled()) return false;
  return !(at::autocast::is_autocast_enabled(device) && at::autocast::get_autocast_dtype(device) == at::kHalf);
}

int64_t lm_loss_chunk_tokens(int64_t vocab) { return std::max<int64_t>(64, (int64_t{64} << 20) / (4 * vocab)); }

// Note [Fused LM loss chunks]
// The fused loss holds the head's weight gradient as an fp32 [V, D] sum through its chunks
// (Note [Fused LM loss]), so a chunk whose fp32 logits take as much ([D, V]: D rows) adds no
// new order of memory to the head: its peak is that sum plus about two chunks of logits (the
// product and its log-softmax). Chunks of 64 MiB alone would be 333 rows for GPT-2's 50257
// tokens, which runs the three products at 256 rows each when a micro-batch has 1024 tokens
// (four equal chunks): GEMMs that short run below the long ones' rate, and each chunk streams
// the whole [V, D] weight and gradient again. Measured on 2 threads (fp32, [1024, 768] hidden,
// V = 50257; the chunk loop alone, median of 6): 1.35 s at 256 rows, 1.26 s at 512 (two chunks
// of 768 rows at most), 1.22 s in one chunk; about 190 ms of a GPT-12 fp32 step of 8 s at
// micro-batch 4 and seq 256, for 103 MB more logits in the head's transient. So a chunk has
// max(D, 64 MiB of logits) rows: 768 for GPT-2 and BERT-base; the 64 MiB floor for a small D.
// The recomputed chunks (Note [Chunked LM loss]) keep 64 MiB: their logits are rebuilt in
// backward next to the blocks' gradients, where the peak is.
int64_t fused_lm_loss_chunk_tokens(int64_t vocab, int64_t dim) {
  return std::max(lm_loss_chunk_tokens(vocab), dim);
}

torch::Tensor fused_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                         const torch::Tensor& bias, const torch::Tensor& target,
                                         int64_t chunk_tokens, HeadMatmul matmul,
                                         const c10::intrusive_ptr<TiedGradSlot>& slot, std::optional<bool> sync_free) {
  TORCH_CHECK(chunk_tokens > 0, "fused_linear_cross_entropy: chunk_tokens must be > 0, got ", chunk_tokens);
  const auto h = hidden.reshape({-1, hidden.size(-1)});
  const auto t = target.reshape({-1});
  TORCH_CHECK(t.size(0) == h.size(0), "fused_linear_cross_entropy: target ", target.sizes(), " does not match hidden ",
              hidden.sizes());
  const auto device = h.device().type();
  const c10::ScalarType compute = at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device)
                                                                            : h.scalar_type();
  // An undefined tensor cannot be a custom function's input: without a bias, an empty one.
  const bool has_bias = bias.defined();
  return FusedLinearCrossEntropy::apply(h, weight, has_bias ? bias : torch::empty({0}, h.options()), t, chunk_tokens,
                                        compute, has_bias, head_products_in_fp32(matmul, compute, device), slot,
                                        sync_free.value_or(!h.is_cpu()));
}

torch::Tensor tied_embedding(const torch::Tensor& weight, const torch::Tensor& ids,
                             const c10::intrusive_ptr<TiedGradSlot>& slot, std::optional<bool> sync_free) {
  if (!slot || !torch::GradMode::is_enabled() || !weight.requires_grad()) return at::embedding(weight, ids);
  return TiedEmbedding::apply(weight, ids, slot, sync_free.value_or(!weight.is_cpu()));
}

MaskedRows::MaskedRows(const torch::Tensor& target, std::optional<bool> sync_free)
    : valid_(target.reshape({-1}) != kIgnoreIndex), sync_free_(sync_free.value_or(!target.is_cpu())) {
  if (sync_free_) count_ = HostReadback(valid_.sum());
}

torch::Tensor MaskedRows::indices() {
  if (!sync_free_) return valid_.nonzero().squeeze(1);
  // Note [Counts read behind the queue]: the count was queued at construction; nonzero_static
  // with that size finds the same rows, in the same order, without reading anything back.
  return at::nonzero_static(valid_, count_.sum()).squeeze(1);
}

}  // namespace lt::recompute
