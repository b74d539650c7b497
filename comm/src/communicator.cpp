#include "leantrain/comm/communicator.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "leantrain/comm/mpi_communicator.h"
#include "leantrain/comm/nccl_communicator.h"
#include "leantrain/runtime/errors.h"

namespace lt::comm {

torch::Tensor shard_chunk(const torch::Tensor& t, int rank, int world) {
  if (world <= 0 || t.numel() % world != 0)
    throw std::invalid_argument("shard_chunk: " + std::to_string(t.numel()) + " elements do not split into " +
                                std::to_string(world) + " equal chunks (Note [Shard chunks])");
  const int64_t c = t.numel() / world;
  return t.reshape({-1}).narrow(0, rank * c, c);
}

std::unique_ptr<Work> Communicator::reduce_scatter_sum_async(torch::Tensor t) {
  (void)shard_chunk(t, rank(), size());  // the contract's check
  ++stats_.reduce_scatter_calls;
  stats_.reduce_scatter_bytes += static_cast<int64_t>(t.nbytes());
  allreduce_sum(t);
  return std::make_unique<CompletedWork>();
}

std::unique_ptr<Work> Communicator::allgather_async(torch::Tensor t) {
  auto mine = shard_chunk(t, rank(), size());
  ++stats_.allgather_calls;
  stats_.allgather_bytes += static_cast<int64_t>(t.nbytes());
  const auto parts = allgather(mine.clone());
  for (int r = 0; r < size(); ++r)
    if (r != rank()) shard_chunk(t, r, size()).copy_(parts[static_cast<size_t>(r)]);
  return std::make_unique<CompletedWork>();
}

std::string choose_backend(const std::string& backend, int world, bool on_cuda, bool nccl_available) {
  if (backend == "local") {
    if (world != 1)
      throw ConfigError("comm.backend = 'local' cannot serve a world of " + std::to_string(world) +
                        " ranks; use 'auto' (or 'nccl' on GPUs, 'mpi' on CPUs)");
    return "local";
  }
  if (backend == "nccl") {
    if (!nccl_available)
      throw ConfigError("comm.backend = 'nccl': this leantrain was built without NCCL (no CUDA toolkit at build "
                        "time); use comm.backend = 'auto' or 'mpi', or rebuild with the CUDA toolkit and NCCL");
    if (!on_cuda)
      throw ConfigError("comm.backend = 'nccl' needs the run on a GPU, but the device is the CPU; set "
                        "train.device = cuda on a machine with GPUs, or use comm.backend = 'auto' or 'mpi'");
    return "nccl";
  }
  if (backend == "mpi") return "mpi";
  if (backend == "auto") {
    if (world == 1) return "local";
    return on_cuda && nccl_available ? "nccl" : "mpi";
  }
  throw ConfigError("comm.backend = '" + backend + "' is not one of auto, nccl, mpi, local");
}

// Note [Backend agreement]: comm.backend = auto resolves on each rank from its own device
// (choose_backend), and a rank that chose MPI next to ranks that chose NCCL would wait in a
// collective the others never start: a hang. So in a world of several the ranks exchange their
// choices over MPI before any NCCL exists (the bootstrap MpiCommunicator, which is the MPI
// backend itself when they agree on it), and agree_backend either returns the one they share
// or throws the same ConfigError on every rank, naming the ranks that differ. A refusal that
// depends on the rank's device (comm.backend = nccl on a rank without a GPU) is exchanged too,
// so every rank stops with it; one that does not (a bad name, local, NCCL not built) is the
// same on every rank and thrown at once, before MPI.

namespace {

constexpr char kSep = '\x1f';  // between the fields of an encoded BackendChoice

std::string where(const BackendChoice& c) {
  return "rank " + std::to_string(c.rank) + (c.host.empty() ? "" : " on host " + c.host) + " (" +
         (c.device_index >= 0 ? "cuda:" + std::to_string(c.device_index) : std::string("the CPU")) + ")";
}

std::string encode(const BackendChoice& c) {
  return std::to_string(c.rank) + kSep + c.host + kSep + std::to_string(c.device_index) + kSep + c.backend + kSep +
         c.error;
}

BackendChoice decode(const std::string& text, int rank) {
  std::vector<std::string> f;
  size_t start = 0;
  for (size_t k = 0; k <= text.size(); ++k)
    if (k == text.size() || text[k] == kSep) {
      f.push_back(text.substr(start, k - start));
      start = k + 1;
    }
  if (f.size() != 5) throw std::runtime_error("backend agreement: rank " + std::to_string(rank) + " sent a malformed choice");
  BackendChoice c;
  c.rank = rank;
  c.host = f[1];
  c.device_index = std::stoi(f[2]);
  c.backend = f[3];
  c.error = f[4];
  return c;
}

// Ranks listed in a message: the first few, then how many more.
constexpr size_t kNamedRanks = 4;

void check_world(const Communicator& comm, const RuntimeContext& ctx) {
  if (comm.size() != ctx.world.size || comm.rank() != ctx.world.rank)
    throw ConfigError("the launcher's environment says rank " + std::to_string(ctx.world.rank) + " of " +
                      std::to_string(ctx.world.size) + " but MPI says rank " + std::to_string(comm.rank()) + " of " +
                      std::to_string(comm.size()) + " (start ranks with mpirun or srun --mpi=pmix)");
}

}  // namespace

std::string agree_backend(const std::vector<BackendChoice>& per_rank, const std::string& requested) {
  if (per_rank.empty()) throw std::invalid_argument("agree_backend: no ranks");
  std::vector<const BackendChoice*> refused, differ;
  for (const auto& c : per_rank)
    if (!c.error.empty()) refused.push_back(&c);
  if (!refused.empty()) {
    std::string m = where(*refused.front()) + ": " + refused.front()->error;
    if (refused.size() > 1) {
      m += refused.size() > 2 ? " (so did ranks" : " (so did rank";
      for (size_t k = 1; k < refused.size() && k <= kNamedRanks; ++k)
        m += (k == 1 ? " " : ", ") + std::to_string(refused[k]->rank);
      if (refused.size() > kNamedRanks + 1) m += " and " + std::to_string(refused.size() - kNamedRanks - 1) + " more";
      m += ")";
    }
    throw ConfigError(m);
  }
  const BackendChoice& first = per_rank.front();
  for (const auto& c : per_rank)
    if (c.backend != first.backend) differ.push_back(&c);
  if (differ.empty()) return first.backend;
  std::string m = "comm.backend = '" + requested + "' resolves differently across the ranks: " + where(first) +
                  " chose " + first.backend + ", but ";
  for (size_t k = 0; k < differ.size() && k < kNamedRanks; ++k)
    m += (k == 0 ? "" : ", ") + where(*differ[k]) + " chose " + differ[k]->backend;
  if (differ.size() > kNamedRanks) m += " and " + std::to_string(differ.size() - kNamedRanks) + " more ranks differ";
  m += "; every rank must run the same backend: give every rank a GPU (CUDA_VISIBLE_DEVICES, the driver), "
       "or set train.device = cpu, or comm.backend = 'mpi'";
  throw ConfigError(m);
}

std::vector<BackendChoice> exchange_backend_choices(Communicator& comm, const BackendChoice& mine) {
  const std::string text = encode(mine);
  const auto lengths = comm.allgather(torch::full({1}, static_cast<int64_t>(text.size()), torch::kLong));
  int64_t longest = 1;
  for (const auto& l : lengths) longest = std::max(longest, l.item<int64_t>());
  auto bytes = torch::zeros({longest}, torch::kByte);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  const auto all = comm.allgather(bytes);
  std::vector<BackendChoice> out;
  for (size_t r = 0; r < all.size(); ++r) {
    const auto b = all[r].contiguous();
    const int64_t n = std::min(lengths[r].item<int64_t>(), b.numel());
    out.push_back(decode(std::string(static_cast<const char*>(b.data_ptr()), static_cast<size_t>(n)), static_cast<int>(r)));
  }
  return out;
}

std::unique_ptr<Communicator> make_communicator(const CommConfig& cfg, const RuntimeContext& ctx) {
  const int world = ctx.world.size;
  // Setup (bootstrap, the first broadcasts) runs under the generous deadline; the trainer
  // tightens it per step (Note [Deadlines] in trainers/src/trainer.cpp).
  if (world == 1) {
    const std::string backend = choose_backend(cfg.backend, world, ctx.on_cuda(), nccl_built());
    if (backend == "local") return std::make_unique<LocalCommunicator>();
    std::unique_ptr<Communicator> comm;
    if (backend == "nccl")
      comm = std::make_unique<NcclCommunicator>(cfg.startup_timeout_s, ctx.world.host, ctx.device_index);
    else
      comm = std::make_unique<MpiCommunicator>(cfg.startup_timeout_s, ctx.world.host);
    check_world(*comm, ctx);
    return comm;
  }
  // Note [Backend agreement].
  (void)choose_backend(cfg.backend, world, /*on_cuda=*/true, nccl_built());  // the refusals every rank makes
  BackendChoice mine;
  mine.rank = ctx.world.rank;
  mine.host = ctx.world.host;
  mine.device_index = ctx.device_index;
  try {
    mine.backend = choose_backend(cfg.backend, world, ctx.on_cuda(), nccl_built());
  } catch (const ConfigError& e) {
    mine.error = e.what();
  }
  auto mpi = std::make_unique<MpiCommunicator>(cfg.startup_timeout_s, ctx.world.host);
  check_world(*mpi, ctx);
  const std::string backend = agree_backend(exchange_backend_choices(*mpi, mine), cfg.backend);
  if (backend != "nccl") return mpi;
  // MPI stays up for the NCCL backend's own MPI communicator when `mpi` goes.
  auto nccl = std::make_unique<NcclCommunicator>(cfg.startup_timeout_s, ctx.world.host, ctx.device_index);
  check_world(*nccl, ctx);
  return nccl;
}

}  // namespace lt::comm
