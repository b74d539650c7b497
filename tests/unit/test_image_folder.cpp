// The image_folder kind (data/image_folder.h): Fashion-MNIST written out as PNG and JPEG folders,
// decoded back (PNG exactly), classes and labels, the transforms' geometry and determinism in
// (seed, epoch, index), every bad folder and file, on_corrupt = skip, and the Prefetcher.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "image_writer.h"
#include "leantrain/data/data.h"
#include "leantrain/data/image_folder.h"
#include "leantrain/data/prefetch.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/errors.h"
#include "expect_error.h"

namespace {

using lt_test::error_of;

using lt::data::CropBox;
using lt::data::ImageFolderConfig;

const std::string kFashion = "/usr/share/datasets/fashion-mnist";

std::string scratch() {
  static const std::string dir = [] {
    std::string d = "/tmp/lt_imgfolder_" + std::to_string(::getpid());
    std::system(("rm -rf " + d + " && mkdir -p " + d).c_str());
    return d;
  }();
  return dir;
}

lt::InputContract images(int64_t channels, int64_t size, int64_t classes = 10) {
  lt::InputContract m;
  m.input = lt::InputContract::Input::kImages;
  m.target = lt::InputContract::Target::kClassLabels;
  m.channels = channels;
  m.height = m.width = size;
  m.num_classes = classes;
  m.channels_key = "model.in_channels";
  m.size_key = "model.image_size";
  m.num_classes_key = "model.num_classes";
  return m;
}

// The first kN Fashion-MNIST test images (t10k: the smaller file to read), as IDX pixels and
// as PNG and JPEG folders.
constexpr int64_t kN = 300;
struct Fashion {
  lt::data::IdxImages images;
  lt::data::IdxLabels labels;
  std::string png, jpg;
  std::vector<int64_t> order;  // folder sample k = IDX sample order[k]
};
const Fashion& fashion() {
  static const Fashion f = [] {
    Fashion f;
    f.images = lt::data::read_idx_images(kFashion + "/t10k-images-idx3-ubyte.gz");
    f.labels = lt::data::read_idx_labels(kFashion + "/t10k-labels-idx1-ubyte.gz");
    f.png = scratch() + "/fashion_png";
    f.jpg = scratch() + "/fashion_jpg";
    f.order = lt_test::write_folder(f.png, f.images.pixels.data(), f.labels.labels.data(), kN, false);
    lt_test::write_folder(f.jpg, f.images.pixels.data(), f.labels.labels.data(), kN, true);
    return f;
  }();
  return f;
}

// The options that make the image path feed exactly what the fashion_mnist kind feeds.
ImageFolderConfig identical_to_idx(const std::string& root) {
  ImageFolderConfig c;
  c.train = root;
  c.train_transform = "none";
  c.hflip = false;
  c.resize = 28;
  c.mean = "0.2860";
  c.std_dev = "0.3530";
  return c;
}

std::vector<int64_t> iota(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

// A folder of `n` RGB images h x w with distinct content, in `classes` classes.
std::string rgb_folder(const std::string& name, int n, int h, int w, int classes = 2) {
  const std::string root = scratch() + "/" + name;
  lt_test::make_dir(root);
  for (int c = 0; c < classes; ++c) lt_test::make_dir(root + "/k" + std::to_string(c));
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> px(static_cast<size_t>(h * w * 3));
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int ch = 0; ch < 3; ++ch)
          px[(y * w + x) * 3 + ch] = static_cast<uint8_t>((x * 7 + y * 3 + ch * 50 + i * 11 + (x * y) % 13) & 255);
    lt_test::write_png(root + "/k" + std::to_string(i % classes) + "/" + lt_test::sample_name(i, "png"), px.data(), h, w, 3);
  }
  return root;
}

std::string copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary);
  out << in.rdbuf();
  return to;
}

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

// ---------------------------------------------------------------------------------------------

TEST(ImageFolder, ClassesAreSortedFolderNamesAndFilesSortedWithin) {
  const std::string root = scratch() + "/layout";
  lt_test::make_dir(root);
  for (const char* c : {"zebra", "Apple", "mango"}) lt_test::make_dir(root + "/" + c);
  lt_test::make_dir(root + "/mango/sub");
  const uint8_t px[4] = {1, 2, 3, 4};
  for (const char* f : {"zebra/b.png", "zebra/a.PNG", "Apple/x.jpg", "mango/c.png", "mango/sub/a.png"}) {
    const std::string p = root + "/" + f;
    if (std::string(f).find(".jpg") != std::string::npos)
      lt_test::write_jpeg(p, px, 2, 2, 1);
    else
      lt_test::write_png(p, px, 2, 2, 1);
  }
  write_bytes(root + "/mango/notes.txt", "not an image");
  write_bytes(root + "/stray.png", "a file at the root is no class");
  const auto idx = lt::data::scan_image_folder(root, "data.train");
  EXPECT_EQ(idx.classes, (std::vector<std::string>{"Apple", "mango", "zebra"}));  // byte order, as Python's sorted()
  ASSERT_EQ(idx.files.size(), 5u);
  EXPECT_EQ(idx.files[0], root + "/Apple/x.jpg");
  EXPECT_EQ(idx.files[1], root + "/mango/c.png");
  EXPECT_EQ(idx.files[2], root + "/mango/sub/a.png");
  EXPECT_EQ(idx.files[3], root + "/zebra/a.PNG");
  EXPECT_EQ(idx.files[4], root + "/zebra/b.png");
  EXPECT_EQ(idx.labels, (std::vector<int64_t>{0, 1, 1, 2, 2}));
}

TEST(ImageFolder, FashionPngDecodesToTheIdxPixelsExactly) {
  const auto& f = fashion();
  const auto idx = lt::data::scan_image_folder(f.png, "data.train");
  ASSERT_EQ(idx.classes.size(), 10u);
  ASSERT_EQ(static_cast<int64_t>(idx.files.size()), kN);
  for (int64_t k = 0; k < kN; ++k) {
    const int64_t i = f.order[static_cast<size_t>(k)];
    EXPECT_EQ(idx.labels[static_cast<size_t>(k)], f.labels.labels[static_cast<size_t>(i)]);
    const auto im = lt::data::decode_image(idx.files[static_cast<size_t>(k)]);
    ASSERT_EQ(im.channels, 1);
    ASSERT_EQ(im.height, 28);
    ASSERT_EQ(im.width, 28);
    ASSERT_EQ(0, std::memcmp(im.pixels.data(), f.images.pixels.data() + i * 784, 784)) << idx.files[k];
  }
}

TEST(ImageFolder, PngBatchesEqualTheIdxKindsBatchesBitForBit) {
  const auto& f = fashion();
  const auto folder = lt::data::make_image_folder(identical_to_idx(f.png), images(1, 28)).train;
  lt::data::DataConfig idx_cfg;  // the fashion_mnist kind
  const auto idx = lt::data::make_datasets(idx_cfg, images(1, 28)).eval;  // t10k
  const auto ks = iota(0, 64);
  std::vector<int64_t> is;
  for (int64_t k : ks) is.push_back(f.order[static_cast<size_t>(k)]);
  const auto a = folder->get(ks, 3), b = idx->get(is, 3);
  EXPECT_TRUE(torch::equal(a.input, b.input));
  EXPECT_TRUE(torch::equal(a.target, b.target));
}

TEST(ImageFolder, JpegDecodesCloseToTheIdxPixels) {
  const auto& f = fashion();
  const auto idx = lt::data::scan_image_folder(f.jpg, "data.train");
  double total = 0;
  for (int64_t k = 0; k < kN; ++k) {
    const int64_t i = f.order[static_cast<size_t>(k)];
    const auto im = lt::data::decode_image(idx.files[static_cast<size_t>(k)]);
    ASSERT_EQ(im.channels, 1);
    for (int p = 0; p < 784; ++p) total += std::abs(int(im.pixels[p]) - int(f.images.pixels[i * 784 + p]));
  }
  EXPECT_LT(total / (kN * 784.0), 2.5);  // quality 95: ~1 level on average
}

TEST(ImageFolder, ChannelsAreConvertedToTheModels) {
  const auto& f = fashion();
  const std::string file = lt::data::scan_image_folder(f.png, "data.train").files[0];
  const auto gray = lt::data::decode_image(file), rgb = lt::data::decode_image(file, 3);
  ASSERT_EQ(rgb.channels, 3);
  for (size_t p = 0; p < gray.pixels.size(); ++p)
    for (int c = 0; c < 3; ++c) ASSERT_EQ(rgb.pixels[3 * p + c], gray.pixels[p]);
  // RGB -> gray: PIL's convert("L").
  const std::string path = scratch() + "/rgb1.png";
  const uint8_t px[6] = {255, 0, 0, 10, 200, 30};
  lt_test::write_png(path, px, 1, 2, 3);
  const auto l = lt::data::decode_image(path, 1);
  ASSERT_EQ(l.channels, 1);
  EXPECT_EQ(l.pixels[0], 76);   // (19595 * 255 + 2^15) >> 16
  EXPECT_EQ(l.pixels[1], 124);  // (19595*10 + 38470*200 + 7471*30 + 2^15) >> 16
}

TEST(ImageFolder, RandomResizedCropFollowsTorchvisionsAlgorithm) {
  // Fallback: scale 1 and ratios in [2, 3] never fit a square, so the centre crop at ratio 2;
  // h = round(5 / 2) = 2 (Python rounds half to even).
  auto d = lt::data::train_draw(5, 5, 1.0, 1.0, 2.0, 3.0, false, 1, 0, 0);
  EXPECT_EQ(d.box, (CropBox{1, 0, 2, 5}));
  d = lt::data::train_draw(10, 40, 1.0, 1.0, 0.5, 0.75, false, 1, 0, 0);  // too wide: w = round(10 * 0.75)
  EXPECT_EQ(d.box, (CropBox{0, 16, 10, 8}));
  // Drawn boxes fit, with the area and ratio in range up to rounding.
  std::set<std::pair<int64_t, int64_t>> positions;
  int flips = 0;
  for (int64_t i = 0; i < 500; ++i) {
    d = lt::data::train_draw(375, 500, 0.08, 1.0, 0.75, 4.0 / 3.0, true, 42, 1, i);
    ASSERT_GE(d.box.top, 0);
    ASSERT_GE(d.box.left, 0);
    ASSERT_LE(d.box.top + d.box.height, 375);
    ASSERT_LE(d.box.left + d.box.width, 500);
    const double area = double(d.box.height) * d.box.width / (375.0 * 500.0);
    EXPECT_GT(area, 0.07);
    const double ratio = double(d.box.width) / d.box.height;
    EXPECT_GT(ratio, 0.7);
    EXPECT_LT(ratio, 1.42);
    positions.insert({d.box.top, d.box.left});
    flips += d.flip;
    // A pure function of (seed, epoch, index).
    EXPECT_EQ(d.box, lt::data::train_draw(375, 500, 0.08, 1.0, 0.75, 4.0 / 3.0, true, 42, 1, i).box);
  }
  EXPECT_GT(positions.size(), 450u);
  EXPECT_GT(flips, 200);
  EXPECT_LT(flips, 300);
  EXPECT_FALSE(lt::data::train_draw(375, 500, 0.08, 1.0, 0.75, 4.0 / 3.0, true, 42, 1, 7).box ==
               lt::data::train_draw(375, 500, 0.08, 1.0, 0.75, 4.0 / 3.0, true, 42, 2, 7).box);
}

TEST(ImageFolder, EvalGeometryIsTorchvisionsResizeAndCentreCrop) {
  auto g = lt::data::eval_geometry(40, 60, 32, 28, 28);  // short side 40 -> 32, long int(32*60/40) = 48
  EXPECT_EQ(g.resized_height, 32);
  EXPECT_EQ(g.resized_width, 48);
  EXPECT_EQ(g.box, (CropBox{2, 10, 28, 28}));
  g = lt::data::eval_geometry(375, 500, 256, 224, 224);
  EXPECT_EQ(g.resized_width, 341);  // int(256 * 500 / 375) = int(341.33)
  EXPECT_EQ(g.box, (CropBox{16, 58, 224, 224}));  // round(117 / 2) = 58 (half to even)
  // Resizing an image to its own size changes nothing.
  const auto& f = fashion();
  const auto im = lt::data::decode_image(lt::data::scan_image_folder(f.png, "data.train").files[5]);
  const auto same = lt::data::resize_center_crop(im, 28, 28, 28);
  EXPECT_EQ(0, std::memcmp(same.data_ptr<uint8_t>(), im.pixels.data(), 784));
  const auto flipped = lt::data::resized_crop(im, {0, 0, 28, 28}, 28, 28, true);
  EXPECT_EQ(flipped[0][3][0].item<int>(), im.pixels[3 * 28 + 27]);
}

TEST(ImageFolder, TrainBatchesAreAFunctionOfSeedEpochIndexOnly) {
  const std::string root = rgb_folder("rgb", 12, 45, 60);
  ImageFolderConfig c;
  c.train = root;
  c.workers = 1;
  const auto one = lt::data::make_image_folder(c, images(3, 32, 2)).train;
  c.workers = 4;
  const auto four = lt::data::make_image_folder(c, images(3, 32, 2)).train;
  const std::vector<int64_t> idx{3, 0, 11, 5, 7, 2};
  const auto a = one->get(idx, 2), b = four->get(idx, 2);
  ASSERT_EQ(a.input.sizes(), (std::vector<int64_t>{6, 3, 32, 32}));
  EXPECT_TRUE(torch::equal(a.input, b.input));
  EXPECT_TRUE(torch::equal(a.target, b.target));
  // Class k0 holds images 0, 2, .., 10 (samples 0..5), k1 the odd ones (samples 6..11).
  EXPECT_TRUE(torch::equal(a.target, torch::tensor({0, 0, 1, 0, 1, 0}, torch::kLong)));
  // Sample 11 alone gives the same tensor as within a batch.
  EXPECT_TRUE(torch::equal(four->get({11}, 2).input[0], a.input[2]));
  // Another epoch, another crop; another seed, another crop.
  EXPECT_FALSE(torch::equal(four->get(idx, 3).input, a.input));
  c.seed = 99;
  EXPECT_FALSE(torch::equal(lt::data::make_image_folder(c, images(3, 32, 2)).train->get(idx, 2).input, a.input));
  // The default normalisation is ImageNet's: a sample's values follow (x/255 - mean) / std.
  const auto u8 = lt::data::resized_crop(
      lt::data::decode_image(std::static_pointer_cast<const lt::data::ImageFolderDataset>(one)->index().files[3], 3),
      lt::data::train_draw(45, 60, 0.08, 1.0, 0.75, 4.0 / 3.0, true, 1234, 2, 3).box, 32, 32,
      lt::data::train_draw(45, 60, 0.08, 1.0, 0.75, 4.0 / 3.0, true, 1234, 2, 3).flip);
  const auto expect = (u8.to(torch::kFloat) / 255.0 -
                       torch::tensor({0.485, 0.456, 0.406}, torch::kFloat).view({3, 1, 1})) /
                      torch::tensor({0.229, 0.224, 0.225}, torch::kFloat).view({3, 1, 1});
  EXPECT_LT((expect - b.input[0]).abs().max().item<double>(), 1e-5);
}

TEST(ImageFolder, ScaleAndRatioOptions) {
  const auto r = lt::data::range_values("3/4, 4/3", false, "data.ratio");
  EXPECT_EQ(r.first, 3.0 / 4.0);
  EXPECT_EQ(r.second, 4.0 / 3.0);  // exactly torchvision's default
  EXPECT_EQ(lt::data::range_values("0.08,1", true, "data.scale"), std::make_pair(0.08, 1.0));
  EXPECT_CONTAINS(error_of<lt::ConfigError>([] { lt::data::range_values("0.5", true, "data.scale"); }),
                  "data.scale = \"0.5\": two values are needed, 1 given");
  EXPECT_CONTAINS(error_of<lt::ConfigError>([] { lt::data::range_values("0.5, 2", true, "data.scale"); }),
                  "a share of the area is at most 1");
  EXPECT_CONTAINS(error_of<lt::ConfigError>([] { lt::data::range_values("2, 1", false, "data.ratio"); }),
                  "needs 0 < lo <= hi");
  EXPECT_CONTAINS(error_of<lt::ConfigError>([] { lt::data::range_values("1/0, 2", false, "data.ratio"); }),
                  "'1/0' is not a number or a fraction");
}

TEST(ImageFolder, MeanAndStdOptions) {
  EXPECT_EQ(lt::data::channel_values("", 1, false, "data.mean"), std::vector<double>{0.449});
  EXPECT_EQ(lt::data::channel_values("0.5", 3, true, "data.std"), (std::vector<double>{0.5, 0.5, 0.5}));
  EXPECT_EQ(lt::data::channel_values(" 0.1, 0.2 ,0.3", 3, false, "data.mean"), (std::vector<double>{0.1, 0.2, 0.3}));
  EXPECT_CONTAINS(error_of<lt::ConfigError>([] { lt::data::channel_values("0.1, 0.2", 3, false, "data.mean"); }),
                  "data.mean = \"0.1, 0.2\" gives 2 values; the model takes 3 channel(s)");
  EXPECT_CONTAINS(error_of<lt::ConfigError>([] { lt::data::channel_values("0.1, x", 3, false, "data.mean"); }),
                  "'x' is not a number");
  EXPECT_CONTAINS(error_of<lt::ConfigError>([] { lt::data::channel_values("0", 3, true, "data.std"); }),
                  "every std must be > 0");
}

TEST(ImageFolder, RegisteredAsADataKindWithItsOptions) {
  const auto& f = fashion();
  lt::DataSection s;
  s.kind = "image_folder";
  s.options.set("train", f.png);
  s.options.set("eval", f.png);
  s.options.set("workers", int64_t{3});
  const auto d = lt::data::make_datasets(s, images(1, 28));
  ASSERT_TRUE(d.train && d.eval);
  EXPECT_EQ(d.train->size(), kN);
  EXPECT_CONTAINS(d.train->describe(), "image_folder train: 300 images in 10 classes");
  EXPECT_CONTAINS(d.train->describe(), "3 decode worker(s)");
  EXPECT_CONTAINS(d.eval->describe(), "resize 32 + centre crop");  // round(28 / 0.875)
  const auto b = d.eval->get({0, 1}, 0);
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{2, 1, 28, 28}));
  s.options.set("on_corrupt", std::string("ignore"));
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::make_datasets(s, images(1, 28)); }), "error | skip");
}

TEST(ImageFolder, ConfigMismatchesAreConfigErrors) {
  const auto& f = fashion();
  ImageFolderConfig c;
  c.train = f.png;
  lt::models::ModelConfig gpt;
  gpt.kind = "gpt";
  gpt.n_head = 2;
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::make_image_folder(c, lt::models::model_contract(gpt)); }),
                  "data.kind = 'image_folder' gives images with class labels; the model takes tokens");
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::make_image_folder(c, images(1, 28, 7)); }),
                  "model.num_classes = 7, but data.train = '" + f.png + "' has 10 class folders (set model.num_classes = 10)");
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::make_image_folder(c, images(2, 28)); }),
                  "model.in_channels = 2, but image_folder gives 1 (gray) or 3 (RGB) channels");
  c.resize = 20;
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::make_image_folder(c, images(1, 28)); }),
                  "data.resize = 20 is smaller than the model's image (28x28)");
}

TEST(ImageFolder, BadFoldersNameThePath) {
  ImageFolderConfig c;
  c.train = scratch() + "/nope";
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::make_image_folder(c, images(1, 28)); }),
                  "data.train = '" + c.train + "' does not exist");
  const std::string empty_root = scratch() + "/no_classes";
  lt_test::make_dir(empty_root);
  write_bytes(empty_root + "/a.png", "x");
  c.train = empty_root;
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { lt::data::make_image_folder(c, images(1, 28)); }),
                  "image folder '" + empty_root + "' (data.train) holds no class folders");
  const std::string empty_class = scratch() + "/empty_class";
  lt_test::make_dir(empty_class);
  lt_test::make_dir(empty_class + "/a");
  lt_test::make_dir(empty_class + "/b");
  const uint8_t px[1] = {7};
  lt_test::write_png(empty_class + "/a/x.png", px, 1, 1, 1);
  write_bytes(empty_class + "/b/readme.txt", "no images here");
  c.train = empty_class;
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { lt::data::make_image_folder(c, images(1, 28, 2)); }),
                  "image folder '" + empty_class + "/b' (class 'b') holds no .jpg, .jpeg or .png file");
}

// A folder whose class k0 holds good PNGs 0, 2 and a bad file 1 (sample index 1).
std::string folder_with_bad(const std::string& name, const std::string& bad_name, const std::string& bad_bytes) {
  const std::string root = scratch() + "/" + name;
  lt_test::make_dir(root);
  lt_test::make_dir(root + "/k0");
  const auto& f = fashion();
  lt_test::write_png(root + "/k0/a0.png", f.images.pixels.data(), 28, 28, 1);
  write_bytes(root + "/k0/" + bad_name, bad_bytes);
  lt_test::write_png(root + "/k0/a2.png", f.images.pixels.data() + 784, 28, 28, 1);
  return root;
}

TEST(ImageFolder, CorruptAndUnreadableImagesAreDataErrorsNamingTheFile) {
  const auto& f = fashion();
  const auto files = lt::data::scan_image_folder(f.jpg, "data.train").files;
  const std::string jpeg = read_bytes(files[0]);
  const std::string png = read_bytes(lt::data::scan_image_folder(f.png, "data.train").files[0]);
  ASSERT_GT(jpeg.size(), 200u);
  std::string garbled = jpeg;
  for (size_t i = 20; i < garbled.size(); i += 3) garbled[i] = static_cast<char>(garbled[i] ^ 0x5a);
  std::string bad_png = png;
  bad_png[bad_png.size() / 2] ^= 0x40;  // inside IDAT: its CRC fails
  struct Case {
    std::string name, bytes, needle;
  } cases[] = {
      {"a1.jpg", jpeg.substr(0, jpeg.size() / 2), "corrupt JPEG: Premature end of JPEG file"},
      {"a1.jpg", garbled, "corrupt JPEG"},
      {"a1.png", bad_png, "corrupt PNG"},
      {"a1.png", png.substr(0, png.size() / 2), "corrupt PNG"},
      {"a1.png", "GIF89a not really", "neither JPEG nor PNG"},
      {"a1.png", "", "empty file"},
  };
  int n = 0;
  for (const auto& k : cases) {
    const std::string root = folder_with_bad("bad" + std::to_string(n++), k.name, k.bytes);
    ImageFolderConfig c = identical_to_idx(root);
    const auto d = lt::data::make_image_folder(c, images(1, 28, 1)).train;
    const std::string msg = error_of<lt::DataError>([&] { d->get({0, 1, 2}, 0); });
    EXPECT_CONTAINS(msg, "image '" + root + "/k0/" + k.name + "': ");
    EXPECT_CONTAINS(msg, k.needle);
  }
  // Unreadable: a dangling link (root reads anything, so no chmod).
  const std::string root = folder_with_bad("dangling", "a1.png", "");
  ::unlink((root + "/k0/a1.png").c_str());
  ASSERT_EQ(0, ::symlink((root + "/k0/missing").c_str(), (root + "/k0/a1.png").c_str()));
  const auto d = lt::data::make_image_folder(identical_to_idx(root), images(1, 28, 1)).train;
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { d->get({1}, 0); }),
                  "image '" + root + "/k0/a1.png': cannot open: No such file or directory");
}

TEST(ImageFolder, SkipReplacesACorruptImageByTheNextReadableOneAndCountsIt) {
  const auto& f = fashion();
  const std::string jpeg = read_bytes(lt::data::scan_image_folder(f.jpg, "data.train").files[0]);
  const std::string root = folder_with_bad("skip", "a1.jpg", jpeg.substr(0, jpeg.size() / 3));
  ImageFolderConfig c = identical_to_idx(root);
  c.on_corrupt = "skip";
  const auto d = std::static_pointer_cast<lt::data::ImageFolderDataset>(
      lt::data::make_image_folder(c, images(1, 28, 1)).train);
  ASSERT_EQ(d->size(), 3);
  EXPECT_EQ(d->skipped(), 0);
  const auto b = d->get({0, 1, 2, 1}, 0);
  EXPECT_TRUE(torch::equal(b.input[1], b.input[2]));  // sample 1 is sample 2's image
  EXPECT_TRUE(torch::equal(b.input[3], b.input[2]));
  EXPECT_FALSE(torch::equal(b.input[0], b.input[2]));
  EXPECT_EQ(d->skipped(), 1);  // the same file counts once
  d->get({1}, 5);
  EXPECT_EQ(d->skipped(), 1);
  // Every file corrupt: an error, not a loop.
  const std::string all_bad = scratch() + "/all_bad";
  lt_test::make_dir(all_bad);
  lt_test::make_dir(all_bad + "/k0");
  write_bytes(all_bad + "/k0/x.jpg", jpeg.substr(0, 100));
  c.train = all_bad;
  const auto bad = lt::data::make_image_folder(c, images(1, 28, 1)).train;
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { bad->get({0}, 0); }), "every image under '" + all_bad + "' is corrupt");
}

// ---------------------------------------------------------------------------------------------
// Prefetcher

TEST(Prefetcher, WantedBatchesEqualDirectGets) {
  const std::string root = rgb_folder("rgb_prefetch", 16, 40, 50);
  ImageFolderConfig c;
  c.train = root;
  std::shared_ptr<const lt::data::Dataset> d = lt::data::make_image_folder(c, images(3, 24, 2)).train;
  lt::data::Prefetcher pf(d);
  const std::vector<std::vector<int64_t>> batches{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}};
  pf.want(batches[0], 1);
  for (size_t j = 0; j < batches.size(); ++j) {
    if (j + 1 < batches.size()) pf.want(batches[j + 1], 1);
    const auto got = pf.take(batches[j], 1), direct = d->get(batches[j], 1);
    EXPECT_TRUE(torch::equal(got.input, direct.input)) << j;
    EXPECT_TRUE(torch::equal(got.target, direct.target)) << j;
  }
  EXPECT_EQ(pf.hits(), 4);
  EXPECT_EQ(pf.misses(), 0);
  // Not wanted (or another epoch): built in take, the same batch.
  EXPECT_TRUE(torch::equal(pf.take(batches[1], 2).input, d->get(batches[1], 2).input));
  pf.want(batches[2], 1);
  EXPECT_TRUE(torch::equal(pf.take(batches[2], 3).input, d->get(batches[2], 3).input));  // a miss drops it
  EXPECT_EQ(pf.hits(), 4);
  EXPECT_EQ(pf.misses(), 2);
}

TEST(Prefetcher, AnExceptionInTheBackgroundSurfacesInTake) {
  const auto& f = fashion();
  const std::string jpeg = read_bytes(lt::data::scan_image_folder(f.jpg, "data.train").files[0]);
  const std::string root = folder_with_bad("prefetch_bad", "a1.jpg", jpeg.substr(0, jpeg.size() / 2));
  std::shared_ptr<const lt::data::Dataset> d =
      lt::data::make_image_folder(identical_to_idx(root), images(1, 28, 1)).train;
  lt::data::Prefetcher pf(d);
  pf.want({0, 1}, 0);
  pf.want({2}, 0);
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { pf.take({0, 1}, 0); }), "a1.jpg");
  EXPECT_EQ(pf.take({2}, 0).input.size(0), 1);  // the prefetcher keeps working after an error
  EXPECT_THROW(pf.take({5}, 0), std::out_of_range);
}

// Note [Pinned batches]: `prepare` runs once on every batch, prefetched (on the background
// thread) or built in take() (on the caller's), before the caller sees it.
TEST(Prefetcher, PrepareRunsOnEveryBatchOnTheThreadThatBuiltIt) {
  const std::string root = rgb_folder("rgb_prepare", 8, 40, 50);
  ImageFolderConfig c;
  c.train = root;
  std::shared_ptr<const lt::data::Dataset> d = lt::data::make_image_folder(c, images(3, 24, 2)).train;
  std::mutex mu;
  std::vector<std::thread::id> threads;
  lt::data::Prefetcher pf(d, 2, [&](lt::data::Batch& b) {
    b.tokens = 1000 + b.input.size(0);  // a mark the caller sees
    std::lock_guard<std::mutex> lock(mu);
    threads.push_back(std::this_thread::get_id());
  });
  pf.want({0, 1}, 0);
  for (int i = 0; i < 500; ++i) {  // until the background thread has built it (at most 5 s)
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!threads.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto wanted = pf.take({0, 1}, 0);
  const auto unwanted = pf.take({2, 3, 4}, 0);
  EXPECT_EQ(wanted.tokens, 1002);
  EXPECT_EQ(unwanted.tokens, 1003);
  EXPECT_TRUE(torch::equal(wanted.input, d->get({0, 1}, 0).input));  // prepared, not changed otherwise
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_NE(threads[0], std::this_thread::get_id());  // the prefetched one: the background thread
  EXPECT_EQ(threads[1], std::this_thread::get_id());  // the one take() built: this thread
}

TEST(Prefetcher, DestructionWithPendingBatchesJoins) {
  const std::string root = rgb_folder("rgb_destroy", 8, 200, 300);
  ImageFolderConfig c;
  c.train = root;
  std::shared_ptr<const lt::data::Dataset> d = lt::data::make_image_folder(c, images(3, 64, 2)).train;
  for (int k = 0; k < 5; ++k) {
    lt::data::Prefetcher pf(d, 3);
    pf.want({0, 1, 2, 3, 4, 5, 6, 7}, k);
    pf.want({0, 1}, k);
    pf.want({2, 3}, k);
    pf.want({4, 5}, k);  // beyond max_pending: ignored
  }  // each destructor returns (the test would hang otherwise)
  lt::data::Prefetcher pf(d, 1);
  pf.want({0}, 0);
  pf.want({0}, 0);  // already wanted: not twice
  pf.want({1}, 0);  // beyond max_pending: ignored
  EXPECT_TRUE(torch::equal(pf.take({0}, 0).input, d->get({0}, 0).input));
  EXPECT_TRUE(torch::equal(pf.take({1}, 0).input, d->get({1}, 0).input));
  EXPECT_EQ(pf.hits(), 1);
  EXPECT_EQ(pf.misses(), 1);
}

}  // namespace
