#pragma once
// Test helper: writes images and IDX files (PNG with libpng, JPEG with libjpeg-turbo), and
// Fashion-MNIST out as an image folder root/<class>/<index>.png|.jpg.
#include <jpeglib.h>
#include <png.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace lt_test {

/// Writes 8-bit gray (channels 1) or RGB (3) pixels, row-major interleaved.
inline void write_png(const std::string& path, const uint8_t* px, int h, int w, int channels) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(w);
  img.height = static_cast<png_uint_32>(h);
  img.format = channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  if (!png_image_write_to_file(&img, path.c_str(), 0, px, 0, nullptr))
    throw std::runtime_error("write_png " + path + ": " + img.message);
}

inline void write_jpeg(const std::string& path, const uint8_t* px, int h, int w, int channels, int quality = 95) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("write_jpeg: cannot open " + path);
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = static_cast<JDIMENSION>(w);
  c.image_height = static_cast<JDIMENSION>(h);
  c.input_components = channels;
  c.in_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(px) + static_cast<size_t>(c.next_scanline) * w * channels;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::fclose(f);
}

inline void write_be32(FILE* f, uint32_t v) {
  const uint8_t b[4] = {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
  std::fwrite(b, 1, 4, f);
}

/// Uncompressed IDX files (images: magic 0x803, count, rows, cols; labels: 0x801, count).
inline void write_idx(const std::string& images_path, const std::string& labels_path,
                      const std::vector<uint8_t>& pixels, const std::vector<uint8_t>& labels, int rows, int cols) {
  FILE* f = std::fopen(images_path.c_str(), "wb");
  write_be32(f, 0x803);
  write_be32(f, static_cast<uint32_t>(labels.size()));
  write_be32(f, static_cast<uint32_t>(rows));
  write_be32(f, static_cast<uint32_t>(cols));
  std::fwrite(pixels.data(), 1, pixels.size(), f);
  std::fclose(f);
  f = std::fopen(labels_path.c_str(), "wb");
  write_be32(f, 0x801);
  write_be32(f, static_cast<uint32_t>(labels.size()));
  std::fwrite(labels.data(), 1, labels.size(), f);
  std::fclose(f);
}

inline void make_dir(const std::string& p) { ::mkdir(p.c_str(), 0755); }

/// The class folder names used for Fashion-MNIST's labels 0..9: "c0".."c9" (sorted = label order).
inline std::string class_name(int label) { return "c" + std::to_string(label); }

/// Sample `i`'s file name: zero-padded, so name order = index order within a class.
inline std::string sample_name(int64_t i, const char* ext) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%06lld.%s", static_cast<long long>(i), ext);
  return buf;
}

/// Writes samples [0, n) of 28x28 gray images as root/c<label>/<i>.<ext> (PNG or JPEG).
/// Returns the folder's sample order (class-major, then index): order[k] = IDX index of folder sample k.
inline std::vector<int64_t> write_folder(const std::string& root, const uint8_t* pixels, const uint8_t* labels,
                                         int64_t n, bool jpeg) {
  make_dir(root);
  for (int c = 0; c < 10; ++c) make_dir(root + "/" + class_name(c));
  std::vector<int64_t> order;
  for (int c = 0; c < 10; ++c)
    for (int64_t i = 0; i < n; ++i)
      if (labels[i] == c) order.push_back(i);
  for (int64_t i = 0; i < n; ++i) {
    const std::string path = root + "/" + class_name(labels[i]) + "/" + sample_name(i, jpeg ? "jpg" : "png");
    if (jpeg)
      write_jpeg(path, pixels + i * 784, 28, 28, 1);
    else
      write_png(path, pixels + i * 784, 28, 28, 1);
  }
  return order;
}

}  // namespace lt_test
