#pragma once
// The built-in kinds' imports and exports of other libraries' weights (foreign_weights.cpp),
// bound to their registry entries in registry.cpp. Private to models/.
#include "leantrain/models/foreign_weights.h"
#include "leantrain/models/model_config.h"

namespace lt::models {

ImportedWeights import_gpt2(const ModelConfig& cfg, const ForeignWeights& w);
ExportedWeights export_gpt2(const ModelConfig& cfg, const NamedTensors& tensors);
ImportedWeights import_bert(const ModelConfig& cfg, const ForeignWeights& w);
ExportedWeights export_bert(const ModelConfig& cfg, const NamedTensors& tensors);
ImportedWeights import_torchvision_resnet(const ModelConfig& cfg, const ForeignWeights& w);
ExportedWeights export_torchvision_resnet(const ModelConfig& cfg, const NamedTensors& tensors);

}  // namespace lt::models
