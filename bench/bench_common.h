// What the C++ benchmarks share: their command line (`--key value` pairs and value-less
// `--flag`s), the CPU memory tracking they measure under, and GPT-2 small's shape.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <iostream>
#include <set>
#include <string>
#include <thread>

#include "leantrain/models/model_config.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/runtime/runtime_context.h"

namespace lt_bench {

/// Calls set(key, value) for each `--key value` (value "" for a key in `flags`). set returns
/// false for a key it does not know; a std::exception it throws (std::stoi's) means the value
/// is not a number. Returns -1 to go on, else the exit code: 0 after --help (usage printed),
/// 2 for an unknown option, a missing value or a bad number (the message names it).
inline int parse_args(int argc, char** argv, const char* usage, const std::set<std::string>& flags,
                      const std::function<bool(const std::string&, const std::string&)>& set) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::cout << usage;
      return 0;
    }
    const bool flag = flags.count(k) > 0;
    if (!flag && i + 1 == argc) {
      std::cerr << "option " << k << " needs a value (--help lists them)\n";
      return 2;
    }
    const std::string v = flag ? std::string() : argv[++i];
    try {
      if (!set(k, v)) {
        std::cerr << "unknown option " << k << " (--help lists them)\n";
        return 2;
      }
    } catch (const std::exception&) {
      std::cerr << k << " " << v << ": not a number\n";
      return 2;
    }
  }
  return -1;
}

/// Every core, freed memory kept for reuse (steady step times), and the tracking allocator
/// counting every CPU allocation (MemoryMeter): the setting the memory benchmarks measure in.
inline void measure_cpu_memory() {
  torch::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  lt::keep_freed_memory_for_reuse();
  lt::MemoryMeter::install_cpu_tracking();
}

/// GPT-2 small's shape (d 768, 12 heads, vocab 50257) with `layers` blocks at `seq` tokens.
inline lt::models::ModelConfig gpt2_shape(int layers, int seq, double dropout) {
  lt::models::ModelConfig g;
  g.kind = "gpt";
  g.vocab_size = 50257;
  g.seq_len = seq;
  g.n_layer = layers;
  g.n_head = 12;
  g.d_model = 768;
  g.dropout = dropout;
  return g;
}

}  // namespace lt_bench
