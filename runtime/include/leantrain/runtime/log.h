#pragma once
// Rank-aware logging (spdlog underneath, hidden here because LibTorch bundles another fmt).
// Info lines print on rank 0 only unless all_ranks; warnings and errors print on every rank.
// Every line carries the rank when the world has more than one.
#include <string>

namespace lt::log {

void init(int rank, int world_size, bool all_ranks);
void info(const std::string& msg);
void warn(const std::string& msg);
void error(const std::string& msg);

}  // namespace lt::log
