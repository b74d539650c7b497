#pragma once
// What a Trainer trains, from the registries (models/registry.h, data/registry.h): a config's
// [model] and [data] resolved against their kinds' option tables, and the model and datasets
// built from them. trainer.h includes it; its functions are those of lt::trainers.
#include <memory>
#include <string>

#include "leantrain/data/dataset.h"
#include "leantrain/models/model.h"
#include "leantrain/runtime/config.h"

namespace lt::trainers {

/// What a Trainer trains: a model and its data. `eval` may be null (no evaluation).
struct Components {
  std::shared_ptr<models::Model> model;
  std::shared_ptr<data::Dataset> train;
  std::shared_ptr<data::Dataset> eval;
  std::string name = "model";  // the model's name in the run log
};

/// The config with [model] and [data] resolved through the registries (models/registry.h,
/// data/registry.h): each kind named (the registry's default for an empty kind) and its
/// options checked against the kind's table, defaults filled in. ConfigError naming the key.
/// The CLI resolves before it writes config.json, so the file records every option.
Config resolve_components(const Config& cfg);

/// Every registered model kind's and data kind's options as Markdown sections
/// (lt::options_markdown), model kinds first, each in registration order: what
/// `leantrain options` prints and docs/CONFIG.md holds for the built-in kinds.
std::string registered_options_markdown();

/// The checks of the config keys the components own (resolve_components,
/// models::RecomputePolicy::parse), without building anything: a bad value fails before any
/// data is read. ConfigError naming the key.
void check_component_config(const Config& cfg);

/// The registered model and datasets a config names, the data built to the model's input
/// contract, seeded with data.seed (so every rank builds the same initial weights). Components of your own: build them after
/// make_runtime_context(), which installs the CPU memory tracker; tensors allocated before it
/// are not counted in peaks and budgets.
Components make_components(const Config& cfg);

}  // namespace lt::trainers
