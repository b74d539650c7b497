// The learning-rate schedule and the metrics file format.
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "leantrain/runtime/files.h"
#include "leantrain/trainers/metrics.h"
#include "leantrain/trainers/schedule.h"

namespace {

TEST(Schedule, WarmupThenCosineToMinLr) {
  lt::TrainConfig t;
  t.lr = 1.0;
  t.min_lr = 0.1;
  t.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(lt::trainers::lr_at(t, 0, 104), 0.25);
  EXPECT_DOUBLE_EQ(lt::trainers::lr_at(t, 3, 104), 1.0);
  EXPECT_DOUBLE_EQ(lt::trainers::lr_at(t, 4, 104), 1.0);
  EXPECT_NEAR(lt::trainers::lr_at(t, 54, 104), 0.55, 1e-12);  // half way: mean of lr and min_lr
  EXPECT_NEAR(lt::trainers::lr_at(t, 104, 104), 0.1, 1e-12);
  for (int s = 5; s < 104; ++s) EXPECT_LE(lt::trainers::lr_at(t, s, 104), lt::trainers::lr_at(t, s - 1, 104));
  t.schedule = "constant";
  EXPECT_DOUBLE_EQ(lt::trainers::lr_at(t, 50, 104), 1.0);
  // Opt-in linear scaling: lr and min_lr x global_batch / lr_reference_batch, nothing else.
  t.schedule = "cosine";
  t.global_batch = 512;
  t.lr_reference_batch = 128;
  EXPECT_DOUBLE_EQ(lt::trainers::lr_scale(t), 1.0);  // lr_scaling = "none"
  auto scaled = t;
  scaled.lr_scaling = "linear";
  EXPECT_DOUBLE_EQ(lt::trainers::lr_scale(scaled), 4.0);
  for (int s : {0, 3, 4, 54, 104}) EXPECT_NEAR(lt::trainers::lr_at(scaled, s, 104), 4.0 * lt::trainers::lr_at(t, s, 104), 1e-12) << s;
}

TEST(Metrics, OneJsonObjectPerLineWithEvent) {
  const std::string dir = "/tmp/lt_metrics_test_" + std::to_string(::getpid());
  lt::files::make_dirs(dir);
  const std::string path = lt::files::join(dir, "metrics.jsonl");
  {
    lt::trainers::MetricsWriter w(path, true);
    w.event("step", {{"step", int64_t{1}}, {"loss", 2.5}, {"nan", std::nan("")}});
    w.event("epoch", {{"epoch", int64_t{0}}, {"note", std::string("x")}});
    lt::trainers::MetricsWriter off(lt::files::join(dir, "other.jsonl"), false);
    off.event("step", {});
  }
  EXPECT_FALSE(lt::files::exists(lt::files::join(dir, "other.jsonl")));
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["event"], "step");
  EXPECT_EQ(j["step"], 1);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 2.5);
  EXPECT_TRUE(j["nan"].is_null());
  std::getline(in, line);
  EXPECT_EQ(nlohmann::json::parse(line)["event"], "epoch");
  EXPECT_FALSE(std::getline(in, line));
  lt::files::remove_tree(dir);
}

}  // namespace
