#pragma once
// Shared by the end-to-end tests: run the real binary (or mpirun), capture exit code and
// output, read metrics.jsonl, compare checkpoints. Torch-free: processes and files only.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

struct Result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lt_cli_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "." +
            std::to_string(::getpid()));  // two builds' suites may run at once
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  Result run(const std::string& args) { return run_cmd(std::string(LEANTRAIN_BINARY) + " " + args); }

  Result run_cmd(const std::string& command) {
    const auto out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd = command + " >" + out.string() + " 2>" + err.string() + " </dev/null";
    const int status = std::system(cmd.c_str());
    Result r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  std::string demo() const { return std::string(LEANTRAIN_SOURCE_DIR) + "/configs/demo.toml"; }

  // A config error: exit code 2 and exactly one line on stderr that contains `needle`.
  void expect_config_error(const std::string& args, const std::string& needle) {
    auto r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
  }

  // mpirun with what these 2-core machines need (see cluster/mpirun.sh).
  static std::string mpirun(int np) {
    return std::string(LEANTRAIN_MPIEXEC) + " -n " + std::to_string(np) +
           " --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1 " +
           "-x MALLOC_MMAP_THRESHOLD_=4294967295 ";
  }

  // A 2-layer GPT on synthetic tokens: seconds per run, every code path of a transformer.
  std::string tiny_gpt_config(double dropout, int steps, const std::string& extra = "") {
    const auto path = dir_ / ("tiny_" + std::to_string(steps) + ".toml");
    std::ofstream(path) << "[model]\nkind = \"gpt\"\nvocab_size = 64\nseq_len = 32\nn_layer = 2\n"
                           "n_head = 2\nd_model = 32\ndropout = " << dropout << "\n"
                        << "[data]\nkind = \"synthetic\"\nsynthetic_samples = 512\n"
                        << "[train]\nglobal_batch = 16\nmicro_batch = 8\nsteps = " << steps << "\nlr = 3e-3\nwarmup_steps = 2\n"
                        << "eval_max_batches = 2\neval_batch = 32\nthreads = 1\n"
                        << "[log]\nprogress = \"none\"\n" << extra;
    return path.string();
  }

  // tests/scripts/compare_checkpoints.py through the project's virtualenv (h5py).
  Result compare_checkpoints(const std::string& a, const std::string& b, double rtol,
                             const std::string& groups = "model") {
    return run_cmd(std::string(LEANTRAIN_SOURCE_DIR) + "/.venv/bin/python " + LEANTRAIN_SOURCE_DIR +
                   "/tests/scripts/compare_checkpoints.py " + a + " " + b + " --rtol " + std::to_string(rtol) +
                   " --groups " + groups);
  }

  fs::path dir_;
};

// The metrics events of one kind ("step", "epoch", "skipped_step", ...) of a run directory.
std::vector<nlohmann::json> events(const fs::path& run, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == kind) out.push_back(j);
  }
  return out;
}

// The checkpoint of `step` in a run directory's default checkpoint folder.
std::string ck(const fs::path& run, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d.h5", step);
  return (run / "checkpoints" / name).string();
}

// Per-step losses (ordered by step) and the final eval loss of a run directory. A resumed
// run appends to its metrics; a step logged twice keeps its last value.
std::pair<std::vector<double>, double> losses_of(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  std::map<int64_t, double> by_step;
  double eval = -1;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "step") by_step[j["step"].get<int64_t>()] = j["loss"].get<double>();
    if (j["event"] == "epoch") eval = j["eval_loss"].get<double>();
  }
  std::vector<double> steps;
  for (const auto& [k, v] : by_step) steps.push_back(v);
  return {steps, eval};
}

}  // namespace
