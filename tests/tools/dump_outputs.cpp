// Test helper: the C++ model's eval-mode output on a deterministic input, for the Python
// reference model to reproduce (tools/leantrain_py/check_outputs.py).
//
//   leantrain_dump_outputs CKPT.h5 IO.h5 [--batch N] [--seed S]
//   leantrain_dump_outputs --model JSON --init-from PATH [--init-skip-mismatched] IO.h5
//                          [--batch N] [--seed S] [--save-checkpoint CKPT.h5]
//
// The second form builds the model of a [model] section given as JSON (as a checkpoint's
// model_config, e.g. {"kind": "gpt", "n_layer": 2}; the options a Hugging Face directory's
// config.json determines may be left out, as in a training config) and loads it as
// `train --init-from` does
// (trainers/pretrained.h: a checkpoint, a safetensors file or a Hugging Face directory);
// --save-checkpoint also writes those weights as a leantrain checkpoint at step 0 (for
// `leantrain export`). tests/python/test_interop.py compares its outputs with transformers'
// and torchvision's.
//
// Reads and verifies CKPT.h5, rebuilds the model from its model_config JSON (the `model`
// section of the run's config) through the config parser and build_model(), loads the
// weights after check_model(), and runs it in eval mode, fp32, under no_grad, on one thread
// (as the Python side runs). The input is drawn from torch::manual_seed(S): token ids
// uniform in [0, vocab_size) of shape [N, seq_len] for gpt/bert, standard-normal images
// [N, in_channels, image_size, image_size] for resnet/mlp. IO.h5 gets datasets `input` and
// `output` (the logits), each with its crc32 attribute. Exit codes: 0 written, 2 bad usage or
// an unreadable / mismatching checkpoint, 1 anything else.
#include <torch/torch.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/trainers/checkpointing.h"
#include "leantrain/trainers/pretrained.h"

namespace {

/// The [model] section a checkpoint was trained with. Each key of its model_config JSON becomes
/// a `model.<key>=<value>` override (JSON scalars, strings and arrays are TOML values too),
/// so the config parser and the kind's table check keys and types, and keys missing from an
/// older file take the kind's defaults.
lt::ModelSection model_config_of(const lt::checkpoint_io::Checkpoint& c, const std::string& path,
                                 const std::string& init_from = "") {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(c.model_config);
  } catch (const nlohmann::json::exception& e) {
    throw lt::checkpoint_io::CheckpointError(path + ": attribute model_config is not JSON (" + e.what() + ")");
  }
  if (!j.is_object())
    throw lt::checkpoint_io::CheckpointError(path + ": attribute model_config is not a JSON object");
  std::vector<std::string> sets;
  for (const auto& [key, value] : j.items()) sets.push_back("model." + key + "=" + value.dump());
  auto section = lt::parse_config("", path + " (model_config)", sets).model;
  std::vector<std::string> notes;
  section = lt::trainers::model_section_for_init(section, init_from, &notes);
  for (const auto& n : notes) std::cout << "  note: " << n << "\n";
  return lt::models::resolve_model(section);
}

/// A [model] section from JSON text given on the command line, completed from `init_from`'s
/// config.json as `train --init-from` completes it (trainers::model_section_for_init).
lt::ModelSection model_section_of_json(const std::string& text, const std::string& init_from) {
  lt::checkpoint_io::Checkpoint c;
  c.model_config = text;
  return model_config_of(c, "--model", init_from);
}

/// The model's tensors as a step-0 checkpoint whose model_config is `section`.
void save_checkpoint(const std::string& path, const lt::ModelSection& section, torch::nn::Module& model) {
  lt::Config cfg;
  cfg.model = section;
  const auto j = nlohmann::json::parse(lt::config_to_json(cfg));
  lt::checkpoint_io::Checkpoint c;
  c.config = j.dump();
  c.model_config = j.at("model").dump();
  c.train_config = j.at("train").dump();
  for (auto& nt : lt::trainers::model_tensors(model)) c.model.push_back({nt.name, nt.tensor.detach().contiguous()});
  lt::checkpoint_io::write_checkpoint(path, c);
}

torch::Tensor deterministic_input(const lt::InputContract& m, int64_t batch, uint64_t seed) {
  torch::manual_seed(seed);
  if (m.input == lt::InputContract::Input::kTokens)
    return torch::randint(0, m.vocab_size, {batch, m.seq_len}, torch::kLong);
  return torch::randn({batch, m.channels, m.height, m.width});
}

int usage(const std::string& why) {
  std::cerr << "leantrain_dump_outputs: " << why << "\nusage: leantrain_dump_outputs CKPT.h5 IO.h5 [--batch N] [--seed S]\n"
               "       leantrain_dump_outputs --model JSON --init-from PATH [--init-skip-mismatched] IO.h5 [--batch N] "
               "[--seed S] [--save-checkpoint CKPT.h5]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  std::string model_json, init_from, save_path;
  bool skip_mismatched = false;
  int64_t batch = 4;
  uint64_t seed = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--init-skip-mismatched") {
      skip_mismatched = true;
      continue;
    }
    if (k.rfind("--", 0) != 0) {
      positional.push_back(k);
      continue;
    }
    if (i + 1 >= argc) return usage(k + " needs a value");
    const std::string v = argv[++i];
    try {
      if (k == "--batch") batch = std::stoll(v);
      else if (k == "--seed") seed = std::stoull(v);
      else if (k == "--model") model_json = v;
      else if (k == "--init-from") init_from = v;
      else if (k == "--save-checkpoint") save_path = v;
      else return usage("unknown option " + k);
    } catch (const std::exception&) {
      return usage(k + " " + v + ": not a number");
    }
  }
  const bool from_model = !model_json.empty();
  if (from_model != !init_from.empty()) return usage("--model and --init-from go together");
  if (positional.size() != (from_model ? 1u : 2u))
    return usage(from_model ? "needs an output file" : "needs a checkpoint and an output file");
  const std::string ckpt_path = from_model ? init_from : positional[0], io_path = positional.back();
  if (batch <= 0) return usage("--batch must be positive");
  try {
    torch::set_num_threads(1);
    lt::ModelSection mcfg;
    std::shared_ptr<lt::models::Model> model;
    int64_t step = 0;
    if (from_model) {
      mcfg = model_section_of_json(model_json, init_from);
      model = lt::models::build_model(mcfg);
      const auto r = lt::trainers::init_model(init_from, mcfg, *model, skip_mismatched);
      std::cout << "loaded " << r.loaded << " tensors from " << init_from << " (" << r.description << ")\n";
      for (const auto& n : r.notes) std::cout << "  note: " << n << "\n";
      for (const auto& n : r.skipped) std::cout << "  skipped: " << n << "\n";
      if (!save_path.empty()) save_checkpoint(save_path, mcfg, *model);
    } else {
      const auto c = lt::checkpoint_io::read_checkpoint(ckpt_path);
      mcfg = model_config_of(c, ckpt_path);
      model = lt::models::build_model(mcfg);
      auto expected = lt::trainers::model_tensors(*model);
      lt::checkpoint_io::check_model(c, expected, ckpt_path);
      std::map<std::string, const torch::Tensor*> saved;
      for (const auto& nt : c.model) saved[nt.name] = &nt.tensor;
      torch::NoGradGuard no_grad;
      for (auto& nt : expected) nt.tensor.copy_(*saved.at(nt.name));
      step = c.step;
    }
    torch::NoGradGuard no_grad;
    model->eval();
    const auto input = deterministic_input(lt::models::model_contract(mcfg), batch, seed);
    const auto output = model->forward(input).to(torch::kFloat).contiguous();
    lt::checkpoint_io::write_tensor_file(io_path, {{"input", input}, {"output", output}});
    std::cout << ckpt_path << " (" << mcfg.kind << ", step " << step << "): input " << input.sizes() << " -> output "
              << output.sizes() << " in " << io_path << "\n";
    return 0;
  } catch (const lt::ConfigError& e) {
    std::cerr << "leantrain_dump_outputs: config error: " << e.what() << "\n";
    return 2;
  } catch (const lt::checkpoint_io::CheckpointError& e) {
    std::cerr << "leantrain_dump_outputs: checkpoint error: " << e.what() << "\n";
    return 2;
  } catch (const lt::DataError& e) {
    std::cerr << "leantrain_dump_outputs: data error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "leantrain_dump_outputs: " << e.what() << "\n";
    return 1;
  }
}
