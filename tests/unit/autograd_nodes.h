#pragma once
// Counting the nodes of an autograd graph by name: which custom Functions a forward recorded.
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

namespace lt_test {

/// Nodes reachable from out's grad_fn whose name contains `name`, each counted once.
inline int count_nodes(const torch::Tensor& out, const std::string& name) {
  std::vector<torch::autograd::Node*> todo{out.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int n = 0;
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find(name) != std::string::npos) ++n;
    for (const auto& e : node->next_edges()) todo.push_back(e.function.get());
  }
  return n;
}

}  // namespace lt_test
