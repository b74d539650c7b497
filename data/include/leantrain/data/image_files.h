#pragma once
// Image files, torch-free: JPEG/PNG decoding (libjpeg-turbo, libpng), ImageFolder's layout, and
// the geometry of the transforms (the crop boxes), for the image_folder kind (image_folder.h).
#include <cstdint>
#include <string>
#include <vector>

namespace lt::data {

/// A decoded image: height x width x channels (1 or 3) uint8, row-major, interleaved.
struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

/// Decodes a JPEG or PNG file (by its signature, not its name) to 8-bit gray or RGB: PNG
/// palettes are expanded, 16-bit samples reduced to 8, alpha dropped; CMYK JPEGs are refused.
/// `channels` 1 or 3 converts to it (gray -> RGB repeats the value; RGB -> gray is PIL's
/// convert("L"): (19595 R + 38470 G + 7471 B + 2^15) >> 16); 0 keeps the file's.
/// Throws lt::DataError naming the file when it cannot be read, is neither JPEG nor PNG, or
/// is corrupt or truncated (libjpeg's and libpng's errors come back as exceptions, never exit()).
Image decode_image(const std::string& path, int channels = 0);

/// The samples of a folder: the sorted class names and, per sample, its file and label.
struct FolderIndex {
  std::vector<std::string> classes;
  std::vector<std::string> files;
  std::vector<int64_t> labels;
};
/// Scans root/<class>/<image> (`key` names the option in messages). Throws lt::ConfigError when
/// root is missing or not a directory, lt::DataError for a root without class folders or a
/// class folder without images (naming it).
FolderIndex scan_image_folder(const std::string& root, const std::string& key);

/// A crop box in pixels of the source image.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox& o) const {
    return top == o.top && left == o.left && height == o.height && width == o.width;
  }
};

/// The random choices of one training sample: torchvision's RandomResizedCrop.get_params for an
/// image of height x width, and the flip.
struct TrainDraw {
  CropBox box;
  bool flip = false;
};
/// RandomResizedCrop's parameters on its scale [scale_lo, scale_hi] and ratio [ratio_lo,
/// ratio_hi] (torchvision's algorithm: 10 tries, each an area share uniform in scale and an aspect
/// ratio exp(uniform(log ratio)), w = round(sqrt(area * ratio)), h = round(sqrt(area / ratio))
/// rounding half to even as Python does, kept when it fits, at a uniform position; else the
/// largest centre crop with the ratio clamped into range), then flip = uniform < 1/2 when hflip.
/// Drawn from mt19937_64(mix_seed({seed, stream, epoch, index})): a pure function of the arguments.
TrainDraw train_draw(int64_t height, int64_t width, double scale_lo, double scale_hi, double ratio_lo,
                     double ratio_hi, bool hflip, uint64_t seed, int64_t epoch, int64_t index);

/// The eval transform's box (in the resized image) and the resized size: resize the shorter
/// side to `resize`, centre crop out_h x out_w.
struct EvalGeometry {
  int64_t resized_height = 0, resized_width = 0;
  CropBox box;
};
EvalGeometry eval_geometry(int64_t height, int64_t width, int64_t resize, int64_t out_h, int64_t out_w);

}  // namespace lt::data
