#pragma once
// Image folders: torchvision ImageFolder's layout, root/<class>/<image>, of JPEG and PNG files
// decoded with libjpeg-turbo and libpng, and the standard transforms.
//
//  - classes are the sorted names of root's subfolders (byte order), a class's label its index
//    in that order; the samples are every class's .jpg/.jpeg/.png files (case-insensitive
//    extension), sorted by name, class after class: sample i is the same file on every run.
//  - training transform "random_resized_crop": torchvision's RandomResizedCrop parameters
//    (crop_params below: 10 tries of an area share from `scale` and a log-uniform aspect ratio
//    from `ratio`, then the centre-crop fallback), the crop resized to the model's HxW, then a
//    horizontal flip with probability 1/2 when hflip is set; scale and ratio are given as
//    strings "lo, hi" (numbers or fractions a/b: "3/4, 4/3" is exactly torchvision's default). "none": the eval transform (and
//    the flip when hflip is set).
//  - eval transform: the shorter side resized to `resize` (torchvision's Resize(int): the
//    longer side int(resize * long / short)), then the centre HxW crop (torchvision's
//    CenterCrop: top = round((h - H) / 2)).
//  - every resize is LibTorch's bilinear interpolate with antialias = true, align_corners =
//    false on the uint8 image, rounded to uint8, as torchvision.transforms.v2.functional.resize /
//    resized_crop do on a uint8 tensor. Tolerance: the output equals torchvision's
//    resized_crop(uint8 tensor, top, left, h, w, size, antialias=True) within 1 uint8 level per
//    pixel (exactly equal where torchvision also takes the native uint8 kernel, on AVX2 CPUs;
//    tests/python/test_image_transforms.py holds it). A crop already of the output size is
//    copied, not resampled.
//  - then float: (x / 255 - mean[c]) / std[c].
// Every random choice of sample i in epoch e is drawn from mt19937_64(mix_seed(seed, stream,
// e, i)) (data/src/rng.h draws), so a batch is the same whichever thread or rank decodes it,
// and resume is exact.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "leantrain/data/dataset.h"
#include "leantrain/data/image_files.h"
#include "leantrain/runtime/contract.h"

namespace lt::data {

/// The options of the image_folder kind.
struct ImageFolderConfig {
  std::string train;                                // root of the training folder
  std::string eval;                                 // root of the eval folder; empty: no eval
  std::string train_transform = "random_resized_crop";  // random_resized_crop | none
  std::string scale = "0.08, 1";                    // RandomResizedCrop's area share: "lo, hi"
  std::string ratio = "3/4, 4/3";                   // its aspect ratio w/h: "lo, hi" (a/b allowed)
  bool hflip = true;                                // training: flip with probability 1/2
  int64_t resize = 0;                               // eval: shorter side; 0: round(max(H, W) / 0.875)
  std::string mean;                                 // "0.485, 0.456, 0.406"; empty: the default for the channels
  std::string std_dev;                              // option "std", likewise
  std::string on_corrupt = "error";                 // error | skip
  int64_t workers = 2;                              // decode threads per batch
  uint64_t seed = 1234;
};

/// uint8 [C, out_h, out_w]: `box` of `image` resized (bilinear, antialias, align_corners false,
/// rounded), flipped horizontally when `flip`. torchvision's resized_crop(+hflip) on a uint8
/// tensor, within the tolerance above.
torch::Tensor resized_crop(const Image& image, const CropBox& box, int64_t out_h, int64_t out_w, bool flip = false);
/// uint8 [C, out_h, out_w]: the eval transform.
torch::Tensor resize_center_crop(const Image& image, int64_t resize, int64_t out_h, int64_t out_w);

/// An image_folder split as a Dataset, with what skipping found.
class ImageFolderDataset : public Dataset {
 public:
  /// Images skipped as corrupt so far (on_corrupt = skip): each file counted once.
  virtual int64_t skipped() const = 0;
  virtual const FolderIndex& index() const = 0;
};

/// The train (and eval, when cfg.eval is set) image folders for a model taking images [B,C,H,W]
/// with C = 1 or 3 and class labels; the folder's classes must number the model's. Throws
/// lt::ConfigError for another contract or bad options (naming the key), lt::DataError for a
/// bad folder; a bad image is a DataError at get() (naming the file) unless on_corrupt = skip:
/// then sample i is replaced by the next readable sample (i+1, i+2, ... cyclically, the same
/// every time), logged and counted.
Datasets make_image_folder(const ImageFolderConfig& cfg, const lt::InputContract& model);

/// The per-channel mean or std an option gives for `channels`: empty -> ImageNet's (3
/// channels: mean 0.485, 0.456, 0.406, std 0.229, 0.224, 0.225; 1 channel: their averages,
/// 0.449 and 0.226); one value -> every channel; else exactly `channels` comma-separated values.
/// Throws lt::ConfigError naming `key`.
std::vector<double> channel_values(const std::string& text, int64_t channels, bool is_std, const std::string& key);

/// A "lo, hi" range option (data.scale, data.ratio): numbers or fractions a/b, 0 < lo <= hi
/// (and hi <= 1 when at_most_one). Throws lt::ConfigError naming `key`.
std::pair<double, double> range_values(const std::string& text, bool at_most_one, const std::string& key);

}  // namespace lt::data
