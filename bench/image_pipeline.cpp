// Benchmark: leantrain's image pipeline (the image_folder kind: libjpeg-turbo / libpng decode,
// RandomResizedCrop + flip + normalise, `workers` decode threads per batch) in images/s.
//
//   build/bin/leantrain_bench_image FOLDER [--workers N] [--size S] [--batch B] [--epochs E]
//                                   [--prefetch]
//
// Runs one untimed warm-up epoch (page cache, allocator), then E timed epochs of batches of B
// samples in the epoch's permutation, as the trainer asks for them; with --prefetch the next
// batch is built on the lt::data::Prefetcher's thread while the current one is "consumed"
// (here: nothing, so it measures the pipeline's throughput with one batch in flight). Prints
// one JSON line: {"pipeline": "leantrain", "images_per_s": ..., ...}. bench/image_pipeline.py
// runs it against torchvision's ImageFolder + DataLoader with the same workers and transforms
// and prints the ratio.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "leantrain/data/image_folder.h"
#include "leantrain/data/prefetch.h"
#include "leantrain/data/sampling.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FOLDER [--workers N] [--size S] [--batch B] [--epochs E] [--prefetch]\n", argv[0]);
    return 2;
  }
  lt::data::ImageFolderConfig cfg;
  cfg.train = argv[1];
  int64_t size = 224, batch = 32, epochs = 2;
  bool prefetch = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : 0LL; };
    if (a == "--workers") cfg.workers = next();
    else if (a == "--size") size = next();
    else if (a == "--batch") batch = next();
    else if (a == "--epochs") epochs = next();
    else if (a == "--prefetch") prefetch = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    const auto index = lt::data::scan_image_folder(cfg.train, "FOLDER");
    lt::InputContract m;
    m.channels = 3;
    m.height = m.width = size;
    m.num_classes = static_cast<int64_t>(index.classes.size());
    std::shared_ptr<const lt::data::Dataset> data = lt::data::make_image_folder(cfg, m).train;
    const int64_t n = data->size();
    auto batches_of = [&](int64_t epoch) {
      const auto perm = lt::data::epoch_permutation(n, cfg.seed, epoch);
      std::vector<std::vector<int64_t>> out;
      for (int64_t b = 0; b < n; b += batch)
        out.emplace_back(perm.begin() + b, perm.begin() + std::min(n, b + batch));
      return out;
    };
    double checksum = 0;
    auto run_epoch = [&](int64_t epoch) {
      const auto bs = batches_of(epoch);
      if (!prefetch) {
        for (const auto& b : bs) checksum += data->get(b, epoch).input[0][0][0][0].item<double>();
        return;
      }
      lt::data::Prefetcher pf(data);
      pf.want(bs[0], epoch);
      for (size_t j = 0; j < bs.size(); ++j) {
        if (j + 1 < bs.size()) pf.want(bs[j + 1], epoch);
        checksum += pf.take(bs[j], epoch).input[0][0][0][0].item<double>();
      }
    };
    run_epoch(0);  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t e = 1; e <= epochs; ++e) run_epoch(e);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("{\"pipeline\": \"leantrain\", \"images_per_s\": %.2f, \"images\": %lld, \"seconds\": %.4f, "
                "\"workers\": %lld, \"batch\": %lld, \"size\": %lld, \"prefetch\": %s, \"checksum\": %.6f}\n",
                static_cast<double>(n * epochs) / s, static_cast<long long>(n * epochs), s,
                static_cast<long long>(cfg.workers), static_cast<long long>(batch), static_cast<long long>(size),
                prefetch ? "true" : "false", checksum);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
