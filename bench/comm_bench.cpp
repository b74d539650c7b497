// Benchmark: gradient synchronisation, all in one mpirun invocation (docs/BENCH_COMM.md):
//  (a) bus bandwidth of GradientSync::all_reduce over a real model's gradients (GPT-2 small's
//      parameter shapes by default) against one raw MPI_Allreduce of the same bytes, measured
//      nccl-tests style (warm-up, timed iterations alternating the two, per-rank mean time
//      averaged over ranks, algbw = bytes / time, busbw = algbw * 2(n-1)/n), every result
//      checked against the exact sum;
//  (b) the share of gradient communication NOT hidden behind backward in real training steps:
//      the time a step waits after backward with comm.overlap on, over the same wait with it
//      off (then all communication is exposed);
//  (c) weak-scaling efficiency 1 -> n ranks at one thread each: samples/s per rank with n
//      ranks (overlap on) over samples/s of rank 0 training alone (the other ranks sleep),
//      measured before and after the n-rank steps and averaged.
//
//   mpirun --allow-run-as-root -np 2 --bind-to none --mca mpi_yield_when_idle 1 \
//          -x MALLOC_MMAP_THRESHOLD_=4294967295 -x MALLOC_TRIM_THRESHOLD_=4294967295 \
//          build/bin/leantrain_bench_comm [--layers 12] [--d-model 768] [--vocab 50257]
//          [--warmup 2] [--iters 5] [--train-layers 4] [--train-vocab 256] [--seq 128]
//          [--micro 4] [--steps 4] [--first-mb 1] [--bucket-mb 25] [--parts abc]
//
// Prints ratios against baselines measured in the same run; it asserts nothing (no timed tests).
#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "leantrain/comm/buckets.h"
#include "leantrain/comm/grad_sync.h"
#include "leantrain/comm/mpi_communicator.h"
#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/trainers/trainer.h"

namespace {

struct Options {
  int64_t layers = 12, d_model = 768, vocab = 50257, warmup = 2, iters = 5;
  int64_t train_layers = 4, train_vocab = 256, seq = 128, micro = 4, steps = 4;
  double first_mb = 1.0, bucket_mb = 25.0;
  std::string parts = "abc";  // a: bandwidth; b, c: training steps
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--layers") o.layers = std::atoll(v);
    else if (k == "--d-model") o.d_model = std::atoll(v);
    else if (k == "--vocab") o.vocab = std::atoll(v);
    else if (k == "--warmup") o.warmup = std::atoll(v);
    else if (k == "--iters") o.iters = std::atoll(v);
    else if (k == "--train-layers") o.train_layers = std::atoll(v);
    else if (k == "--train-vocab") o.train_vocab = std::atoll(v);
    else if (k == "--seq") o.seq = std::atoll(v);
    else if (k == "--micro") o.micro = std::atoll(v);
    else if (k == "--steps") o.steps = std::atoll(v);
    else if (k == "--first-mb") o.first_mb = std::atof(v);
    else if (k == "--bucket-mb") o.bucket_mb = std::atof(v);
    else if (k == "--parts") o.parts = v;
    else {
      std::fprintf(stderr, "leantrain_bench_comm: unknown option %s (see the header of bench/comm_bench.cpp)\n",
                   k.c_str());
      std::exit(2);
    }
  }
  return o;
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double mean_over_ranks(double x) {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  double sum = 0;
  MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return sum / n;
}

// A barrier that sleeps between polls, so a rank waiting out another's solo run leaves its
// core alone (MPI_Barrier spins).
void sleeping_barrier() {
  MPI_Request r;
  MPI_Ibarrier(MPI_COMM_WORLD, &r);
  for (int done = 0;;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Values whose sum over ranks is exact in fp32: pattern (0..6) * (rank + 1).
torch::Tensor pattern_like(const torch::Tensor& t) {
  return torch::arange(t.numel(), torch::kLong).remainder(7).to(torch::kFloat).view(t.sizes());
}

lt::models::ModelConfig gpt(int64_t layers, int64_t d_model, int64_t vocab, int64_t seq) {
  lt::models::ModelConfig c;
  c.kind = "gpt";
  c.n_layer = layers;
  c.d_model = d_model;
  c.n_head = d_model / 64;
  c.vocab_size = vocab;
  c.seq_len = seq;
  return c;
}

// (a) GradientSync vs raw MPI_Allreduce over the same bytes.
void bandwidth(const Options& o, lt::comm::Communicator& comm) {
  const int rank = comm.rank(), n = comm.size();
  torch::manual_seed(0);
  auto model = lt::models::build_model(gpt(o.layers, o.d_model, o.vocab, 1024));
  auto params = model->parameters();
  std::vector<torch::Tensor> base;
  int64_t numel = 0;
  for (auto& p : params) {
    base.push_back(pattern_like(p));
    p.mutable_grad() = torch::empty_like(p);
    numel += p.numel();
  }
  lt::comm::GradientSync sync(params, o.first_mb, o.bucket_mb);
  // The same bucket sizes for the bucketed raw baseline (reverse parameter order, as GradientSync).
  std::vector<lt::comm::BucketTensor> sizes;
  for (auto it = params.rbegin(); it != params.rend(); ++it) sizes.push_back({it->numel() * 4, 0});
  std::vector<int64_t> bucket_numel;
  for (auto& members : lt::comm::assign_buckets(sizes, static_cast<int64_t>(o.first_mb * 1048576),
                                                 static_cast<int64_t>(o.bucket_mb * 1048576))) {
    int64_t e = 0;
    for (size_t i : members) e += sizes[i].bytes / 4;
    bucket_numel.push_back(e);
  }
  auto raw = torch::empty({numel});
  auto raw_base = torch::arange(numel, torch::kLong).remainder(7).to(torch::kFloat);
  const double bytes = static_cast<double>(numel) * 4;
  const float factor = static_cast<float>(rank + 1), total = static_cast<float>(n * (n + 1) / 2);
  int64_t wrong = 0;
  double t_sync = 0, t_fresh = 0, t_raw = 0, t_chunks = 0;
  auto check_raw = [&] {
    if (!torch::equal(raw, raw_base * total)) ++wrong;
  };
  auto check_grads = [&] {
    for (size_t i = 0; i < params.size(); ++i)
      if (!torch::equal(params[i].grad(), base[i] * total)) ++wrong;
  };
  // The four variants alternate within each iteration, so load from elsewhere hits them alike.
  for (int64_t it = 0; it < o.warmup + o.iters; ++it) {
    const bool timed = it >= o.warmup;
    // Raw: one in-place MPI_Allreduce of all gradient bytes.
    raw.copy_(raw_base).mul_(factor);
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    MPI_Allreduce(MPI_IN_PLACE, raw.data_ptr(), static_cast<int>(numel), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (timed) t_raw += since(t0);
    check_raw();
    // Raw, bucketed: one MPI_Iallreduce per bucket-sized chunk, all started, then Waitall.
    raw.copy_(raw_base).mul_(factor);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = Clock::now();
    {
      std::vector<MPI_Request> reqs(bucket_numel.size());
      int64_t off = 0;
      for (size_t b = 0; b < bucket_numel.size(); ++b) {
        MPI_Iallreduce(MPI_IN_PLACE, raw.data_ptr<float>() + off, static_cast<int>(bucket_numel[b]), MPI_FLOAT,
                       MPI_SUM, MPI_COMM_WORLD, &reqs[b]);
        off += bucket_numel[b];
      }
      MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
    }
    if (timed) t_chunks += since(t0);
    check_raw();
    // GradientSync, fresh gradients (the trainer's zero_grad(set_to_none)): packing copies each.
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = base[i] * factor;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = Clock::now();
    sync.all_reduce(comm);
    if (timed) t_fresh += since(t0);
    check_grads();
    // GradientSync, gradients kept as bucket views (written in place, as accumulation does).
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad().copy_(base[i]).mul_(factor);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = Clock::now();
    sync.all_reduce(comm);
    if (timed) t_sync += since(t0);
    check_grads();
  }
  int64_t wrong_all = 0;
  MPI_Allreduce(&wrong, &wrong_all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  const double k = static_cast<double>(o.iters);
  t_sync = mean_over_ranks(t_sync / k);
  t_fresh = mean_over_ranks(t_fresh / k);
  t_raw = mean_over_ranks(t_raw / k);
  t_chunks = mean_over_ranks(t_chunks / k);
  const double bus = 2.0 * (n - 1) / n;
  if (rank == 0) {
    std::printf("(a) gradient all-reduce: GPT d_model %lld, %lld layers, vocab %lld: %lld parameters = %.1f MiB; "
                "%zu buckets (first %.3g MiB, then %.3g MiB); %lld warm-up + %lld timed iterations, %d ranks\n",
                static_cast<long long>(o.d_model), static_cast<long long>(o.layers),
                static_cast<long long>(o.vocab), static_cast<long long>(numel), bytes / 1048576.0,
                sync.num_buckets(), o.first_mb, o.bucket_mb, static_cast<long long>(o.warmup),
                static_cast<long long>(o.iters), n);
    std::printf("    %-44s %10s %12s %12s %8s\n", "", "time (s)", "algbw GB/s", "busbw GB/s", "vs raw");
    std::printf("    %-44s %10.4f %12.3f %12.3f %8.3f\n", "raw MPI_Allreduce (one call)", t_raw, bytes / t_raw / 1e9,
                bytes / t_raw / 1e9 * bus, 1.0);
    auto row = [&](const char* name, double t) {
      std::printf("    %-44s %10.4f %12.3f %12.3f %8.3f\n", name, t, bytes / t / 1e9, bytes / t / 1e9 * bus, t_raw / t);
    };
    row("raw MPI_Iallreduce per bucket + Waitall", t_chunks);
    row("GradientSync, gradients in the buckets", t_sync);
    row("GradientSync, fresh gradients (1 copy)", t_fresh);
    std::printf("    busbw ratio GradientSync / raw MPI_Allreduce: %.3f (target >= 0.9); with fresh gradients %.3f; "
                "results verified: %s\n",
                t_raw / t_sync, t_raw / t_fresh,
                wrong_all == 0 ? "every sum exact" : ("WRONG in " + std::to_string(wrong_all) + " checks").c_str());
  }
}

struct StepTimes {
  double step_s = 0, compute_s = 0, exposed_s = 0, comm_s = 0;
  int64_t in_backward = 0, steps = 0;
  void add(const lt::trainers::StepResult& r) {
    step_s += r.step_time_s - r.data_time_s;
    compute_s += r.compute_s;
    exposed_s += r.comm_exposed_s;
    comm_s += r.comm_time_s;
    in_backward += r.buckets_in_backward;
    ++steps;
  }
  double mean(double x) const { return steps > 0 ? x / static_cast<double>(steps) : 0.0; }
};

// (b) and (c): the trainer's own step (Trainer::train_step: forward, backward with the buckets
// started inside it when overlapping, gradient sync, SGD update) in three Trainers over three
// copies of one model: rank 0 alone (a local communicator, no communication), all ranks with
// comm.overlap off, all ranks with it on. Rounds of the three, so that load from elsewhere on
// the machine hits them alike.
void training(const Options& o, lt::comm::Communicator& comm) {
  const int rank = comm.rank(), n = comm.size();
  lt::Config cfg;
  cfg.model = lt::models::builtin_model_section(gpt(o.train_layers, o.d_model, o.train_vocab, o.seq));
  cfg.data.kind = "synthetic";
  cfg.data.seed = 0;
  cfg.data.options.set("synthetic_samples", std::max<int64_t>(256, o.micro * n * (o.steps + 1)));
  cfg.train.micro_batch = o.micro;
  cfg.train.global_batch = o.micro * n;
  cfg.train.steps = o.steps + 1;
  cfg.train.optimizer = "sgd";
  cfg.train.momentum = 0;
  cfg.train.weight_decay = 0;  // plain SGD, as before the bench ran the trainer's step
  cfg.train.lr = 1e-4;
  cfg.train.grad_clip = 0;
  cfg.comm.first_bucket_mb = o.first_mb;
  cfg.comm.bucket_mb = o.bucket_mb;
  lt::RuntimeContext ctx;
  ctx.threads = 1;
  lt::MemoryMeter::install_cpu_tracking();
  auto make = [&](lt::Config c, lt::comm::Communicator& with) {
    auto parts = lt::trainers::make_components(c);
    parts.eval = nullptr;
    return std::make_unique<lt::trainers::Trainer>(c, parts, ctx, with);
  };
  lt::comm::LocalCommunicator local;
  lt::Config solo_cfg = cfg, off_cfg = cfg;
  solo_cfg.train.global_batch = o.micro;
  off_cfg.comm.overlap = false;
  auto alone = make(solo_cfg, local);
  auto off = make(off_cfg, comm);
  auto on = make(cfg, comm);

  StepTimes solo, t_off, t_on;
  bool same = true;
  for (int64_t r = 0; r < 1 + o.steps; ++r) {  // round 0 warms up
    const bool timed = r >= 1;
    if (rank == 0) {
      const auto s = alone->train_step(r);
      if (timed) solo.add(s);
    }
    sleeping_barrier();  // the other ranks sleep while rank 0 trains alone
    MPI_Barrier(MPI_COMM_WORLD);
    const auto s_off = off->train_step(r);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto s_on = on->train_step(r);
    if (timed) t_off.add(s_off), t_on.add(s_on);
    // Every rank must hold the same weights after the same summed gradients: compare checksums.
    double check = 0;
    for (auto& p : on->model().parameters()) check += p.detach().to(torch::kDouble).abs().sum().item<double>();
    double lo = 0, hi = 0;
    MPI_Allreduce(&check, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&check, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    same = same && lo == hi;
  }

  const double exp_off = mean_over_ranks(t_off.mean(t_off.exposed_s)), exp_on = mean_over_ranks(t_on.mean(t_on.exposed_s));
  const double cmp_off = mean_over_ranks(t_off.mean(t_off.compute_s)), cmp_on = mean_over_ranks(t_on.mean(t_on.compute_s));
  const double step_off = mean_over_ranks(t_off.mean(t_off.step_s)), step_on = mean_over_ranks(t_on.mean(t_on.step_s));
  const double span_on = mean_over_ranks(t_on.mean(t_on.comm_s));
  if (rank != 0) return;
  int64_t numel = 0;
  for (const auto& p : on->model().parameters()) numel += p.numel();
  const double solo_step = solo.mean(solo.step_s);
  const double micro = static_cast<double>(o.micro);
  const int64_t buckets = static_cast<int64_t>(std::llround(t_on.mean(static_cast<double>(t_on.in_backward))));
  std::printf("\n(b)+(c) training steps (Trainer::train_step, SGD): GPT d_model %lld, %lld layers, vocab %lld, seq "
              "%lld, micro-batch %lld (%.1f MiB of gradients); %lld timed rounds after 1 warm-up; 1 thread per rank\n",
              static_cast<long long>(o.d_model), static_cast<long long>(o.train_layers),
              static_cast<long long>(o.train_vocab), static_cast<long long>(o.seq),
              static_cast<long long>(o.micro), numel * 4 / 1048576.0, static_cast<long long>(o.steps));
  std::printf("    %-24s %10s %14s %16s %15s\n", "", "step (s)", "fwd+bwd (s)", "exposed comm (s)", "samples/s/rank");
  std::printf("    %-24s %10.3f %14.3f %16s %15.2f\n", "1 rank alone", solo_step, solo.mean(solo.compute_s), "-",
              micro / solo_step);
  std::printf("    %-24s %10.3f %14.3f %16.4f %15.2f\n", (std::to_string(n) + " ranks, overlap off").c_str(), step_off,
              cmp_off, exp_off, micro / step_off);
  std::printf("    %-24s %10.3f %14.3f %16.4f %15.2f\n", (std::to_string(n) + " ranks, overlap on").c_str(), step_on,
              cmp_on, exp_on, micro / step_on);
  std::printf("    (b) communication not hidden behind backward: %.1f%% (exposed %.4f s with overlap / %.4f s "
              "without); %lld buckets started inside backward per step; overlapped span %.4f s\n",
              100.0 * exp_on / exp_off, exp_on, exp_off, static_cast<long long>(buckets), span_on);
  std::printf("    (c) weak-scaling efficiency 1 -> %d ranks: %.1f%% with overlap (target >= 90%%), %.1f%% without\n",
              n, 100.0 * solo_step / step_on, 100.0 * solo_step / step_off);
  std::printf("    weights identical on every rank after every round: %s\n", same ? "yes" : "NO");
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  torch::set_num_threads(1);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  lt::comm::MpiCommunicator comm(600.0, host);
  if (comm.size() < 2) {
    std::fprintf(stderr, "leantrain_bench_comm: run it under mpirun -np 2 (or more); see docs/BENCH_COMM.md\n");
    return 2;
  }
  if (o.parts.find('a') != std::string::npos) bandwidth(o, comm);
  if (o.parts.find_first_of("bc") != std::string::npos) training(o, comm);
  return 0;
}
