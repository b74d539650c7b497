// POSIX file helpers (runtime/files.h): atomic writes and directory creation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "leantrain/runtime/files.h"

namespace {

TEST(Files, MakeDirsWriteAtomicAndRemove) {
  const std::string root = "/tmp/lt_files_test_" + std::to_string(::getpid());
  const std::string deep = lt::files::join(root, "a/b/c");
  lt::files::make_dirs(deep);
  EXPECT_TRUE(lt::files::is_directory(deep));
  lt::files::make_dirs(deep);  // idempotent
  const std::string f = lt::files::join(deep, "x.txt");
  lt::files::write_atomic(f, "one\n");
  lt::files::write_atomic(f, "two\n");  // replaces whole
  std::ifstream in(f);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "two\n");
  EXPECT_FALSE(lt::files::exists(f + ".tmp." + std::to_string(::getpid())));
  EXPECT_THROW(lt::files::make_dirs(lt::files::join(f, "sub")), std::runtime_error);  // a file in the way
  EXPECT_THROW(lt::files::write_atomic("/nonexistent-dir/x", "y"), std::runtime_error);
  lt::files::remove_tree(root);
  EXPECT_FALSE(lt::files::exists(root));
}

TEST(Files, StemAndJoin) {
  EXPECT_EQ(lt::files::stem("configs/demo.toml"), "demo");
  EXPECT_EQ(lt::files::stem("demo"), "demo");
  EXPECT_EQ(lt::files::join("runs/", "x"), "runs/x");
  EXPECT_EQ(lt::files::join("runs", "x"), "runs/x");
}

}  // namespace
