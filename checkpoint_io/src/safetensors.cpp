// safetensors reader and writer (Note [Never trust a safetensors file] in safetensors.h).
#include "leantrain/checkpoint_io/safetensors.h"

#include <torch/torch.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/files.h"

namespace lt::checkpoint_io {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so is this reader");

struct DType {
  const char* name;
  torch::ScalarType type;
  uint64_t size;
};

const std::vector<DType>& dtypes() {
  static const std::vector<DType> d = {
      {"F64", torch::kDouble, 8},   {"F32", torch::kFloat, 4},    {"F16", torch::kHalf, 2},
      {"BF16", torch::kBFloat16, 2}, {"I64", torch::kLong, 8},    {"I32", torch::kInt, 4},
      {"I16", torch::kShort, 2},     {"I8", torch::kChar, 1},     {"U8", torch::kByte, 1},
      {"BOOL", torch::kBool, 1},     {"F8_E4M3", torch::kFloat8_e4m3fn, 1},
      {"F8_E5M2", torch::kFloat8_e5m2, 1}};
  return d;
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw DataError(path + ": " + what);
}

[[noreturn]] void bad_tensor(const std::string& path, const std::string& name, const std::string& what) {
  throw DataError(path + ": tensor '" + name + "': " + what);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads exactly n bytes at offset; false on a short read or an error.
bool pread_all(int fd, void* buf, uint64_t n, uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1ULL << 30));
    const ssize_t r = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

struct Entry {
  std::string name;
  const DType* dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

std::string dtype_list() {
  std::string s;
  for (const auto& d : dtypes()) s += (s.empty() ? "" : " ") + std::string(d.name);
  return s;
}

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v, uint64_t data_size) {
  if (!v.is_object()) bad_tensor(path, name, "header entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) bad_tensor(path, name, std::string("header entry has no \"") + key + "\"");
  Entry e{name, nullptr, {}, 0, 0};
  const auto& dt = v.at("dtype");
  if (!dt.is_string()) bad_tensor(path, name, "dtype is not a string");
  const std::string dts = dt.get<std::string>();
  for (const auto& d : dtypes())
    if (dts == d.name) e.dtype = &d;
  if (e.dtype == nullptr) bad_tensor(path, name, "unsupported dtype \"" + dts + "\" (supported: " + dtype_list() + ")");
  const auto& shape = v.at("shape");
  if (!shape.is_array()) bad_tensor(path, name, "shape is not an array");
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : shape) {
    if (!d.is_number_unsigned()) bad_tensor(path, name, "shape " + shape.dump() + " has a dimension that is not a non-negative integer");
    const uint64_t n = d.get<uint64_t>();
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    else if (n != 0 && numel > std::numeric_limits<uint64_t>::max() / n) overflow = true;
    else numel *= n;
    e.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(n, std::numeric_limits<int64_t>::max())));
  }
  const auto& off = v.at("data_offsets");
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    bad_tensor(path, name, "data_offsets " + off.dump() + " is not a pair of non-negative integers");
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end)
    bad_tensor(path, name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] ends before it begins");
  if (e.end > data_size)
    bad_tensor(path, name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                               "] reach past the data (" + std::to_string(data_size) +
                               " bytes after the header): truncated or lying header");
  if (overflow || numel > std::numeric_limits<uint64_t>::max() / e.dtype->size)
    bad_tensor(path, name, "shape " + shape.dump() + " overflows");
  const uint64_t bytes = numel * e.dtype->size;
  if (e.end - e.begin != bytes)
    bad_tensor(path, name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] hold " +
                               std::to_string(e.end - e.begin) + " bytes, but " + dts + " " + shape.dump() + " needs " +
                               std::to_string(bytes));
  return e;
}

}  // namespace

std::string safetensors_dtype_name(torch::ScalarType t) {
  for (const auto& d : dtypes())
    if (d.type == t) return d.name;
  return "";
}

SafetensorsFile read_safetensors(const std::string& path) {
  if (files::is_directory(path)) bad(path, "is a directory, not a safetensors file");
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) bad(path, std::string("cannot open safetensors file: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) bad(path, std::string("cannot stat: ") + std::strerror(errno));
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) bad(path, "truncated safetensors file (" + std::to_string(file_size) + " bytes, no 8-byte header length)");
  unsigned char len_bytes[8];
  if (!pread_all(fd.get(), len_bytes, 8, 0)) bad(path, "cannot read the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kSafetensorsMaxHeader)
    bad(path, "safetensors header of " + std::to_string(header_len) + " bytes is over the cap of " +
                  std::to_string(kSafetensorsMaxHeader) + " bytes: not a safetensors file, or damaged");
  if (header_len > file_size - 8)
    bad(path, "truncated safetensors file: the header says " + std::to_string(header_len) + " bytes of JSON, the file has " +
                  std::to_string(file_size - 8) + " after the length");
  std::string header(static_cast<size_t>(header_len), '\0');
  if (!pread_all(fd.get(), header.data(), header_len, 8)) bad(path, "cannot read the header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    bad(path, std::string("safetensors header is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) bad(path, "safetensors header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) bad(path, "__metadata__ is not a JSON object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) bad(path, "__metadata__ \"" + k + "\" is not a string");
        out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    if (name.empty()) bad(path, "a tensor has an empty name");
    entries.push_back(parse_entry(path, name, v, data_size));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const Entry* last = nullptr;  // the non-empty entry reaching furthest so far
  for (const auto& e : entries) {
    if (e.begin == e.end) continue;
    if (last != nullptr && e.begin < last->end)
      bad(path, "tensors '" + last->name + "' [" + std::to_string(last->begin) + ", " + std::to_string(last->end) +
                    ") and '" + e.name + "' [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                    ") overlap: lying header");
    if (last == nullptr || e.end > last->end) last = &e;
  }
  for (const auto& e : entries) {
    auto t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype->type));
    if (e.end > e.begin && !pread_all(fd.get(), t.data_ptr(), e.end - e.begin, data_start + e.begin))
      bad_tensor(path, e.name, "cannot read its bytes (file changed or truncated while reading)");
    out.tensors.push_back({e.name, t});
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<torch::Tensor> data;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& nt : tensors) {
    if (nt.name.empty() || nt.name == "__metadata__")
      throw DataError(path + ": tensor name '" + nt.name + "' cannot be written to safetensors");
    if (!names.insert(nt.name).second) throw DataError(path + ": tensor '" + nt.name + "' given twice");
    const std::string dt = safetensors_dtype_name(nt.tensor.scalar_type());
    if (dt.empty())
      throw DataError(path + ": tensor '" + nt.name + "': dtype " + std::string(c10::toString(nt.tensor.scalar_type())) +
                      " has no safetensors name");
    auto t = nt.tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t n = static_cast<uint64_t>(t.nbytes());
    header[nt.name] = {{"dtype", dt}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    data.push_back(t);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  auto fail = [&](const std::string& what) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw StorageError(path + ": " + what + " (" + err + "); nothing written");
  };
  {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      const std::string err = std::strerror(errno);
      throw StorageError(path + ": cannot create " + tmp + " (" + err + "); nothing written");
    }
    Fd guard(fd);
    auto write_all = [&](const void* buf, uint64_t n) {
      const auto* p = static_cast<const char*>(buf);
      while (n > 0) {
        const ssize_t w = ::write(fd, p, static_cast<size_t>(std::min<uint64_t>(n, 1ULL << 30)));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail("cannot write safetensors data");
        p += w;
        n -= static_cast<uint64_t>(w);
      }
    };
    unsigned char len[8];
    uint64_t hl = text.size();
    for (int i = 0; i < 8; ++i, hl >>= 8) len[i] = static_cast<unsigned char>(hl & 0xff);
    write_all(len, 8);
    write_all(text.data(), text.size());
    for (const auto& t : data) write_all(t.data_ptr(), static_cast<uint64_t>(t.nbytes()));
  }
  try {
    files::commit_file(tmp, path);
  } catch (const std::exception& e) {
    ::unlink(tmp.c_str());
    throw StorageError(path + ": " + e.what() + "; nothing written");
  }
}

}  // namespace lt::checkpoint_io
