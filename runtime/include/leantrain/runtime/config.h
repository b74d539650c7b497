#pragma once
// The run configuration: the TOML file plus --set overrides, parsed strictly (an unknown key
// or a wrong type is an error) and validated with messages that name the key and the fix.
// Torch-free on purpose: the CLI and the tests parse configs without LibTorch headers.
#include <cstdint>
#include <string>
#include <vector>

#include "leantrain/runtime/options.h"

namespace lt {

/// [model]: the registered model kind and that kind's options. Which keys a kind has, their
/// types, defaults and rules are the kind's own (lt::models::register_model; `leantrain
/// options` lists them): the parser keeps the keys as given, and
/// trainers::resolve_components checks them against the kind's table and fills the defaults.
struct ModelSection {
  std::string kind;  // empty: the default kind of the model registry
  Options options;
};

/// [data]: the registered data kind and its options (lt::data::register_data), plus the keys
/// every kind shares, which the trainer applies.
struct DataSection {
  std::string kind;   // empty: the default kind of the data registry
  uint64_t seed = 1234;  // initial weights, epoch shuffles, per-sample randomness
  int64_t limit = 0;     // train on only the first N training samples (0: all)
  Options options;
};

struct TrainConfig {
  int64_t global_batch = 128;
  int64_t micro_batch = 64;
  int64_t steps = 0;              // optimizer steps; 0 means run `epochs` epochs
  int64_t epochs = 1;
  std::string optimizer = "adamw";  // adamw | sgd
  double lr = 1e-3;
  double min_lr = 0.0;
  std::string schedule = "cosine";  // cosine | constant
  int64_t warmup_steps = 0;
  double weight_decay = 0.01;
  double momentum = 0.9;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 1.0;         // max global grad norm; 0 disables clipping
  int64_t eval_batch = 256;
  int64_t eval_max_batches = 0;   // 0: the whole eval set
  int64_t threads = 0;            // intra-op threads; 0 = cores / local ranks
  std::string device = "auto";    // auto | cpu | cuda
  // A non-finite loss in fp32/bf16 (fp16 leaves it to the loss scaler): stop the run, or
  // skip the update (at most nonfinite_max_skips steps in a row, then stop).
  // Opt-in linear learning-rate scaling: lr and min_lr are meant for a global batch of
  // lr_reference_batch; with "linear" they are multiplied by global_batch / lr_reference_batch.
  std::string lr_scaling = "none";  // none | linear
  int64_t lr_reference_batch = 0;
  std::string nonfinite = "stop";  // stop | skip
  int64_t nonfinite_max_skips = 10;
};

struct PrecisionConfig {
  std::string mode = "fp32";  // fp32 | bf16 | fp16
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  // The fused LM head's products under bf16: auto | autocast | fp32 (recompute/lm_loss.h,
  // HeadMatmul; auto: fp32 GEMMs on an x86 CPU without AMX-BF16, else bf16).
  std::string head_matmul = "auto";
  std::string conv_products = "auto";  // auto | autocast | fp32: ResNet's convolutions under bf16
};

struct MemoryConfig {
  // Activation recompute: none | full | every:K | selective | auto. Read from memory.recompute
  // or its deprecated alias (runtime/src/config.cpp); config.json writes it as recompute.
  std::string recompute = "none";
  std::string budget = "0";                    // bytes, e.g. "8GiB"; "0" = no budget
  // Model-state memory across ranks (ZeRO): none | optimizer (stage 1: optimizer state
  // sharded) | gradients (stage 2: gradients and optimizer state sharded).
  std::string shard = "none";
  // AdamW's moments: fp32 | int8 (block-wise dynamic 8-bit, bitsandbytes' 8-bit Adam).
  std::string optimizer_state = "fp32";
  // Under shard = gradients: the dtype of this rank's gradient sums (its chunk accumulators),
  // fp32 | bf16 (DeepSpeed's data_types.grad_accum_dtype). The reduce-scatter stays fp32.
  std::string grad_accum_dtype = "fp32";
};

struct CheckpointConfig {
  std::string dir;            // empty: <out>/checkpoints
  int64_t every_steps = 0;    // 0: only at the end
  int64_t keep_last = 3;
  bool async = true;          // copy the state, then write on a background thread
  bool at_end = true;         // false: none after the last step (a preemption still writes one)
};

struct CommConfig {
  std::string backend = "auto";  // auto | nccl | mpi | local
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool overlap = true;               // start bucket all-reduces inside the last backward
  double timeout_s = 300.0;          // deadline of a collective once training is under way
  double startup_timeout_s = 1800.0; // the generous one: setup, the first step, and the step
                                     // after an evaluation or a checkpoint
};

struct LogConfig {
  int64_t every_steps = 10;      // plain progress lines every N steps
  std::string progress = "auto"; // auto | bar | plain | none
  bool all_ranks = false;
};

struct Config {
  ModelSection model;
  DataSection data;
  TrainConfig train;
  PrecisionConfig precision;
  MemoryConfig memory;
  CheckpointConfig checkpoint;
  CommConfig comm;
  LogConfig log;
  // What parse_config noticed but accepted, one line each, naming the source (a deprecated
  // key spelling). For the caller to print; not a setting, so config_to_json leaves it out.
  std::vector<std::string> warnings;
};

/// Parses a TOML document, then applies `key=value` overrides (value in TOML syntax; a bare
/// word is taken as a string). Throws ConfigError naming the key on an unknown key, a wrong
/// type or a malformed file. [model] and [data] keys other than kind / seed / limit are kept
/// as given, for their kind to check (trainers::resolve_components). Does not check values:
/// call validate() for that. A deprecated spelling of a key is read as the key and adds a
/// line to Config::warnings.
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});
/// Reads `path` and parses it (see parse_config); a missing file is a ConfigError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// Checks the values of the keys this layer owns, and the parallel layout for `world_size`
/// ranks. Throws ConfigError with the key, the value and what is allowed. A key is checked in
/// exactly one place, by the component that uses it: [model] and [data] options by their
/// kind's table (trainers::resolve_components), memory.recompute by
/// models::RecomputePolicy::parse (both run up front by trainers::check_component_config),
/// comm.backend by comm::choose_backend.
void validate(const Config& cfg, int world_size);

/// Gradient-accumulation steps: global_batch / (micro_batch * world_size).
int64_t accumulation_steps(const TrainConfig& t, int world_size);

/// The config as JSON text (every key, defaults included), for metrics and checkpoints.
std::string config_to_json(const Config& cfg);

/// Parses a size such as "8GiB", "512MiB", "1.5GB" or "1000000" into bytes. Throws
/// std::invalid_argument on a malformed size.
int64_t parse_bytes(const std::string& text);

}  // namespace lt
