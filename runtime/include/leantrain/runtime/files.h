#pragma once
// File-system helpers on POSIX calls. Note [No std::filesystem]: the PyPI libtorch.so
// exports std::filesystem symbols of its own that interpose on libstdc++'s in any binary
// linked with it (remove_all crashed through a null pointer), so code linked with LibTorch
// uses these instead.
#include <cstdint>
#include <string>
#include <vector>

namespace lt::files {

bool exists(const std::string& path);
bool is_directory(const std::string& path);
/// mkdir -p; throws std::runtime_error naming the path and errno text.
void make_dirs(const std::string& path);
/// Writes the whole file under a temporary name, fsyncs it, renames it over `path` and
/// fsyncs the directory: a reader sees the old file or the new one, never half of one.
void write_atomic(const std::string& path, const std::string& content);
/// The commit half of write_atomic for a file written elsewhere under the temporary name
/// `tmp`: fsync it, rename it over `path`, fsync the directory. On failure `tmp` is removed.
void commit_file(const std::string& tmp, const std::string& path);
/// Names in `dir` (no "." or ".."), sorted; empty when `dir` is missing.
std::vector<std::string> list_dir(const std::string& dir);
/// Size in bytes, or -1 when `path` cannot be stat'ed.
int64_t file_size(const std::string& path);
/// rm -rf (for tests and scratch directories); missing paths are fine.
void remove_tree(const std::string& path);
/// The final component without its extension: "configs/demo.toml" -> "demo".
std::string stem(const std::string& path);
/// a + "/" + b, without doubling the separator.
std::string join(const std::string& a, const std::string& b);

}  // namespace lt::files
