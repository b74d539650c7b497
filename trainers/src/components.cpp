#include "leantrain/trainers/components.h"

#include <torch/torch.h>

#include "leantrain/data/registry.h"
#include "leantrain/models/registry.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/runtime/options.h"

namespace lt::trainers {

Config resolve_components(const Config& cfg) {
  Config out = cfg;
  out.model = models::resolve_model(cfg.model);
  out.data = data::resolve_data(cfg.data);
  return out;
}

std::string registered_options_markdown() {
  std::string md;
  for (const auto& name : models::model_kind_names()) {
    const auto& k = models::model_kind(name);
    md += options_markdown("model", k.name, k.doc, k.options) + "\n";
  }
  for (const auto& name : data::data_kind_names()) {
    const auto& k = data::data_kind(name);
    md += options_markdown("data", k.name, k.doc, k.options) + "\n";
  }
  return md;
}

void check_component_config(const Config& cfg) {
  (void)resolve_components(cfg);
  models::RecomputePolicy::parse(cfg.memory.recompute);
}

Components make_components(const Config& cfg) {
  const Config c = resolve_components(cfg);
  models::RecomputePolicy::parse(c.memory.recompute);
  MemoryMeter::install_cpu_tracking();  // before the first parameter (Note [Memory breakdown])
  torch::manual_seed(static_cast<uint64_t>(c.data.seed));  // same initial weights on every rank
  auto data = data::make_datasets(c.data, models::model_contract(c.model));
  return Components{models::build_model(c.model), data.train, data.eval, "model " + c.model.kind};
}

}  // namespace lt::trainers
