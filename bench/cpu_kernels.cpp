// leantrain_bench_kernels: the CPU kernels of Note [CPU kernels for the tanh GELU and the
// loss's softmax] against the ATen ops they replace, on a GPT step's shapes, in the same run:
//   - the tanh GELU forward and backward over [tokens, 4 d] in fp32 and bf16
//     (at::gelu / at::gelu_backward);
//   - one fused-loss chunk's softmax rows [rows, vocab] in fp32 (what lm_loss.cpp ran before:
//     _log_softmax, gather, exp_, scatter_add_, mul_).
// Each pair runs interleaved (ATen, leantrain, ATen, ...) on fresh copies of the same inputs,
// after three warm-ups; the medians and their ratio are printed. Freed memory is kept for reuse,
// as in training (keep_freed_memory_for_reuse).
//
//   build/bin/leantrain_bench_kernels [--tokens 1024] [--d 768] [--rows 512] [--vocab 50257]
//                                     [--repeats 15] [--threads 2]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "leantrain/recompute/cpu_kernels.h"
#include "leantrain/runtime/runtime_context.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void row(const std::string& what, int repeats, const std::function<void()>& prepare, const std::function<void()>& aten,
         const std::function<void()>& ours) {
  std::vector<double> ta, to;
  for (int i = -3; i < repeats; ++i) {  // i < 0: warm-up
    prepare();
    const double a = ms(aten);
    prepare();
    const double o = ms(ours);
    if (i >= 0) {
      ta.push_back(a);
      to.push_back(o);
    }
  }
  const double ma = median(ta), mo = median(to);
  std::printf("| %s | %.2f | %.2f | **%.2fx** |\n", what.c_str(), ma, mo, ma / mo);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 1024, d = 768, rows = 512, vocab = 50257;
  int repeats = 15, threads = 2;
  const char* usage =
      "leantrain_bench_kernels [--tokens 1024] [--d 768] [--rows 512] [--vocab 50257] [--repeats 15] [--threads 2]\n";
  const int rc = lt_bench::parse_args(argc, argv, usage, {}, [&](const std::string& k, const std::string& v) {
    if (k == "--tokens") tokens = std::stoll(v);
    else if (k == "--d") d = std::stoll(v);
    else if (k == "--rows") rows = std::stoll(v);
    else if (k == "--vocab") vocab = std::stoll(v);
    else if (k == "--repeats") repeats = std::stoi(v);
    else if (k == "--threads") threads = std::stoi(v);
    else return false;
    return true;
  });
  if (rc >= 0) return rc;
  if (tokens < 1 || d < 1 || rows < 1 || vocab < 1 || repeats < 1 || threads < 1) {
    std::fprintf(stderr, "every option must be at least 1\n");
    return 2;
  }
  torch::set_num_threads(threads);
  lt::keep_freed_memory_for_reuse();
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  std::printf("%d threads; GELU over [%lld, %lld]; loss chunk [%lld, %lld]; median of %d interleaved runs\n\n",
              threads, static_cast<long long>(tokens), static_cast<long long>(4 * d), static_cast<long long>(rows),
              static_cast<long long>(vocab), repeats);
  {  // The first ~0.1 s of a process runs slower here (thread pool, heap growth): burn it first.
    const auto h = torch::randn({tokens, 4 * d});
    for (int i = 0; i < 20; ++i) {
      (void)at::gelu(h, "tanh");
      (void)lt::recompute::gelu(h, "tanh");
    }
  }
  std::printf("| op | ATen ms | leantrain ms | speed-up |\n|---|---|---|---|\n");
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const std::string name = dtype == torch::kFloat ? "fp32" : "bf16";
    const auto h = torch::randn({tokens, 4 * d}).to(dtype);
    const auto g = torch::randn({tokens, 4 * d}).to(dtype);
    torch::Tensor out;
    row("tanh GELU forward, " + name, repeats, [] {}, [&] { out = at::gelu(h, "tanh"); },
        [&] { out = lt::recompute::gelu(h, "tanh"); });
    row("tanh GELU backward, " + name, repeats, [] {}, [&] { out = at::gelu_backward(g, h, "tanh"); },
        [&] { out = lt::recompute::gelu_backward(g, h, "tanh"); });
  }
  const auto logits = torch::randn({rows, vocab}) * 3;
  const auto target = torch::randint(0, vocab, {rows});
  const double scale = 1.0 / (2.0 * static_cast<double>(rows));
  torch::Tensor x;
  double loss = 0.0;
  row("loss chunk: softmax, loss, gradient (fp32)", repeats, [&] { x = logits.clone(); },
      [&] {
        auto logp = at::_log_softmax(x, 1, false);
        loss = -logp.gather(1, target.unsqueeze(1)).sum().item<double>();
        logp.exp_();
        logp.scatter_add_(1, target.unsqueeze(1), torch::full({rows, 1}, -1.0f));
        logp.mul_(scale);
      },
      [&] { loss = lt::recompute::softmax_xent_grad_(x, target, scale); });
  return 0;
}
