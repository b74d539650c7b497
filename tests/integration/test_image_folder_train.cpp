// The image_folder kind end to end: Fashion-MNIST written out as a PNG folder, and as a JPEG
// folder, trains the small ResNet to the same eval accuracy as the IDX files (within 1 point), and a corrupt image stops
// a run with exit code 2 naming the file.
#include <cstdint>
#include <string>
#include <vector>

#include <zlib.h>

#include "cli_fixture.h"
#include "../unit/image_writer.h"

namespace {

const std::string kFashion = "/usr/share/datasets/fashion-mnist";
constexpr int64_t kTrain = 2000, kEval = 500;

// An IDX file's payload after its header (this test links no LibTorch: std::filesystem and
// the PyPI libtorch do not mix, docs/ARCHITECTURE.md).
std::vector<uint8_t> idx_payload(const std::string& path, int header_bytes) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  std::vector<uint8_t> out, buf(1 << 16);
  for (int n; (n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0;) out.insert(out.end(), buf.begin(), buf.begin() + n);
  gzclose(f);
  out.erase(out.begin(), out.begin() + header_bytes);
  return out;
}

// Samples [0, n) of a split, as a PNG folder and as IDX files holding them in the folder's order
// (class-major), so that sample i is the same image on both paths and both runs see the same
// batches.
void write_split(const std::string& split, const std::string& idx_prefix, int64_t n, const fs::path& folder,
                 const fs::path& idx_dir, bool jpeg = false) {
  const auto pixels = idx_payload(kFashion + "/" + split + "-images-idx3-ubyte.gz", 16);
  const auto labels = idx_payload(kFashion + "/" + split + "-labels-idx1-ubyte.gz", 8);
  const auto order = lt_test::write_folder(folder.string(), pixels.data(), labels.data(), n, jpeg);
  std::vector<uint8_t> px, lb;
  for (int64_t i : order) {
    px.insert(px.end(), pixels.begin() + i * 784, pixels.begin() + (i + 1) * 784);
    lb.push_back(labels[static_cast<size_t>(i)]);
  }
  lt_test::write_idx((idx_dir / (idx_prefix + "-images-idx3-ubyte")).string(),
                     (idx_dir / (idx_prefix + "-labels-idx1-ubyte")).string(), px, lb, 28, 28);
}

std::string config(const fs::path& path, const std::string& data) {
  std::ofstream(path) << "[model]\nkind = \"resnet\"\ndepth = 0\nlayers = [1, 1, 1]\nblock = \"basic\"\nwidth = 16\n"
                         "stem = \"small\"\nin_channels = 1\nimage_size = 28\nnum_classes = 10\n"
                      << "[data]\n" << data << "seed = 1234\n"
                      << "[train]\nglobal_batch = 64\nmicro_batch = 64\nepochs = 2\noptimizer = \"adamw\"\nlr = 3e-3\n"
                         "min_lr = 3e-5\nwarmup_steps = 10\nweight_decay = 0.05\ngrad_clip = 1.0\neval_batch = 500\n"
                         "[precision]\nmode = \"fp32\"\n[log]\nprogress = \"none\"\n";
  return path.string();
}

double final_accuracy(const fs::path& run) {
  const auto epochs = events(run, "epoch");
  return epochs.empty() ? -1 : epochs.back()["eval_accuracy"].get<double>();
}

class ImageFolderTrain : public Cli {
 protected:
  // Trains the folder (PNG or JPEG) and the IDX files holding the same images; returns the
  // two eval accuracies.
  std::pair<double, double> folder_and_idx_accuracy(bool jpeg);
};

std::pair<double, double> ImageFolderTrain::folder_and_idx_accuracy(bool jpeg) {
  const fs::path png = dir_ / "png", idx = dir_ / "idx";
  fs::create_directories(png);
  fs::create_directories(idx);
  write_split("train", "train", kTrain, png / "train", idx, jpeg);
  write_split("t10k", "t10k", kEval, png / "eval", idx, jpeg);

  // The image path fed exactly as the IDX path: no augmentation, the IDX kind's normalisation.
  const auto folder_cfg = config(dir_ / "folder.toml", "kind = \"image_folder\"\ntrain = \"" + (png / "train").string() +
                                                           "\"\neval = \"" + (png / "eval").string() +
                                                           "\"\ntrain_transform = \"none\"\nhflip = false\nresize = 28\n"
                                                           "mean = \"0.2860\"\nstd = \"0.3530\"\nworkers = 2\n");
  const auto idx_cfg = config(dir_ / "idx.toml", "kind = \"fashion_mnist\"\npath = \"" + idx.string() + "\"\n");
  auto a = run("train --config " + folder_cfg + " --out " + (dir_ / "folder").string());
  EXPECT_EQ(a.code, 0) << a.err;
  auto b = run("train --config " + idx_cfg + " --out " + (dir_ / "idx_run").string());
  EXPECT_EQ(b.code, 0) << b.err;
  EXPECT_NE(a.err.find("image_folder train: 2000 images in 10 classes"), std::string::npos) << a.err;
  const double acc_folder = final_accuracy(dir_ / "folder"), acc_idx = final_accuracy(dir_ / "idx_run");
  std::printf("eval accuracy after 2 epochs on 2000 images: image_folder (%s) %.4f, fashion_mnist (IDX) %.4f\n",
              jpeg ? "JPEG" : "PNG", acc_folder, acc_idx);
  EXPECT_GT(acc_idx, 0.6);  // chance is 0.1: the comparison is between runs that learnt
  return {acc_folder, acc_idx};
}

TEST_F(ImageFolderTrain, FashionPngsTrainToTheIdxAccuracy) {
  const auto [folder, idx] = folder_and_idx_accuracy(false);
  EXPECT_NEAR(folder, idx, 0.01);
}

// JPEG (quality 95) changes pixels by a few levels, so the two runs see slightly different
// images and the accuracies need not be equal; they stay within 1 point.
TEST_F(ImageFolderTrain, FashionJpegsTrainToTheIdxAccuracy) {
  const auto [folder, idx] = folder_and_idx_accuracy(true);
  EXPECT_NEAR(folder, idx, 0.01);
}

TEST_F(Cli, ImageFolderCorruptImageStopsTheRunNamingTheFile) {
  const fs::path root = dir_ / "imgs";
  fs::create_directories(root / "a");
  fs::create_directories(root / "b");
  std::vector<uint8_t> px(28 * 28 * 3, 128);
  for (int i = 0; i < 8; ++i) {
    lt_test::write_png((root / "a" / lt_test::sample_name(i, "png")).string(), px.data(), 28, 28, 3);
    lt_test::write_jpeg((root / "b" / lt_test::sample_name(i, "jpg")).string(), px.data(), 28, 28, 3);
  }
  const auto bad = root / "b" / lt_test::sample_name(3, "jpg");
  fs::resize_file(bad, fs::file_size(bad) / 2);
  const auto cfg = dir_ / "bad.toml";
  std::ofstream(cfg) << "[model]\nkind = \"mlp\"\nin_channels = 3\nimage_size = 28\nnum_classes = 2\nhidden = [8]\n"
                     << "[data]\nkind = \"image_folder\"\ntrain = \"" << root.string() << "\"\n"
                     << "[train]\nglobal_batch = 16\nmicro_batch = 16\nsteps = 2\n[log]\nprogress = \"none\"\n";
  auto r = run("train --config " + cfg.string() + " --out " + (dir_ / "run").string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("image '" + bad.string() + "': corrupt JPEG: Premature end of JPEG file"), std::string::npos)
      << r.err;
  // Skipped when asked: the run trains, the log counts it.
  auto s = run("train --config " + cfg.string() + " --set data.on_corrupt=skip --out " + (dir_ / "skip").string());
  EXPECT_EQ(s.code, 0) << s.err;
  EXPECT_NE(s.err.find("1 image(s) skipped so far"), std::string::npos) << s.err;
}

}  // namespace
