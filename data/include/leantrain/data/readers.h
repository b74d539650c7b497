#pragma once
// Raw file readers for the data layer. Torch-free on purpose: they are the slow-to-debug,
// fast-to-compile part, and tools and tests can use them without LibTorch headers.
#include <cstdint>
#include <string>
#include <vector>

namespace lt::data {

/// An IDX3 image file (Fashion-MNIST layout): `count` images of rows x cols bytes, row-major,
/// image after image. Kept as raw bytes so normalization happens once, when a batch is built.
struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols
};

/// An IDX1 label file: one byte per sample.
struct IdxLabels {
  int64_t count = 0;
  std::vector<uint8_t> labels;
};

/// Reads an IDX image file, gzip-compressed or not (zlib reads both). If `path` is missing, the
/// same name with ".gz" added or removed is tried, so datasets unpacked by hand work too.
/// Throws lt::DataError naming the file on a missing file, a wrong magic (0x00000803), a header
/// whose sizes disagree with the file length, or a corrupt/truncated gzip stream.
IdxImages read_idx_images(const std::string& path);

/// As read_idx_images, for a label file (magic 0x00000801).
IdxLabels read_idx_labels(const std::string& path);

/// The raw bytes of a text corpus. `path` is a file, or a directory whose regular files are
/// concatenated in sorted name order (deterministic across machines) — skipping *.dat and *.u8
/// (the fortune package's index and UTF-8 duplicates) and hidden files. Throws lt::DataError
/// naming the path when it is missing, unreadable or yields no bytes.
std::string read_text_corpus(const std::string& path);

}  // namespace lt::data
