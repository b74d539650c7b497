// The image_folder datasets: ImageFolder's layout decoded on worker threads, the standard
// transforms on uint8 tensors (LibTorch's antialiased bilinear interpolate, as torchvision's
// v2 functional ops), normalised to float batches.
#include "leantrain/data/image_folder.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include <ATen/Parallel.h>
#include <torch/nn/functional/upsampling.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"

namespace lt::data {
namespace {

namespace F = torch::nn::functional;
using Input = lt::InputContract::Input;
using Target = lt::InputContract::Target;

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Note [Decode threads]: each batch's samples are decoded on `workers` threads of their own,
// never on the caller's, and each runs ATen single-threaded. ATen's OpenMP parallel_for ignores
// c10::ParallelGuard (at::in_parallel_region is omp_in_parallel()), so an interpolate on a
// decode thread would otherwise start an OpenMP team of train.threads threads per call, and
// on the trainer's thread compete with the training it runs (measured: 4x slower on 2 cores).
// omp_set_num_threads sets the calling thread's count only; ATen's per-thread lazy init runs
// first (at::get_num_threads), since it would set the count back.
void single_threaded_aten() {
  (void)at::get_num_threads();
#ifdef _OPENMP
  omp_set_num_threads(1);
#endif
}

// [1, C, h, w] uint8 view of `box` in `image` (HWC memory, so the view is channels-last).
torch::Tensor crop_view(const Image& image, const CropBox& box) {
  auto t = torch::from_blob(const_cast<uint8_t*>(image.pixels.data()), {image.height, image.width, image.channels},
                            torch::kUInt8);
  return t.narrow(0, box.top, box.height).narrow(1, box.left, box.width).permute({2, 0, 1}).unsqueeze(0);
}

torch::Tensor resize_u8(const torch::Tensor& nchw, int64_t out_h, int64_t out_w) {
  if (nchw.size(2) == out_h && nchw.size(3) == out_w) return nchw.contiguous();
  return F::interpolate(nchw, F::InterpolateFuncOptions()
                                  .size(std::vector<int64_t>{out_h, out_w})
                                  .mode(torch::kBilinear)
                                  .align_corners(false)
                                  .antialias(true));
}

void check_box(const Image& image, const CropBox& b) {
  if (b.top < 0 || b.left < 0 || b.height <= 0 || b.width <= 0 || b.top + b.height > image.height ||
      b.left + b.width > image.width)
    throw std::invalid_argument("crop box outside the image");
}

std::string format_values(const std::vector<double>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

// ---------------------------------------------------------------------------------------------

struct Transform {
  bool random_crop = true;  // random_resized_crop, else the eval transform
  bool flip = false;        // random horizontal flips
  double scale_lo = 0.08, scale_hi = 1.0, ratio_lo = 0.75, ratio_hi = 4.0 / 3.0;
  int64_t resize = 0;
  uint64_t seed = 0;
};

class FolderDataset final : public ImageFolderDataset {
 public:
  FolderDataset(std::string name, std::string root, FolderIndex index, Transform t, int64_t channels,
                int64_t height, int64_t width, const std::vector<double>& mean, const std::vector<double>& stdv,
                bool skip_corrupt, int64_t workers)
      : name_(std::move(name)), root_(std::move(root)), index_(std::move(index)), t_(t), C_(channels), H_(height),
        W_(width), skip_(skip_corrupt), workers_(std::max<int64_t>(1, workers)), mean_(mean), std_(stdv) {
    lut_.resize(static_cast<size_t>(256 * C_));
    for (int64_t c = 0; c < C_; ++c)
      for (int v = 0; v < 256; ++v)
        lut_[static_cast<size_t>(c * 256 + v)] = static_cast<float>((v / 255.0 - mean[c]) / stdv[c]);
  }

  int64_t size() const override { return static_cast<int64_t>(index_.files.size()); }
  int64_t skipped() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(skipped_.size());
  }
  const FolderIndex& index() const override { return index_; }

  Batch get(const std::vector<int64_t>& indices, int64_t epoch) const override {
    const auto B = static_cast<int64_t>(indices.size());
    for (int64_t i : indices)
      if (i < 0 || i >= size())
        throw std::out_of_range(name_ + ": sample index " + std::to_string(i) + " outside [0, " +
                                std::to_string(size()) + ")");
    Batch b;
    b.input = torch::empty({B, C_, H_, W_}, torch::kFloat);
    b.target = torch::empty({B}, torch::kLong);
    float* x = b.input.data_ptr<float>();
    int64_t* y = b.target.data_ptr<int64_t>();
    const int64_t threads = std::min(workers_, B);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(B));
    // Sample n goes to thread n % threads; its content depends only on (seed, epoch, index).
    auto work = [&](int64_t first) {
      single_threaded_aten();  // Note [Decode threads]
      for (int64_t n = first; n < B; n += threads) {
        try {
          y[n] = sample(indices[static_cast<size_t>(n)], epoch, x + n * C_ * H_ * W_);
        } catch (...) {
          errors[static_cast<size_t>(n)] = std::current_exception();
        }
      }
    };
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(threads));
    try {
      for (int64_t t = 0; t < threads; ++t) pool.emplace_back(work, t);
    } catch (...) {  // a thread that cannot start: join those that did, then report it
      for (auto& th : pool) th.join();
      throw;
    }
    for (auto& th : pool) th.join();
    for (const auto& e : errors)  // the first failing sample of the batch, whichever thread saw it
      if (e) std::rethrow_exception(e);
    return b;
  }

  std::string describe() const override {
    std::string tf = t_.random_crop ? "random_resized_crop" : "resize " + std::to_string(t_.resize) + " + centre crop";
    if (t_.flip) tf += " + flip";
    return name_ + ": " + std::to_string(size()) + " images in " + std::to_string(index_.classes.size()) +
           " classes from " + quoted(root_) + " (" + tf + " -> " + std::to_string(C_) + "x" + std::to_string(H_) +
           "x" + std::to_string(W_) + ", mean " + format_values(mean_) + ", std " + format_values(std_) + "), " +
           std::to_string(workers_) + " decode worker(s)";
  }

 private:
  // Writes sample i's C x H x W floats to `out` and returns its label.
  int64_t sample(int64_t i, int64_t epoch, float* out) const {
    int64_t src = i;
    Image im = load(i, src);
    torch::Tensor u8;  // [1, C, H, W] uint8
    bool flip = false;
    if (t_.random_crop) {
      const TrainDraw d = train_draw(im.height, im.width, t_.scale_lo, t_.scale_hi, t_.ratio_lo, t_.ratio_hi,
                                     t_.flip, t_.seed, epoch, i);
      u8 = resize_u8(crop_view(im, d.box), H_, W_);
      flip = d.flip;
    } else {
      u8 = resize_center_crop(im, t_.resize, H_, W_).unsqueeze(0);
      if (t_.flip) flip = train_draw(im.height, im.width, t_.scale_lo, t_.scale_hi, t_.ratio_lo, t_.ratio_hi, true,
                                     t_.seed, epoch, i).flip;
    }
    // The normalisation reads through strides: u8 may be channels-last.
    const auto a = u8.accessor<uint8_t, 4>();
    for (int64_t c = 0; c < C_; ++c) {
      const float* lut = lut_.data() + c * 256;
      float* o = out + c * H_ * W_;
      for (int64_t r = 0; r < H_; ++r)
        for (int64_t col = 0; col < W_; ++col)
          o[r * W_ + col] = lut[a[0][c][r][flip ? W_ - 1 - col : col]];
    }
    return index_.labels[static_cast<size_t>(src)];
  }

  // Sample i's image; with on_corrupt = skip, the first readable of i, i+1, ... (cyclic), its
  // index in `src`.
  Image load(int64_t i, int64_t& src) const {
    const int64_t n = size();
    for (int64_t k = 0; k < n; ++k) {
      src = (i + k) % n;
      const std::string& path = index_.files[static_cast<size_t>(src)];
      try {
        return decode_image(path, static_cast<int>(C_));
      } catch (const DataError& e) {
        if (!skip_) throw;
        note_skipped(path, e.what());
      }
    }
    throw DataError(name_ + ": every image under " + quoted(root_) + " is corrupt or unreadable (data.on_corrupt = skip)");
  }

  void note_skipped(const std::string& path, const std::string& why) const {
    int64_t count = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!skipped_.insert(path).second) return;
      count = static_cast<int64_t>(skipped_.size());
    }
    lt::log::warn(name_ + ": skipping " + why + " (data.on_corrupt = skip; " + std::to_string(count) +
                  " image(s) skipped so far; the next readable image takes its place)");
  }

  std::string name_, root_;
  FolderIndex index_;
  Transform t_;
  int64_t C_, H_, W_;
  bool skip_;
  int64_t workers_;
  std::vector<double> mean_, std_;
  std::vector<float> lut_;  // C x 256: (v / 255 - mean) / std
  mutable std::mutex mu_;
  mutable std::set<std::string> skipped_;
};

// "model.num_classes = 7" or "the model's classes = 7".
std::string model_value(const std::string& key, const char* what, int64_t v) {
  return (key.empty() ? std::string("the model's ") + what : key) + " = " + std::to_string(v);
}

}  // namespace

torch::Tensor resized_crop(const Image& image, const CropBox& box, int64_t out_h, int64_t out_w, bool flip) {
  check_box(image, box);
  torch::Tensor t = resize_u8(crop_view(image, box), out_h, out_w).squeeze(0);
  if (flip) t = t.flip({2});
  return t.contiguous();
}

torch::Tensor resize_center_crop(const Image& image, int64_t resize, int64_t out_h, int64_t out_w) {
  const EvalGeometry g = eval_geometry(image.height, image.width, resize, out_h, out_w);
  if (g.box.top < 0 || g.box.left < 0 || g.box.top + out_h > g.resized_height || g.box.left + out_w > g.resized_width)
    throw std::invalid_argument("resize_center_crop: resize " + std::to_string(resize) + " is smaller than the crop");
  const CropBox whole{0, 0, image.height, image.width};
  torch::Tensor r = resize_u8(crop_view(image, whole), g.resized_height, g.resized_width);
  return r.squeeze(0).narrow(1, g.box.top, out_h).narrow(2, g.box.left, out_w).contiguous();
}

// The comma-separated items of `text`, each without surrounding blanks.
static std::vector<std::string> comma_items(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    items.push_back(b == std::string::npos ? "" : item.substr(b, e - b + 1));
  }
  return items;
}

std::vector<double> channel_values(const std::string& text, int64_t channels, bool is_std, const std::string& key) {
  if (text.empty()) {
    if (channels == 3) return is_std ? std::vector<double>{0.229, 0.224, 0.225} : std::vector<double>{0.485, 0.456, 0.406};
    return std::vector<double>(static_cast<size_t>(channels), is_std ? 0.226 : 0.449);
  }
  std::vector<double> v;
  for (const std::string& s : comma_items(text)) {
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || errno != 0 || !std::isfinite(d))
      throw ConfigError(key + " = \"" + text + "\": " + quoted(s) + " is not a number (give comma-separated numbers, e.g. \"" +
                        (is_std ? "0.229, 0.224, 0.225" : "0.485, 0.456, 0.406") + "\")");
    if (is_std && d <= 0) throw ConfigError(key + " = \"" + text + "\": every std must be > 0");
    v.push_back(d);
  }
  if (v.size() == 1) return std::vector<double>(static_cast<size_t>(channels), v[0]);
  if (static_cast<int64_t>(v.size()) != channels)
    throw ConfigError(key + " = \"" + text + "\" gives " + std::to_string(v.size()) + " values; the model takes " +
                      std::to_string(channels) + " channel(s) (give one value or " + std::to_string(channels) + ")");
  return v;
}

std::pair<double, double> range_values(const std::string& text, bool at_most_one, const std::string& key) {
  auto bad = [&](const std::string& why) {
    return ConfigError(key + " = \"" + text + "\": " + why + " (give \"lo, hi\", numbers or fractions a/b, e.g. \"" +
                       (at_most_one ? "0.08, 1" : "3/4, 4/3") + "\")");
  };
  std::vector<double> v;
  for (const std::string& s : comma_items(text)) {
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '/') {
      const char* den = end + 1;
      const double q = std::strtod(den, &end);
      if (end == den || q == 0) throw bad(quoted(s) + " is not a number or a fraction");
      d /= q;
    }
    if (s.empty() || *end != '\0' || !std::isfinite(d)) throw bad(quoted(s) + " is not a number or a fraction");
    v.push_back(d);
  }
  if (v.size() != 2) throw bad("two values are needed, " + std::to_string(v.size()) + " given");
  if (!(v[0] > 0) || v[0] > v[1]) throw bad("needs 0 < lo <= hi");
  if (at_most_one && v[1] > 1) throw bad("a share of the area is at most 1");
  return {v[0], v[1]};
}

Datasets make_image_folder(const ImageFolderConfig& c, const lt::InputContract& m) {
  if (m.input != Input::kImages || m.target != Target::kClassLabels)
    throw ConfigError("data.kind = 'image_folder' gives images with class labels; the model takes " + m.describe());
  if (m.channels != 1 && m.channels != 3)
    throw ConfigError(model_value(m.channels_key, "channels", m.channels) +
                      ", but image_folder gives 1 (gray) or 3 (RGB) channels");
  const auto scale = range_values(c.scale, true, "data.scale");
  const auto ratio = range_values(c.ratio, false, "data.ratio");
  const int64_t longest = std::max(m.height, m.width);
  const int64_t resize =
      c.resize > 0 ? c.resize : static_cast<int64_t>(std::nearbyint(static_cast<double>(longest) / 0.875));
  if (resize < longest)
    throw ConfigError("data.resize = " + std::to_string(resize) + " is smaller than the model's image (" +
                      std::to_string(m.height) + "x" + std::to_string(m.width) + "): the centre crop needs >= " +
                      std::to_string(longest));
  const auto mean = channel_values(c.mean, m.channels, false, "data.mean");
  const auto stdv = channel_values(c.std_dev, m.channels, true, "data.std");

  Transform train;
  train.random_crop = c.train_transform == "random_resized_crop";
  train.flip = c.hflip;
  train.scale_lo = scale.first;
  train.scale_hi = scale.second;
  train.ratio_lo = ratio.first;
  train.ratio_hi = ratio.second;
  train.resize = resize;
  train.seed = c.seed;
  Transform eval = train;
  eval.random_crop = false;
  eval.flip = false;

  const bool skip = c.on_corrupt == "skip";
  auto open = [&](const std::string& name, const std::string& root, const std::string& key, const Transform& t) {
    FolderIndex idx = scan_image_folder(root, key);
    if (static_cast<int64_t>(idx.classes.size()) != m.num_classes)
      throw ConfigError(model_value(m.num_classes_key, "classes", m.num_classes) + ", but " + key + " = " +
                        quoted(root) + " has " + std::to_string(idx.classes.size()) + " class folders" +
                        (m.num_classes_key.empty() ? "" : " (set " + m.num_classes_key + " = " +
                                                               std::to_string(idx.classes.size()) + ")"));
    return std::make_shared<FolderDataset>(name, root, std::move(idx), t, m.channels, m.height, m.width, mean, stdv,
                                           skip, c.workers);
  };
  Datasets out;
  auto tr = open("image_folder train", c.train, "data.train", train);
  out.train = tr;
  if (!c.eval.empty()) {
    auto ev = open("image_folder eval", c.eval, "data.eval", eval);
    if (ev->index().classes != tr->index().classes)
      throw DataError("image folders " + quoted(c.train) + " and " + quoted(c.eval) +
                      " have different class folders (a label is the index of its class name in sorted order)");
    out.eval = ev;
  }
  return out;
}

}  // namespace lt::data
