// IDX (MNIST-format) readers. Torch-free: see readers.h.
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "leantrain/data/readers.h"
#include "leantrain/runtime/errors.h"

namespace lt::data {
namespace {

constexpr uint32_t kMagicImages = 0x00000803;
constexpr uint32_t kMagicLabels = 0x00000801;

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The file to open for `path`: itself, else the name with ".gz" removed or added.
std::string resolve(const std::string& path) {
  if (is_file(path)) return path;
  if (ends_with(path, ".gz")) {
    std::string plain = path.substr(0, path.size() - 3);
    if (is_file(plain)) return plain;
  } else if (is_file(path + ".gz")) {
    return path + ".gz";
  }
  throw lt::DataError("data file '" + path + "' does not exist" +
                      (ends_with(path, ".gz") ? " (nor without .gz)" : " (nor with .gz)"));
}

// Whole file, decompressed when gzip (gzread passes plain files through unchanged).
std::vector<uint8_t> read_all(const std::string& file) {
  gzFile f = gzopen(file.c_str(), "rb");
  if (f == nullptr) throw lt::DataError("cannot open data file '" + file + "': " + std::strerror(errno));
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string msg = gzerror(f, &code);
      gzclose(f);
      throw lt::DataError("data file '" + file + "' is corrupt: " + msg);
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  // A truncated gzip stream ends with Z_BUF_ERROR ("unexpected end of file") rather than a failed read.
  int code = 0;
  std::string msg = gzerror(f, &code);
  gzclose(f);
  if (code != Z_OK && code != Z_STREAM_END) {
    throw lt::DataError("data file '" + file + "' is corrupt or truncated: " + msg);
  }
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t off) {
  return (uint32_t{b[off]} << 24) | (uint32_t{b[off + 1]} << 16) | (uint32_t{b[off + 2]} << 8) |
         uint32_t{b[off + 3]};
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Checks magic and that the header's sizes account for exactly the payload; returns the dims.
std::vector<int64_t> parse_header(const std::vector<uint8_t>& bytes, const std::string& file,
                                  uint32_t magic, int ndims, const char* what) {
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (bytes.size() < header) {
    throw lt::DataError("data file '" + file + "' is too short for an IDX " + what + " header (" +
                        std::to_string(bytes.size()) + " bytes, need " + std::to_string(header) + ")");
  }
  const uint32_t got = be32(bytes, 0);
  if (got != magic) {
    throw lt::DataError("data file '" + file + "' has magic " + hex(got) + ", expected " + hex(magic) +
                        " (IDX " + what + ")");
  }
  std::vector<int64_t> dims;
  uint64_t payload = 1;
  for (int i = 0; i < ndims; ++i) {
    dims.push_back(be32(bytes, 4 + 4 * static_cast<size_t>(i)));
    payload *= static_cast<uint64_t>(dims.back());  // each < 2^32, product of <= 3 fits in practice
  }
  const uint64_t have = bytes.size() - header;
  if (have != payload) {
    std::string shape;
    for (size_t i = 0; i < dims.size(); ++i) shape += (i ? "x" : "") + std::to_string(dims[i]);
    throw lt::DataError("data file '" + file + "' header says " + shape + " = " + std::to_string(payload) +
                        " bytes of data but the file holds " + std::to_string(have) +
                        (have < payload ? " (truncated?)" : " (trailing bytes)"));
  }
  return dims;
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  const std::string file = resolve(path);
  std::vector<uint8_t> bytes = read_all(file);
  const std::vector<int64_t> d = parse_header(bytes, file, kMagicImages, 3, "images");
  IdxImages out;
  out.count = d[0];
  out.rows = d[1];
  out.cols = d[2];
  out.pixels.assign(bytes.begin() + 16, bytes.end());
  return out;
}

IdxLabels read_idx_labels(const std::string& path) {
  const std::string file = resolve(path);
  std::vector<uint8_t> bytes = read_all(file);
  const std::vector<int64_t> d = parse_header(bytes, file, kMagicLabels, 1, "labels");
  IdxLabels out;
  out.count = d[0];
  out.labels.assign(bytes.begin() + 8, bytes.end());
  return out;
}

}  // namespace lt::data
