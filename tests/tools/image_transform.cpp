// Test helper (not a test): the image_folder transforms of a few images, for
// tests/python/test_image_transforms.py to redo with torchvision on the same crop boxes.
//
//   leantrain_image_transform OUT_DIR SIZE SEED EPOCH IMAGE...
//
// Image k (sample index k) is decoded as its file is (gray or RGB) and written as
// OUT_DIR/<k>_decoded.bin (H x W x C uint8); its training transform (RandomResizedCrop with
// torchvision's default scale and ratio, flip) as <k>_train.bin and its eval transform (resize
// round(SIZE / 0.875), centre crop) as <k>_eval.bin, both C x SIZE x SIZE uint8. One JSON line
// per image on stdout: the file, the image's shape, the crop box, the flip and the resize.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "leantrain/data/image_folder.h"

namespace {

void write(const std::string& path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, bytes, f) != bytes) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s OUT_DIR SIZE SEED EPOCH IMAGE...\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const int64_t size = std::atoll(argv[2]);
  const auto seed = static_cast<uint64_t>(std::strtoull(argv[3], nullptr, 10));
  const int64_t epoch = std::atoll(argv[4]);
  const auto resize = static_cast<int64_t>(std::nearbyint(static_cast<double>(size) / 0.875));
  try {
    for (int k = 0; k + 5 < argc; ++k) {
      const std::string file = argv[k + 5];
      const auto im = lt::data::decode_image(file);
      const std::string base = out + "/" + std::to_string(k);
      write(base + "_decoded.bin", im.pixels.data(), im.pixels.size());
      const auto d = lt::data::train_draw(im.height, im.width, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, true, seed, epoch, k);
      const auto train = lt::data::resized_crop(im, d.box, size, size, d.flip);
      write(base + "_train.bin", train.data_ptr<uint8_t>(), static_cast<size_t>(train.numel()));
      const auto eval = lt::data::resize_center_crop(im, resize, size, size);
      write(base + "_eval.bin", eval.data_ptr<uint8_t>(), static_cast<size_t>(eval.numel()));
      std::printf(
          "{\"index\": %d, \"file\": \"%s\", \"height\": %lld, \"width\": %lld, \"channels\": %lld, \"top\": %lld, "
          "\"left\": %lld, \"h\": %lld, \"w\": %lld, \"flip\": %s, \"resize\": %lld}\n",
          k, file.c_str(), (long long)im.height, (long long)im.width, (long long)im.channels, (long long)d.box.top,
          (long long)d.box.left, (long long)d.box.height, (long long)d.box.width, d.flip ? "true" : "false",
          (long long)resize);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
