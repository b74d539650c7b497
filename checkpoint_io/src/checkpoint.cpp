#include "leantrain/checkpoint_io/checkpoint.h"

#include <torch/torch.h>

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <set>
#include <sstream>

#include "leantrain/checkpoint_io/crc32.h"
#include "leantrain/runtime/files.h"

namespace lt::checkpoint_io {
namespace {

// Note [Checkpoint integrity]
// The file uses HDF5's latest format (superblock v3, object header v2): every metadata block
// carries a checksum, HDF5 refuses a file whose end-of-file is short of its allocated end
// (truncation), and attributes are fixed-length strings and numbers stored inside checksummed
// object headers (variable-length strings would live in the global heap, which is not
// checksummed). Raw data is not checksummed by HDF5 unless chunked with a filter, so each
// dataset carries the CRC-32 of its bytes, computed on a second thread while the data is
// written (the write then costs what fwrite costs). read_checkpoint verifies all of it before
// it returns anything.

// --- small RAII handle over hid_t -------------------------------------------------------

class H {
 public:
  H() = default;
  H(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H(const H&) = delete;
  H& operator=(const H&) = delete;
  H(H&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H& operator=(H&& o) noexcept {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = -1;
    return *this;
  }
  ~H() { reset(); }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  /// Closes now and reports whether the close succeeded (a file's close flushes).
  bool close() {
    if (id_ < 0) return true;
    const bool good = close_(id_) >= 0;
    id_ = -1;
    return good;
  }

 private:
  void reset() {
    if (id_ >= 0) close_(id_);
    id_ = -1;
  }
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// The two innermost descriptions say what failed (a failed write's carries the errno text);
// the dozen above them only retell it layer by layer.
herr_t collect_error(unsigned n, const H5E_error2_t* e, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (n < 2 && e->desc != nullptr && *e->desc != '\0') {
    const std::string d = e->desc;
    if (s->find(d) == std::string::npos) *s += (s->empty() ? "" : "; ") + d;
  }
  return 0;
}

/// The innermost HDF5 error descriptions (e.g. the errno text of a failed write).
std::string hdf5_error() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &s);
  H5Eclear2(H5E_DEFAULT);
  return s.empty() ? "HDF5 error" : s;
}

// Note [A failed HDF5 write]
// HDF5 1.10 cannot close a file whose write failed (disk full, RLIMIT_FSIZE): H5Fclose
// returns an error and leaves the file half-closed, and any later close of it (a second
// H5Fclose, or the library's own atexit clean-up) dereferences freed state and crashes.
// So the library's atexit clean-up is switched off before HDF5 is first used (every file
// is closed explicitly anyway: a clean exit leaves none open), and a file whose close fails
// is abandoned: its descriptor is closed by hand so the space of the removed temporary file
// comes back, and HDF5 never touches the handle again.
void quiet_hdf5() {
  static const bool once = [] {
    H5dont_atexit();  // must precede the library's initialisation
    H5open();
    return true;
  }();
  (void)once;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

/// Closes a file handle; when the close fails (see Note [A failed HDF5 write]) closes its
/// descriptor by hand and forgets the handle. Returns whether HDF5's close succeeded.
bool close_or_abandon(H& file) {
  if (!file.ok()) return true;
  int* fd = nullptr;
  const bool have_fd = H5Fget_vfd_handle(file.get(), H5P_DEFAULT, reinterpret_cast<void**>(&fd)) >= 0 &&
                       fd != nullptr;
  const int saved_fd = have_fd ? *fd : -1;
  if (file.close()) return true;
  if (saved_fd >= 0) ::close(saved_fd);
  return false;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CheckpointError(path + ": " + what);
}

H check(hid_t id, herr_t (*close)(hid_t), const std::string& path, const std::string& what) {
  if (id < 0) fail(path, what + " (" + hdf5_error() + ")");
  return H(id, close);
}

void check(herr_t rc, const std::string& path, const std::string& what) {
  if (rc < 0) fail(path, what + " (" + hdf5_error() + ")");
}

// --- types --------------------------------------------------------------------------------

hid_t file_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return H5T_IEEE_F32LE;
    case torch::kDouble: return H5T_IEEE_F64LE;
    case torch::kLong: return H5T_STD_I64LE;
    case torch::kInt: return H5T_STD_I32LE;
    case torch::kByte: return H5T_STD_U8LE;
    case torch::kBool: return H5T_STD_U8LE;
    default: return -1;
  }
}

hid_t memory_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return H5T_NATIVE_FLOAT;
    case torch::kDouble: return H5T_NATIVE_DOUBLE;
    case torch::kLong: return H5T_NATIVE_INT64;
    case torch::kInt: return H5T_NATIVE_INT32;
    case torch::kByte: return H5T_NATIVE_UINT8;
    case torch::kBool: return H5T_NATIVE_UINT8;
    default: return -1;
  }
}

/// The torch dtype of a dataset's file type, or Undefined for a type leantrain never writes.
torch::ScalarType dtype_of(hid_t type) {
  const auto cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 4) return torch::kFloat;
    if (size == 8) return torch::kDouble;
  } else if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (is_signed && size == 8) return torch::kLong;
    if (is_signed && size == 4) return torch::kInt;
    if (!is_signed && size == 1) return torch::kByte;
  }
  return torch::ScalarType::Undefined;
}

uint32_t crc_of(const torch::Tensor& t) { return crc32(t.data_ptr(), t.nbytes()); }

// --- attributes ---------------------------------------------------------------------------

void write_attr(hid_t obj, const std::string& name, const std::string& value, const std::string& path) {
  auto type = check(H5Tcopy(H5T_C_S1), H5Tclose, path, "string type");
  check(H5Tset_size(type.get(), std::max<size_t>(1, value.size())), path, "string size");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), path, "string charset");
  auto space = check(H5Screate(H5S_SCALAR), H5Sclose, path, "scalar space");
  auto a = check(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                 path, "cannot create attribute " + name);
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  check(H5Awrite(a.get(), type.get(), padded.data()), path, "cannot write attribute " + name);
}

template <typename T>
void write_attr_num(hid_t obj, const std::string& name, T value, hid_t file_t, hid_t mem_t, const std::string& path) {
  auto space = check(H5Screate(H5S_SCALAR), H5Sclose, path, "scalar space");
  auto a = check(H5Acreate2(obj, name.c_str(), file_t, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, path,
                 "cannot create attribute " + name);
  check(H5Awrite(a.get(), mem_t, &value), path, "cannot write attribute " + name);
}

void write_attr(hid_t obj, const std::string& name, int64_t v, const std::string& path) {
  write_attr_num(obj, name, v, H5T_STD_I64LE, H5T_NATIVE_INT64, path);
}
void write_attr(hid_t obj, const std::string& name, double v, const std::string& path) {
  write_attr_num(obj, name, v, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, path);
}
void write_attr(hid_t obj, const std::string& name, uint32_t v, const std::string& path) {
  write_attr_num(obj, name, v, H5T_STD_U32LE, H5T_NATIVE_UINT32, path);
}

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

std::string read_attr_string(hid_t obj, const std::string& name, const std::string& path) {
  auto a = check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, path, "missing attribute '" + name + "'");
  auto type = check(H5Aget_type(a.get()), H5Tclose, path, "attribute type of " + name);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0)
    fail(path, "attribute '" + name + "' is not a fixed-length string");
  std::string buf(H5Tget_size(type.get()), '\0');
  check(H5Aread(a.get(), type.get(), buf.data()), path, "cannot read attribute " + name);
  const auto end = buf.find('\0');
  return end == std::string::npos ? buf : buf.substr(0, end);
}

template <typename T>
T read_attr_num(hid_t obj, const std::string& name, hid_t mem_t, const std::string& path) {
  auto a = check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, path, "missing attribute '" + name + "'");
  auto type = check(H5Aget_type(a.get()), H5Tclose, path, "attribute type of " + name);
  const auto cls = H5Tget_class(type.get());
  if (cls != H5T_INTEGER && cls != H5T_FLOAT) fail(path, "attribute '" + name + "' is not a number");
  T v{};
  check(H5Aread(a.get(), mem_t, &v), path, "cannot read attribute " + name);
  return v;
}

int64_t read_attr_int(hid_t obj, const std::string& name, const std::string& path) {
  return read_attr_num<int64_t>(obj, name, H5T_NATIVE_INT64, path);
}
double read_attr_double(hid_t obj, const std::string& name, const std::string& path) {
  return read_attr_num<double>(obj, name, H5T_NATIVE_DOUBLE, path);
}

std::vector<std::string> attr_names(hid_t obj) {
  std::vector<std::string> names;
  H5Aiterate2(
      obj, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* n, const H5A_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->push_back(n);
        return 0;
      },
      &names);
  return names;
}

std::vector<std::string> child_names(hid_t group) {
  // Index-based listing: the same calls in HDF5 1.10, 1.12 and 1.14.
  std::vector<std::string> names;
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) return names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) continue;
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    names.push_back(std::move(name));
  }
  return names;
}

// --- datasets -----------------------------------------------------------------------------

torch::Tensor host_contiguous(const torch::Tensor& t) {
  auto c = t.detach();
  if (!c.device().is_cpu()) c = c.cpu();
  return c.contiguous();
}

H write_dataset(hid_t group, const std::string& name, const torch::Tensor& t, const std::string& path) {
  const hid_t ft = file_type(t.scalar_type()), mt = memory_type(t.scalar_type());
  if (ft < 0)
    fail(path, "tensor '" + name + "' has dtype " + std::string(c10::toString(t.scalar_type())) +
                   ", which checkpoints do not store (FP32 parameters, float/int buffers)");
  std::vector<hsize_t> dims(t.sizes().begin(), t.sizes().end());
  auto space = dims.empty() ? check(H5Screate(H5S_SCALAR), H5Sclose, path, "scalar space")
                            : check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                    H5Sclose, path, "dataspace of " + name);
  auto ds = check(H5Dcreate2(group, name.c_str(), ft, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  H5Dclose, path, "cannot create dataset " + name);
  if (t.numel() > 0)
    check(H5Dwrite(ds.get(), mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), path,
          "cannot write tensor " + name);
  return ds;
}

// Note [Checksums during writeback]
// H5Dwrite of a large contiguous dataset is a pwrite into the page cache: it returns long
// before the disk has the data, which is written in the final fsync. A checksum thread that
// runs only while the pwrites run overlaps almost nothing, so the write cost checksums +
// fsync: 0.59x the throughput of fwrite + fsync for GPT-2 small's 1.5 GB here
// (docs/BENCH_CHECKPOINT.md). Two changes took it to 1.03-1.15x: writeback starts as the data
// goes in (sync_file_range(SYNC_FILE_RANGE_WRITE) every kWritebackBytes queues the dirty pages
// without waiting for them) and one checksum thread covers every tensor of the file, so the
// CRC-32s are computed while the disk writes and the final fsync waits only for what is still
// in flight; and the CRC itself folds with PCLMULQDQ (crc32.h): zlib 1.2's ~1.1 GB/s on a
// busy core was slower than the disk (early writeback alone: 0.62x).
constexpr int64_t kWritebackBytes = 64 << 20;

/// The file's POSIX descriptor (HDF5's sec2 driver), or -1.
int file_descriptor(hid_t file) {
  int* fd = nullptr;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, reinterpret_cast<void**>(&fd)) < 0 || fd == nullptr) return -1;
  return *fd;
}

struct Placed {
  hid_t group;  // where the dataset goes
  const NamedTensor* tensor;
};

/// Writes every tensor into its group; checksums run on another thread while the data is
/// written and written back (Note [Checksums during writeback]); `fd` is the file's
/// descriptor (-1: no early writeback).
void write_tensors(const std::vector<Placed>& items, int fd, const std::string& path) {
  std::vector<torch::Tensor> host;
  host.reserve(items.size());
  for (const auto& it : items) host.push_back(host_contiguous(it.tensor->tensor));
  auto crcs = std::async(std::launch::async, [&host] {
    std::vector<uint32_t> out;
    out.reserve(host.size());
    for (const auto& t : host) out.push_back(crc_of(t));
    return out;
  });
  std::vector<H> sets;
  sets.reserve(items.size());
  try {
    int64_t unqueued = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      sets.push_back(write_dataset(items[i].group, items[i].tensor->name, host[i], path));
      unqueued += static_cast<int64_t>(host[i].nbytes());
      if (fd >= 0 && unqueued >= kWritebackBytes) {
        ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);  // a hint: errors surface at fsync
        unqueued = 0;
      }
    }
  } catch (...) {
    crcs.wait();
    throw;
  }
  const auto sums = crcs.get();
  for (size_t i = 0; i < sets.size(); ++i) write_attr(sets[i].get(), "crc32", sums[i], path);
}

void write_tensors(hid_t group, const std::vector<NamedTensor>& tensors, int fd, const std::string& path) {
  std::vector<Placed> items;
  items.reserve(tensors.size());
  for (const auto& nt : tensors) items.push_back({group, &nt});
  write_tensors(items, fd, path);
}

torch::Tensor read_dataset(hid_t group, const std::string& name, const std::string& where, const std::string& path) {
  auto ds = check(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose, path, "cannot open dataset " + where);
  auto type = check(H5Dget_type(ds.get()), H5Tclose, path, "type of " + where);
  const auto dtype = dtype_of(type.get());
  if (dtype == torch::ScalarType::Undefined) fail(path, "dataset " + where + " has a type leantrain does not write");
  auto space = check(H5Dget_space(ds.get()), H5Sclose, path, "dataspace of " + where);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) fail(path, "dataspace of " + where + " is unreadable");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  std::vector<int64_t> shape(dims.begin(), dims.end());
  auto t = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  if (t.numel() > 0)
    check(H5Dread(ds.get(), memory_type(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), path,
          "cannot read tensor " + where);
  if (!has_attr(ds.get(), "crc32")) fail(path, "tensor " + where + " has no crc32 checksum");
  const auto want = static_cast<uint32_t>(read_attr_int(ds.get(), "crc32", path));
  if (crc_of(t) != want) fail(path, "tensor " + where + " is corrupt (checksum mismatch)");
  return t;
}

std::vector<NamedTensor> read_group(hid_t file, const std::string& group_name, const std::string& path) {
  std::vector<NamedTensor> out;
  auto g = check(H5Gopen2(file, group_name.c_str(), H5P_DEFAULT), H5Gclose, path, "missing group " + group_name);
  for (const auto& name : child_names(g.get())) {
    auto obj = check(H5Oopen(g.get(), name.c_str(), H5P_DEFAULT), H5Oclose, path,
                     "cannot read " + group_name + "/" + name);
    const bool is_group = H5Iget_type(obj.get()) == H5I_GROUP;
    obj.close();
    if (is_group) {
      for (auto& sub : read_group(file, group_name + "/" + name, path)) {
        sub.name = name + "/" + sub.name;
        out.push_back(std::move(sub));
      }
    } else {
      out.push_back({name, read_dataset(g.get(), name, group_name + "/" + name, path)});
    }
  }
  return out;
}

std::string join_dims(const torch::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += c;
    }
  }
  return o;
}

/// Everything inside the open file `f` (temporary name `tmp`); the caller closes it.
void write_contents(hid_t f, const Checkpoint& c, const std::string& tmp) {
  write_attr(f, "format", std::string(kFormatName), tmp);
  write_attr(f, "format_version", c.format_version, tmp);
  write_attr(f, "step", c.step, tmp);
  write_attr(f, "epoch", c.epoch, tmp);
  write_attr(f, "samples_seen", c.samples_seen, tmp);
  write_attr(f, "world_size", c.world_size, tmp);
  write_attr(f, "global_batch", c.global_batch, tmp);
  write_attr(f, "micro_batch", c.micro_batch, tmp);
  write_attr(f, "accumulation", c.accumulation, tmp);
  write_attr(f, "precision", c.precision, tmp);
  write_attr(f, "model_config", c.model_config, tmp);
  write_attr(f, "train_config", c.train_config, tmp);
  write_attr(f, "config", c.config, tmp);
  write_attr(f, "leantrain_version", c.leantrain_version, tmp);
  write_attr(f, "libtorch_version", c.libtorch_version, tmp);

  auto lcpl = check(H5Pcreate(H5P_LINK_CREATE), H5Pclose, tmp, "link list");
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), tmp, "intermediate groups");
  auto model = check(H5Gcreate2(f, "model", lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose, tmp, "group model");
  std::vector<Placed> items;  // /model, then /optimizer: one pass (Note [Checksums during writeback])
  for (const auto& nt : c.model) items.push_back({model.get(), &nt});

  auto opt = check(H5Gcreate2(f, "optimizer", lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose, tmp,
                   "group optimizer");
  write_attr(opt.get(), "kind", c.optimizer_kind, tmp);
  for (const auto& [k, v] : c.optimizer_attrs) write_attr(opt.get(), k, v, tmp);
  {
    // "<param>/<state>": one group per parameter (created on demand), datasets inside.
    std::map<std::string, std::vector<NamedTensor>> by_param;
    std::vector<std::string> order;
    for (const auto& nt : c.optimizer) {
      const auto slash = nt.name.rfind('/');
      if (slash == std::string::npos) fail(tmp, "optimizer tensor '" + nt.name + "' is not <param>/<state>");
      const auto param = nt.name.substr(0, slash);
      if (!by_param.count(param)) order.push_back(param);
      by_param[param].push_back({nt.name.substr(slash + 1), nt.tensor});
    }
    std::vector<H> groups;
    for (const auto& param : order) {
      groups.push_back(check(H5Gcreate2(opt.get(), param.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                             H5Gclose, tmp, "optimizer group " + param));
      for (const auto& nt : by_param[param]) items.push_back({groups.back().get(), &nt});
    }
    write_tensors(items, file_descriptor(f), tmp);
  }
  auto scaler = check(H5Gcreate2(f, "scaler", lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose, tmp, "group scaler");
  for (const auto& [k, v] : c.scaler) write_attr(scaler.get(), k, v, tmp);
  auto data = check(H5Gcreate2(f, "data", lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose, tmp, "group data");
  for (const auto& [k, v] : c.data) write_attr(data.get(), k, v, tmp);
  data.close();
  scaler.close();
  opt.close();
  model.close();
}

/// Creates `path` under a temporary name in HDF5's latest format, lets `fill` write into it,
/// closes it and commits it (fsync, rename, fsync the directory). On any failure the
/// temporary file is removed, nothing at `path` changes, and CheckpointError is thrown.
template <typename Fill>
WriteStats write_hdf5_atomically(const std::string& path, const char* what, Fill&& fill) {
  const auto t0 = std::chrono::steady_clock::now();
  quiet_hdf5();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    auto fapl = check(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, tmp, "file access list");
    check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), tmp, "format bounds");
    auto file = check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose, tmp,
                      std::string("cannot create ") + what);
    try {
      fill(file.get(), tmp);
    } catch (...) {
      close_or_abandon(file);  // before the handle's destructor would close it a second time
      throw;
    }
    if (!close_or_abandon(file)) fail(tmp, std::string("cannot finish ") + what + " (" + hdf5_error() + ")");
    files::commit_file(tmp, path);
  } catch (const CheckpointError&) {
    ::unlink(tmp.c_str());
    throw;
  } catch (const std::exception& e) {
    ::unlink(tmp.c_str());
    throw CheckpointError(path + ": " + e.what());
  }
  WriteStats s;
  s.bytes = files::file_size(path);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

}  // namespace

WriteStats write_checkpoint(const std::string& path, const Checkpoint& c) {
  return write_hdf5_atomically(path, "checkpoint file",
                               [&](hid_t f, const std::string& tmp) { write_contents(f, c, tmp); });
}

WriteStats write_tensor_file(const std::string& path, const std::vector<NamedTensor>& tensors) {
  for (const auto& nt : tensors)
    if (nt.name.empty() || nt.name.find('/') != std::string::npos)
      fail(path, "tensor name '" + nt.name + "' must be non-empty and contain no '/'");
  return write_hdf5_atomically(path, "tensor file",
                               [&](hid_t f, const std::string& tmp) { write_tensors(f, tensors, file_descriptor(f), tmp); });
}

Checkpoint read_checkpoint(const std::string& path) {
  quiet_hdf5();
  if (!files::exists(path)) fail(path, "no such checkpoint file");
  if (files::is_directory(path)) fail(path, "is a directory, not a checkpoint file (use --resume auto for a run's directory)");
  {
    // HDF5's signature at offset 0 (leantrain writes no user block).
    static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
    char head[8] = {0};
    FILE* fp = std::fopen(path.c_str(), "rb");
    if (fp == nullptr) fail(path, "cannot open checkpoint for reading");
    const size_t n = std::fread(head, 1, sizeof head, fp);
    std::fclose(fp);
    if (n != sizeof head || std::memcmp(head, kSignature, sizeof head) != 0)
      fail(path, "not an HDF5 file (no HDF5 signature): not a leantrain checkpoint, or damaged");
  }
  auto file = check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, path,
                    "cannot open checkpoint (truncated or damaged)");
  const hid_t f = file.get();
  Checkpoint c;
  if (!has_attr(f, "format") || read_attr_string(f, "format", path) != kFormatName)
    fail(path, "not a leantrain checkpoint (no format = \"" + std::string(kFormatName) + "\" attribute)");
  c.format_version = read_attr_int(f, "format_version", path);
  if (c.format_version > kFormatVersion)
    fail(path, "checkpoint format version " + std::to_string(c.format_version) +
                   " is newer than this leantrain reads (" + std::to_string(kFormatVersion) +
                   "); use a newer leantrain");
  if (c.format_version < 1) fail(path, "invalid format_version " + std::to_string(c.format_version));
  c.step = read_attr_int(f, "step", path);
  c.epoch = read_attr_int(f, "epoch", path);
  c.samples_seen = read_attr_int(f, "samples_seen", path);
  c.world_size = read_attr_int(f, "world_size", path);
  c.global_batch = read_attr_int(f, "global_batch", path);
  c.micro_batch = read_attr_int(f, "micro_batch", path);
  c.accumulation = read_attr_int(f, "accumulation", path);
  c.precision = read_attr_string(f, "precision", path);
  c.model_config = read_attr_string(f, "model_config", path);
  c.train_config = read_attr_string(f, "train_config", path);
  c.config = read_attr_string(f, "config", path);
  c.leantrain_version = read_attr_string(f, "leantrain_version", path);
  c.libtorch_version = read_attr_string(f, "libtorch_version", path);

  c.model = read_group(f, "model", path);
  {
    auto opt = check(H5Gopen2(f, "optimizer", H5P_DEFAULT), H5Gclose, path, "missing group optimizer");
    for (const auto& k : attr_names(opt.get())) {
      if (k == "kind") c.optimizer_kind = read_attr_string(opt.get(), k, path);
      else c.optimizer_attrs[k] = read_attr_double(opt.get(), k, path);
    }
  }
  c.optimizer = read_group(f, "optimizer", path);
  {
    auto g = check(H5Gopen2(f, "scaler", H5P_DEFAULT), H5Gclose, path, "missing group scaler");
    for (const auto& k : attr_names(g.get())) c.scaler[k] = read_attr_double(g.get(), k, path);
  }
  {
    auto g = check(H5Gopen2(f, "data", H5P_DEFAULT), H5Gclose, path, "missing group data");
    for (const auto& k : attr_names(g.get())) c.data[k] = read_attr_int(g.get(), k, path);
  }
  return c;
}

std::vector<std::string> check_model(const Checkpoint& c, const std::vector<NamedTensor>& expected,
                                     const std::string& path, bool allow_shape_mismatch) {
  std::map<std::string, const torch::Tensor*> have;
  for (const auto& nt : c.model) have[nt.name] = &nt.tensor;
  std::vector<std::string> problems, skipped;
  std::set<std::string> seen;
  for (const auto& e : expected) {
    seen.insert(e.name);
    auto it = have.find(e.name);
    if (it == have.end()) {
      problems.push_back("missing " + e.name + " " + join_dims(e.tensor.sizes()));
      continue;
    }
    const auto& t = *it->second;
    const bool same_shape = t.sizes() == e.tensor.sizes();
    if (!same_shape && allow_shape_mismatch) {
      skipped.push_back(e.name + " (checkpoint " + join_dims(t.sizes()) + ", model " + join_dims(e.tensor.sizes()) + ")");
      continue;
    }
    if (!same_shape)
      problems.push_back(e.name + ": shape " + join_dims(t.sizes()) + " in the checkpoint, " +
                         join_dims(e.tensor.sizes()) + " in the model");
    else if (t.scalar_type() != e.tensor.scalar_type())
      problems.push_back(e.name + ": dtype " + std::string(c10::toString(t.scalar_type())) + " in the checkpoint, " +
                         std::string(c10::toString(e.tensor.scalar_type())) + " in the model");
  }
  for (const auto& nt : c.model)
    if (!seen.count(nt.name)) problems.push_back("unexpected " + nt.name + " " + join_dims(nt.tensor.sizes()));
  if (!problems.empty()) {
    std::string msg = "checkpoint does not match the model (" + std::to_string(problems.size()) + " problem" +
                      (problems.size() == 1 ? "" : "s") + "):";
    for (const auto& p : problems) msg += "\n  " + p;
    fail(path, msg);
  }
  return skipped;
}

std::string describe(const Checkpoint& c, const std::string& path, bool json) {
  int64_t model_bytes = 0, opt_bytes = 0, n_params = 0;
  for (const auto& nt : c.model) {
    model_bytes += static_cast<int64_t>(nt.tensor.nbytes());
    if (nt.tensor.is_floating_point()) n_params += nt.tensor.numel();
  }
  for (const auto& nt : c.optimizer) opt_bytes += static_cast<int64_t>(nt.tensor.nbytes());
  std::ostringstream o;
  if (json) {
    o << "{\"path\":\"" << json_escape(path) << "\",\"format_version\":" << c.format_version
      << ",\"step\":" << c.step << ",\"epoch\":" << c.epoch << ",\"samples_seen\":" << c.samples_seen
      << ",\"world_size\":" << c.world_size << ",\"global_batch\":" << c.global_batch
      << ",\"micro_batch\":" << c.micro_batch << ",\"accumulation\":" << c.accumulation << ",\"precision\":\""
      << json_escape(c.precision) << "\",\"optimizer\":\"" << json_escape(c.optimizer_kind)
      << "\",\"tensors\":" << c.model.size() << ",\"model_bytes\":" << model_bytes
      << ",\"optimizer_bytes\":" << opt_bytes << ",\"float_elements\":" << n_params
      << ",\"leantrain_version\":\"" << json_escape(c.leantrain_version) << "\",\"libtorch_version\":\""
      << json_escape(c.libtorch_version) << "\",\"model_config\":" << (c.model_config.empty() ? "null" : c.model_config)
      << ",\"scaler\":{";
    bool first = true;
    for (const auto& [k, v] : c.scaler) {
      o << (first ? "" : ",") << "\"" << k << "\":" << v;
      first = false;
    }
    o << "},\"model\":[";
    first = true;
    for (const auto& nt : c.model) {
      o << (first ? "" : ",") << "{\"name\":\"" << json_escape(nt.name) << "\",\"shape\":" << join_dims(nt.tensor.sizes())
        << ",\"dtype\":\"" << c10::toString(nt.tensor.scalar_type()) << "\"}";
      first = false;
    }
    o << "]}";
    return o.str();
  }
  o << path << "\n  format version " << c.format_version << ", written by leantrain " << c.leantrain_version
    << " (LibTorch " << c.libtorch_version << ")\n  step " << c.step << ", epoch " << c.epoch << ", "
    << c.samples_seen << " samples seen\n  world " << c.world_size << " ranks, global batch " << c.global_batch
    << " = " << c.world_size << " x " << c.micro_batch << " micro x " << c.accumulation << " accumulation, precision "
    << c.precision << "\n  model: " << c.model.size() << " tensors, " << n_params << " float elements, "
    << model_bytes << " bytes\n  optimizer " << c.optimizer_kind << ": " << c.optimizer.size() << " tensors, "
    << opt_bytes << " bytes\n";
  if (!c.scaler.empty()) {
    o << "  loss scaler:";
    for (const auto& [k, v] : c.scaler) o << " " << k << "=" << v;
    o << "\n";
  }
  o << "  model config: " << c.model_config << "\n  tensors:\n";
  for (const auto& nt : c.model)
    o << "    " << nt.name << " " << join_dims(nt.tensor.sizes()) << " " << c10::toString(nt.tensor.scalar_type()) << "\n";
  return o.str();
}

// --- a directory of checkpoints -------------------------------------------------------------

std::string checkpoint_filename(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld.h5", static_cast<long long>(step));
  return buf;
}

namespace {
constexpr const char* kPointer = "latest";

bool is_checkpoint_name(const std::string& n) {
  return n.size() == 16 && n.rfind("step-", 0) == 0 && n.substr(13) == ".h5" &&
         std::all_of(n.begin() + 5, n.begin() + 13, [](char ch) { return ch >= '0' && ch <= '9'; });
}

std::string read_pointer(const std::string& dir) {
  FILE* fp = std::fopen(files::join(dir, kPointer).c_str(), "r");
  if (fp == nullptr) return "";
  char buf[64] = {0};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, fp);
  std::fclose(fp);
  std::string s(buf, n);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return is_checkpoint_name(s) ? s : "";
}
}  // namespace

WriteStats commit_checkpoint(const std::string& dir, const Checkpoint& c, int64_t keep_last) {
  files::make_dirs(dir);
  // A run killed mid-write leaves a temporary file behind; it never counts as a checkpoint.
  for (const auto& n : files::list_dir(dir))
    if (n.find(".tmp.") != std::string::npos) ::unlink(files::join(dir, n).c_str());
  const std::string name = checkpoint_filename(c.step);
  auto stats = write_checkpoint(files::join(dir, name), c);
  files::write_atomic(files::join(dir, kPointer), name + "\n");
  if (keep_last > 0) {
    std::vector<std::string> all;
    for (const auto& n : files::list_dir(dir))
      if (is_checkpoint_name(n)) all.push_back(n);
    // Sorted by name = by step; the newest keep_last stay.
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i)
      if (all[i] != name) ::unlink(files::join(dir, all[i]).c_str());
  }
  return stats;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& n : files::list_dir(dir))
    if (is_checkpoint_name(n)) names.push_back(n);
  std::reverse(names.begin(), names.end());
  const std::string ptr = read_pointer(dir);
  if (!ptr.empty()) {
    auto it = std::find(names.begin(), names.end(), ptr);
    if (it != names.end()) std::rotate(names.begin(), it, it + 1);
  }
  std::vector<std::string> paths;
  for (const auto& n : names) paths.push_back(files::join(dir, n));
  return paths;
}

}  // namespace lt::checkpoint_io
