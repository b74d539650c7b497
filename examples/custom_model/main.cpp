// A user's training program: their model (tiny_vit.h) and dataset (bars_dataset.h), registered
// by name beside leantrain's built-in kinds, then leantrain's whole command line. So
//
//   mpirun -np 2 custom_model train --config vit.toml --out runs/vit [--resume auto] [--set model.depth=6]
//   custom_model plan --config vit.toml --memory-budget 300MiB
//   custom_model options | inspect CKPT | export CKPT --format safetensors --out DIR | report runs/vit
//
// all work as they do for `leantrain`, with [model] kind = "tiny_vit" and [data] kind = "bars"
// in the config (vit.toml), and leantrain's exit codes (docs/ERRORS.md).
#include "bars_dataset.h"
#include "leantrain/cli/cli.h"
#include "tiny_vit.h"

int main(int argc, char** argv) {
  lt::models::register_model(example::tiny_vit_kind());
  lt::data::register_data(example::bars_kind());
  return lt::cli::main(argc, argv);
}
