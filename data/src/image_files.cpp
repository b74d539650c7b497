// Image files, torch-free: JPEG (libjpeg-turbo) and PNG (libpng's simplified API) decoding,
// ImageFolder's layout, and RandomResizedCrop's parameters (image_files.h).
#include "leantrain/data/image_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "leantrain/data/sampling.h"
#include "leantrain/runtime/errors.h"
#include "rng.h"

namespace lt::data {
namespace {

// The image transforms' stream tag (rng.h keeps the others; distinct from them).
constexpr uint64_t kStreamImageTransform = 0x696d6774;  // "imgt"

std::string quoted(const std::string& s) { return "'" + s + "'"; }

[[noreturn]] void bad_image(const std::string& path, const std::string& why) {
  throw DataError("image " + quoted(path) + ": " + why);
}

std::vector<uint8_t> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad_image(path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<uint8_t> data;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) data.reserve(static_cast<size_t>(st.st_size));
  uint8_t buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      bad_image(path, std::string("cannot read: ") + std::strerror(err));
    }
    if (n == 0) break;
    data.insert(data.end(), buf, buf + n);
  }
  ::close(fd);
  return data;
}

// ---------------------------------------------------------------------------------------------
// JPEG. libjpeg's default error_exit calls exit(); ours longjmps back to decode_jpeg, which then
// throws. Warnings (emit_message level -1) count as errors too: a truncated file is only a
// warning to libjpeg ("Premature end of JPEG file", the rest painted gray). The one warning
// let through is extraneous bytes before a marker, which PIL and torchvision also accept.

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  if (cinfo->err->msg_code == JWRN_EXTRANEOUS_DATA) return;
  jpeg_fail(cinfo);
}

// Returns "" or the error. No object with a destructor lives between setjmp and longjmp here:
// `out` and `rows` are the caller's or sized before setjmp.
std::string decode_jpeg(const std::vector<uint8_t>& data, Image& out) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return err.message[0] ? std::string(err.message) : std::string("corrupt JPEG");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data.data(), static_cast<unsigned long>(data.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return "CMYK JPEGs are not supported (convert it to RGB)";
  }
  cinfo.out_color_space = cinfo.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out.height = cinfo.output_height;
  out.width = cinfo.output_width;
  out.channels = cinfo.output_components;
  out.pixels.resize(static_cast<size_t>(out.height * out.width * out.channels));
  const size_t stride = static_cast<size_t>(out.width * out.channels);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.pixels.data() + cinfo.output_scanline * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return "";
}

// ---------------------------------------------------------------------------------------------
// PNG, through libpng's simplified API: it keeps its own setjmp and reports errors in
// image.message, so nothing here jumps.

std::string decode_png(const std::vector<uint8_t>& data, Image& out) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, data.data(), data.size())) return img.message;
  const bool color = (img.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (img.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  // Read with the file's alpha (if any) and drop it below: the simplified API would otherwise
  // composite it, which PIL's convert("RGB") does not.
  img.format = (color ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY) | (alpha ? PNG_FORMAT_FLAG_ALPHA : 0U);
  const int64_t in_c = (color ? 3 : 1) + (alpha ? 1 : 0);
  std::vector<uint8_t> buf(PNG_IMAGE_SIZE(img));
  if (!png_image_finish_read(&img, nullptr, buf.data(), 0, nullptr)) {
    std::string msg = img.message;
    png_image_free(&img);
    return msg;
  }
  out.height = img.height;
  out.width = img.width;
  out.channels = color ? 3 : 1;
  if (!alpha) {
    out.pixels = std::move(buf);
  } else {
    const int64_t n = out.height * out.width;
    out.pixels.resize(static_cast<size_t>(n * out.channels));
    for (int64_t p = 0; p < n; ++p)
      for (int64_t c = 0; c < out.channels; ++c) out.pixels[p * out.channels + c] = buf[p * in_c + c];
  }
  return "";
}

void convert_channels(Image& im, int channels) {
  if (channels == 0 || channels == im.channels) return;
  const int64_t n = im.height * im.width;
  std::vector<uint8_t> px(static_cast<size_t>(n * channels));
  if (channels == 3) {  // gray -> RGB
    for (int64_t p = 0; p < n; ++p) px[3 * p] = px[3 * p + 1] = px[3 * p + 2] = im.pixels[p];
  } else {  // RGB -> gray, PIL's ITU-R 601-2 luma in fixed point
    for (int64_t p = 0; p < n; ++p) {
      const uint8_t* s = &im.pixels[3 * p];
      px[p] = static_cast<uint8_t>((19595u * s[0] + 38470u * s[1] + 7471u * s[2] + 0x8000u) >> 16);
    }
  }
  im.pixels = std::move(px);
  im.channels = channels;
}

// ---------------------------------------------------------------------------------------------
// Folders

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The names in a directory (without . and ..), unsorted; ConfigError/DataError by the caller.
bool list_dir(const std::string& dir, std::vector<std::string>& names) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return false;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return true;
}

bool image_extension(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

// torchvision's make_dataset: every file of the class folder's tree (symlinks followed),
// directories in sorted path order, each directory's files sorted.
void walk(const std::string& dir, std::vector<std::pair<std::string, std::vector<std::string>>>& out, int depth) {
  std::vector<std::string> names;
  if (!list_dir(dir, names)) throw DataError("image folder " + quoted(dir) + ": cannot list: " + std::strerror(errno));
  std::vector<std::string> files;
  std::vector<std::string> subdirs;
  for (const auto& n : names) {
    const std::string p = dir + "/" + n;
    if (is_dir(p)) {
      subdirs.push_back(p);
    } else if (image_extension(n)) {
      files.push_back(n);
    }
  }
  std::sort(files.begin(), files.end());
  out.emplace_back(dir, std::move(files));
  if (depth > 32) return;  // a symlink cycle
  for (const auto& s : subdirs) walk(s, out, depth + 1);
}

double python_round(double x) { return std::nearbyint(x); }  // half to even, as Python's round()

}  // namespace

Image decode_image(const std::string& path, int channels) {
  if (channels != 0 && channels != 1 && channels != 3)
    throw std::invalid_argument("decode_image: channels must be 0, 1 or 3");
  const std::vector<uint8_t> data = read_file(path);
  Image im;
  std::string err;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (data.size() >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) {
    err = decode_jpeg(data, im);
    if (!err.empty()) bad_image(path, "corrupt JPEG: " + err);
  } else if (data.size() >= 8 && std::memcmp(data.data(), kPng, 8) == 0) {
    err = decode_png(data, im);
    if (!err.empty()) bad_image(path, "corrupt PNG: " + err);
  } else {
    bad_image(path, data.empty() ? "empty file" : "neither JPEG nor PNG (by its first bytes)");
  }
  if (im.height <= 0 || im.width <= 0) bad_image(path, "no pixels");
  convert_channels(im, channels);
  return im;
}

FolderIndex scan_image_folder(const std::string& root, const std::string& key) {
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0)
    throw ConfigError(key + " = " + quoted(root) + " does not exist (an image folder: root/<class>/<image>)");
  if (!S_ISDIR(st.st_mode))
    throw ConfigError(key + " = " + quoted(root) + " is not a directory (an image folder: root/<class>/<image>)");
  std::vector<std::string> names;
  if (!list_dir(root, names))
    throw DataError("image folder " + quoted(root) + ": cannot list: " + std::strerror(errno));
  FolderIndex idx;
  for (const auto& n : names)
    if (is_dir(root + "/" + n)) idx.classes.push_back(n);
  std::sort(idx.classes.begin(), idx.classes.end());
  if (idx.classes.empty())
    throw DataError("image folder " + quoted(root) + " (" + key + ") holds no class folders: expected root/<class>/<image>");
  for (size_t c = 0; c < idx.classes.size(); ++c) {
    std::vector<std::pair<std::string, std::vector<std::string>>> dirs;
    walk(root + "/" + idx.classes[c], dirs, 0);
    std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t before = idx.files.size();
    for (const auto& [dir, files] : dirs)
      for (const auto& f : files) {
        idx.files.push_back(dir + "/" + f);
        idx.labels.push_back(static_cast<int64_t>(c));
      }
    if (idx.files.size() == before)
      throw DataError("image folder " + quoted(root + "/" + idx.classes[c]) + " (class " + quoted(idx.classes[c]) +
                      ") holds no .jpg, .jpeg or .png file");
  }
  return idx;
}

TrainDraw train_draw(int64_t height, int64_t width, double scale_lo, double scale_hi, double ratio_lo,
                     double ratio_hi, bool hflip, uint64_t seed, int64_t epoch, int64_t index) {
  std::mt19937_64 rng(mix_seed({seed, kStreamImageTransform, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)}));
  TrainDraw d;
  bool found = false;
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_lo = std::log(ratio_lo), log_hi = std::log(ratio_hi);
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target_area = area * (scale_lo + (scale_hi - scale_lo) * detail::uniform01(rng));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * detail::uniform01(rng));
    const auto w = static_cast<int64_t>(python_round(std::sqrt(target_area * aspect)));
    const auto h = static_cast<int64_t>(python_round(std::sqrt(target_area / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      d.box.top = static_cast<int64_t>(detail::bounded(rng, static_cast<uint64_t>(height - h + 1)));
      d.box.left = static_cast<int64_t>(detail::bounded(rng, static_cast<uint64_t>(width - w + 1)));
      d.box.height = h;
      d.box.width = w;
      found = true;
    }
  }
  if (!found) {  // torchvision's fallback: the centre crop at the nearest allowed ratio
    const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
    int64_t w = width, h = height;
    if (in_ratio < std::min(ratio_lo, ratio_hi)) {
      h = static_cast<int64_t>(python_round(static_cast<double>(w) / std::min(ratio_lo, ratio_hi)));
    } else if (in_ratio > std::max(ratio_lo, ratio_hi)) {
      w = static_cast<int64_t>(python_round(static_cast<double>(h) * std::max(ratio_lo, ratio_hi)));
    }
    d.box = {(height - h) / 2, (width - w) / 2, h, w};
  }
  d.flip = hflip && detail::uniform01(rng) < 0.5;
  return d;
}

EvalGeometry eval_geometry(int64_t height, int64_t width, int64_t resize, int64_t out_h, int64_t out_w) {
  EvalGeometry g;
  // torchvision's _compute_resized_output_size for an int size: the short side to `resize`,
  // the long one int(resize * long / short) (truncated).
  if (height <= width) {
    g.resized_height = resize;
    g.resized_width = static_cast<int64_t>(static_cast<double>(resize) * static_cast<double>(width) / static_cast<double>(height));
  } else {
    g.resized_width = resize;
    g.resized_height = static_cast<int64_t>(static_cast<double>(resize) * static_cast<double>(height) / static_cast<double>(width));
  }
  // CenterCrop: top = int(round((h - H) / 2.0)), the same for left.
  g.box.top = static_cast<int64_t>(python_round(static_cast<double>(g.resized_height - out_h) / 2.0));
  g.box.left = static_cast<int64_t>(python_round(static_cast<double>(g.resized_width - out_w) / 2.0));
  g.box.height = out_h;
  g.box.width = out_w;
  return g;
}

}  // namespace lt::data
