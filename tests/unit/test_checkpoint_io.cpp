// checkpoint_io on its own: round trip of every field, the directory protocol (latest
// pointer, keep_last, stale temporary files), and a storage fault mid-write (a file-size
// limit, as a full disk behaves) that must leave every earlier checkpoint intact.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/runtime/files.h"

namespace {

using namespace lt::checkpoint_io;

class CheckpointIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/lt_ckio_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
           std::to_string(::getpid());
    lt::files::remove_tree(dir_);
    lt::files::make_dirs(dir_);
  }
  void TearDown() override { lt::files::remove_tree(dir_); }

  static Checkpoint sample(int64_t step, int64_t n = 1000) {
    torch::manual_seed(step);
    Checkpoint c;
    c.step = step;
    c.epoch = 1;
    c.samples_seen = step * 32;
    c.world_size = 2;
    c.global_batch = 32;
    c.micro_batch = 4;
    c.accumulation = 4;
    c.precision = "bf16";
    c.model_config = R"({"kind":"gpt"})";
    c.train_config = R"({"lr":0.001})";
    c.config = R"({"model":{"kind":"gpt"}})";
    c.leantrain_version = "0.test";
    c.libtorch_version = "2.x";
    c.model = {{"blocks.0.attn.qkv.weight", torch::randn({n, 8})},
               {"blocks.0.attn.qkv.bias", torch::randn({n})},
               {"bn.num_batches_tracked", torch::full({}, 7, torch::kLong)},
               {"empty", torch::zeros({0, 3})}};
    c.optimizer_kind = "adamw";
    c.optimizer_attrs = {{"lr", 1e-3}, {"beta1", 0.9}};
    c.optimizer = {{"blocks.0.attn.qkv.weight/exp_avg", torch::randn({n, 8})},
                   {"blocks.0.attn.qkv.weight/step", torch::full({}, step, torch::kLong)}};
    c.scaler = {{"scale", 1024.0}, {"growth_tracker", 3.0}};
    c.data = {{"seed", 1234}, {"epoch", 1}, {"position", 5}};
    return c;
  }

  std::string dir_;
};

TEST_F(CheckpointIo, RoundTripKeepsEveryFieldExactly) {
  const auto c = sample(12);
  const std::string path = lt::files::join(dir_, "a.h5");
  const auto stats = write_checkpoint(path, c);
  EXPECT_GT(stats.bytes, 2 * 1000 * 8 * 4);
  EXPECT_EQ(stats.bytes, lt::files::file_size(path));
  const auto r = read_checkpoint(path);
  EXPECT_EQ(r.step, 12);
  EXPECT_EQ(r.samples_seen, 12 * 32);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.accumulation, 4);
  EXPECT_EQ(r.precision, "bf16");
  EXPECT_EQ(r.model_config, c.model_config);
  EXPECT_EQ(r.config, c.config);
  ASSERT_EQ(r.model.size(), c.model.size());
  std::map<std::string, torch::Tensor> got;
  for (const auto& nt : r.model) got[nt.name] = nt.tensor;
  for (const auto& nt : c.model) {
    ASSERT_TRUE(got.count(nt.name)) << nt.name;
    EXPECT_EQ(got[nt.name].scalar_type(), nt.tensor.scalar_type()) << nt.name;
    EXPECT_EQ(got[nt.name].sizes(), nt.tensor.sizes()) << nt.name;
    EXPECT_TRUE(torch::equal(got[nt.name], nt.tensor)) << nt.name;
  }
  ASSERT_EQ(r.optimizer.size(), 2u);
  for (const auto& nt : r.optimizer) {
    if (nt.name == "blocks.0.attn.qkv.weight/step") EXPECT_EQ(nt.tensor.item<int64_t>(), 12);
    else EXPECT_TRUE(torch::equal(nt.tensor, c.optimizer[0].tensor)) << nt.name;
  }
  EXPECT_EQ(r.optimizer_kind, "adamw");
  EXPECT_EQ(r.optimizer_attrs.at("lr"), 1e-3);
  EXPECT_EQ(r.scaler.at("scale"), 1024.0);
  EXPECT_EQ(r.data.at("position"), 5);
}

TEST_F(CheckpointIo, CheckModelListsEveryMismatch) {
  const auto c = sample(1);
  std::vector<NamedTensor> expected = {{"blocks.0.attn.qkv.weight", torch::zeros({999, 8})},
                                       {"blocks.0.attn.qkv.bias", torch::zeros({1000})},
                                       {"bn.num_batches_tracked", torch::zeros({}, torch::kFloat)},
                                       {"head.weight", torch::zeros({2, 2})}};
  try {
    check_model(c, expected, "x.h5");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("4 problems"), std::string::npos) << m;
    EXPECT_NE(m.find("blocks.0.attn.qkv.weight: shape [1000, 8] in the checkpoint, [999, 8] in the model"),
              std::string::npos) << m;
    EXPECT_NE(m.find("bn.num_batches_tracked: dtype Long in the checkpoint, Float in the model"), std::string::npos) << m;
    EXPECT_NE(m.find("missing head.weight [2, 2]"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected empty [0, 3]"), std::string::npos) << m;
  }
}

TEST_F(CheckpointIo, DirectoryKeepsTheNewestAndPointsAtThem) {
  for (int64_t s : {2, 4, 6, 8}) commit_checkpoint(dir_, sample(s, 10), 2);
  const auto names = lt::files::list_dir(dir_);
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000006.h5", "step-00000008.h5"}));
  const auto list = list_checkpoints(dir_);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0], lt::files::join(dir_, "step-00000008.h5"));
  // A temporary file left by a killed writer is never listed, and the next commit removes it.
  lt::files::write_atomic(lt::files::join(dir_, "step-00000010.h5.tmp.99999"), "partial");
  EXPECT_EQ(list_checkpoints(dir_).size(), 2u);
  commit_checkpoint(dir_, sample(10, 10), 2);
  EXPECT_FALSE(lt::files::exists(lt::files::join(dir_, "step-00000010.h5.tmp.99999")));
  EXPECT_EQ(list_checkpoints(dir_)[0], lt::files::join(dir_, "step-00000010.h5"));
}

// A storage fault mid-write (RLIMIT_FSIZE: writes past the limit fail with EFBIG, as on a
// full disk): a clear error, no partial file under any name, the earlier checkpoint intact.
TEST_F(CheckpointIo, FailedWriteKeepsEarlierCheckpointsIntact) {
  commit_checkpoint(dir_, sample(2, 10), 3);
  const auto before = lt::files::list_dir(dir_);
  const auto fds_before = lt::files::list_dir("/proc/self/fd").size();
  std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit old {};
  getrlimit(RLIMIT_FSIZE, &old);
  struct rlimit lim = old;
  lim.rlim_cur = 64 * 1024;  // the new checkpoint is ~1.3 MB
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string message;
  try {
    commit_checkpoint(dir_, sample(4, 20000), 3);
  } catch (const CheckpointError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, SIG_DFL);
  EXPECT_NE(message.find("step-00000004.h5"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot"), std::string::npos) << message;
  EXPECT_EQ(lt::files::list_dir(dir_), before);  // no temporary file, no new pointer
  const auto r = read_checkpoint(lt::files::join(dir_, "step-00000002.h5"));
  EXPECT_EQ(r.step, 2);
  EXPECT_EQ(list_checkpoints(dir_)[0], lt::files::join(dir_, "step-00000002.h5"));
  // The failed file's descriptor was released (the space of the removed temporary file comes
  // back), and the next checkpoint in the same process works.
  EXPECT_EQ(lt::files::list_dir("/proc/self/fd").size(), fds_before);
  commit_checkpoint(dir_, sample(6, 20000), 3);
  EXPECT_EQ(read_checkpoint(lt::files::join(dir_, "step-00000006.h5")).step, 6);
}

TEST_F(CheckpointIo, UnsupportedDtypeIsAClearError) {
  auto c = sample(1, 4);
  c.model.push_back({"half", torch::zeros({2}, torch::kHalf)});
  try {
    write_checkpoint(lt::files::join(dir_, "h.h5"), c);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'half' has dtype Half"), std::string::npos) << e.what();
  }
  EXPECT_EQ(lt::files::list_dir(dir_).size(), 0u);
}

}  // namespace
