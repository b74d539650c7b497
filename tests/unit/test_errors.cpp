// The one table of errors -> exit codes (runtime/src/errors.cpp, docs/ERRORS.md): every
// exception type held to its code, label and rank rule, as a library caller reads it
// (lt::classify_error), as a program of one's own reports it (lt::cli::handle_current_exception,
// with the one-rank rule against a communicator of two), and as the command line exits with it
// (lt::cli::main, in-process). And the setup agreement (comm::agree_on_setup) on a world of two.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "expect_error.h"
#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/cli/cli.h"
#include "leantrain/comm/agreement.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/report/report.h"
#include "leantrain/runtime/errors.h"

namespace {

struct Row {
  std::string type;
  std::function<void()> raise;
  const char* label;
  int code;
  bool every_rank;
};

// Every exception type a leantrain program can end with, and what the table says of it.
std::vector<Row> table() {
  return {
      {"ConfigError", [] { throw lt::ConfigError("c"); }, "config error", 2, true},
      {"CheckpointError", [] { throw lt::checkpoint_io::CheckpointError("c"); }, "checkpoint error", 2, true},
      {"DataError", [] { throw lt::DataError("d"); }, "data error", 2, true},
      {"ReportError", [] { throw lt::report::ReportError("r"); }, "report", 2, true},
      {"StorageError", [] { throw lt::StorageError("s"); }, "storage error", 4, false},
      {"TrainingStopped", [] { throw lt::TrainingStopped("t"); }, "training stopped", 1, true},
      {"PeerFailed(2)", [] { throw lt::PeerFailed("p", 2); }, "stopped", 2, true},
      {"PeerFailed(4)", [] { throw lt::PeerFailed("p", 4); }, "stopped", 4, true},
      {"c10::Error", [] { TORCH_CHECK(false, "shapes differ"); }, "error", 1, false},
      {"std::runtime_error", [] { throw std::runtime_error("x"); }, "error", 1, false},
      {"int", [] { throw 7; }, "error", 1, false},
  };
}

std::exception_ptr raised(const Row& r) {
  try {
    r.raise();
  } catch (...) {
    return std::current_exception();
  }
  ADD_FAILURE() << r.type << " raised nothing";
  return nullptr;
}

// Two ranks that record what the error handling asks of them; allgather returns `codes`.
class TwoRanks final : public lt::comm::Communicator {
 public:
  explicit TwoRanks(int rank, std::vector<int64_t> codes = {0, 0}) : rank_(rank), codes_(std::move(codes)) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  std::string backend() const override { return "fake"; }
  void allreduce_sum(torch::Tensor&) override {}
  void broadcast(torch::Tensor&, int) override {}
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override {
    sent.push_back(t.item<int64_t>());
    std::vector<torch::Tensor> all;
    for (size_t r = 0; r < codes_.size(); ++r)
      all.push_back(static_cast<int>(r) == rank_ ? t.clone() : torch::full({1}, codes_[r], torch::kLong));
    return all;
  }
  void barrier() override {}
  void abort(int code) override { aborted.push_back(code); }

  std::vector<int> aborted;
  std::vector<int64_t> sent;

 private:
  int rank_;
  std::vector<int64_t> codes_;
};

TEST(ErrorTable, EveryTypeHasItsCodeLabelAndRankRule) {
  for (const auto& r : table()) {
    const auto c = lt::classify_error(raised(r));
    EXPECT_EQ(c.exit_code, r.code) << r.type;
    EXPECT_STREQ(c.label, r.label) << r.type;
    EXPECT_EQ(c.every_rank, r.every_rank) << r.type;
  }
  EXPECT_THROW(lt::classify_error(nullptr), std::logic_error);
}

TEST(ErrorTable, MessagesLeaveLibTorchsBacktraceOut) {
  const auto rows = table();
  const auto c10 = std::find_if(rows.begin(), rows.end(), [](const Row& r) { return r.type == "c10::Error"; });
  const std::string m = lt::error_message(raised(*c10));
  EXPECT_CONTAINS(m, "shapes differ");
  EXPECT_EQ(m.find("Exception raised from"), std::string::npos) << m;
  EXPECT_EQ(lt::error_message(raised(rows.back())), "an exception of an unknown type");
}

// A program of one's own reports through handle_current_exception: the same code, one line
// led by the table's label; alone (no communicator) or on a world of two, where an error of
// this rank alone ends the job with its code and an error every rank reached does not.
TEST(ErrorTable, ALibraryCallerGetsTheSameCodeAndTheOneRankRule) {
  for (const auto& r : table()) {
    for (bool two : {false, true}) {
      TwoRanks comm(1);
      int code = -1;
      testing::internal::CaptureStderr();
      try {
        r.raise();
      } catch (...) {
        code = lt::cli::handle_current_exception("myprog", two ? &comm : nullptr);
      }
      const std::string err = testing::internal::GetCapturedStderr();
      EXPECT_EQ(code, r.code) << r.type;
      const std::string lead = std::string("myprog: ") + (two && !r.every_rank ? "rank 1 on " : "") +
                               (two && !r.every_rank ? "" : std::string(r.label) + ": ");
      EXPECT_EQ(err.rfind(lead, 0), 0u) << r.type << ": " << err;
      EXPECT_CONTAINS(err, std::string(r.label) + ": ");
      EXPECT_EQ(comm.aborted, two && !r.every_rank ? std::vector<int>{r.code} : std::vector<int>{}) << r.type;
    }
  }
}

int cli(std::vector<std::string> args, std::string* err = nullptr) {
  args.insert(args.begin(), "leantrain");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  const int code = lt::cli::main(static_cast<int>(argv.size()), argv.data());
  const std::string e = testing::internal::GetCapturedStderr();
  (void)testing::internal::GetCapturedStdout();
  if (err) *err = e;
  return code;
}

// The command line, in-process: each error reaches the exit code of its row.
TEST(ErrorTable, TheCommandLineExitsWithTheTablesCodes) {
  std::string err;
  EXPECT_EQ(cli({"train"}, &err), 2) << err;  // CLI11: --config is required
  EXPECT_EQ(cli({"train", "--config", "/nonexistent/x.toml"}, &err), 2);
  EXPECT_CONTAINS(err, "leantrain: config error: ");
  const std::string junk = testing::TempDir() + "/junk.h5";
  std::ofstream(junk) << "not an HDF5 file";
  EXPECT_EQ(cli({"inspect", junk}, &err), 2);
  EXPECT_CONTAINS(err, "leantrain: checkpoint error: ");
  EXPECT_EQ(cli({"report", testing::TempDir() + "/no-such-run"}, &err), 2);
  EXPECT_CONTAINS(err, "leantrain: report: ");
  EXPECT_EQ(cli({"report"}, &err), 2);  // neither a run folder nor --bench
  EXPECT_CONTAINS(err, "leantrain: config error: report takes a run folder");
  EXPECT_EQ(cli({"--version"}), 0);
  EXPECT_EQ(cli({}), 2);  // no subcommand: the help, exit 2
}

// Note [Setup agreement]: each rank sends its code; a failed rank rethrows its own error, the
// others throw PeerFailed with the lowest failing rank's code; nobody aborts.
TEST(SetupAgreement, EveryRankLearnsWhoFailedAndExitsWithItsCode) {
  const torch::Device cpu(torch::kCPU);
  {
    TwoRanks ok(0);
    lt::comm::agree_on_setup(ok, nullptr, cpu);
    EXPECT_EQ(ok.sent, std::vector<int64_t>{0});
  }
  {
    TwoRanks rank0(0, {0, 2});  // rank 1 failed with a data error
    try {
      lt::comm::agree_on_setup(rank0, nullptr, cpu);
      ADD_FAILURE() << "rank 0 went on";
    } catch (const lt::PeerFailed& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_CONTAINS(e.what(), "rank 1 failed while setting up (exit 2");
    }
    EXPECT_TRUE(rank0.aborted.empty());
  }
  {
    TwoRanks rank1(1, {0, 0});
    std::exception_ptr mine;
    try {
      throw lt::DataError("data file 'x' does not exist");
    } catch (...) {
      mine = std::current_exception();
    }
    EXPECT_THROW(lt::comm::agree_on_setup(rank1, mine, cpu), lt::DataError);
    EXPECT_EQ(rank1.sent, std::vector<int64_t>{2});
  }
  {
    TwoRanks rank0(0, {0, 4});
    const int v = [&] {
      try {
        return lt::comm::agreed_setup(rank0, cpu, [] { return 5; });
      } catch (const lt::PeerFailed& e) {
        return -e.exit_code();
      }
    }();
    EXPECT_EQ(v, -4);
    TwoRanks fine(0);
    EXPECT_EQ(lt::comm::agreed_setup(fine, cpu, [] { return 5; }), 5);
  }
}

}  // namespace
