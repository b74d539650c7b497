// What the models recompute: CheapRegion and Model::apply_recompute, over the recompute
// layer's in_backward() (recompute/recompute.h).
#include <torch/torch.h>

#include "leantrain/models/model.h"
#include "leantrain/recompute/recompute.h"

namespace lt::models {

torch::Tensor CheapRegion::run(const RecomputeFn& fn, const std::vector<torch::Tensor>& inputs,
                               const std::vector<torch::Tensor>& params) const {
  return *on_ ? recompute::in_backward(fn, inputs, params) : fn(inputs);
}

void Model::apply_recompute(const RecomputePolicy& policy) {
  using Kind = RecomputePolicy::Kind;
  const bool whole_blocks = policy.kind == Kind::kFull || policy.kind == Kind::kEvery;
  set_loss_chunk_tokens(whole_blocks ? -1 : 0);
  for (auto& [name, region] : cheap_regions_) region.set_recompute(policy.kind == Kind::kSelective);
  if (!whole_blocks) {
    set_block_runner({});
    return;
  }
  set_block_runner([policy, count = blocks().size()](size_t i, BlockImpl& block, const torch::Tensor& x) {
    if (!policy.recomputes_block(i, count) || !block.is_training()) return block.forward(x);
    std::vector<torch::Tensor> params = block.parameters();
    return recompute::in_backward([&block](const std::vector<torch::Tensor>& in) { return block.forward(in[0]); }, {x},
                               params, {&block},
                               [&block](const std::vector<torch::Tensor>& in) { return block.forward_for_gradients(in[0]); });
  });
}

void apply_recompute_policy(Model& model, const RecomputePolicy& policy) { model.apply_recompute(policy); }

}  // namespace lt::models
