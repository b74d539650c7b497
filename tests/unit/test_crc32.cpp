// checkpoint_io::crc32 (the PCLMULQDQ folding, Note [CRC-32 by folding]) against zlib's
// crc32 — the reference the Python reader (zlib.crc32) uses — at every length around the
// 64- and 16-byte block edges, at unaligned starts, chained, and on a large buffer.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <random>
#include <vector>

#include "leantrain/checkpoint_io/crc32.h"

namespace {

std::vector<unsigned char> random_bytes(size_t n) {
  std::mt19937_64 rng(42);
  std::vector<unsigned char> b(n);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  return b;
}

uint32_t zlib_crc(const unsigned char* p, size_t n, uint32_t crc = 0) {
  return static_cast<uint32_t>(crc32_z(crc, p, static_cast<z_size_t>(n)));
}

TEST(Crc32, MatchesZlibAtEveryLengthAndOffset) {
  const auto b = random_bytes(1024);
  for (size_t off = 0; off < 16; ++off)
    for (size_t n = 0; n + off <= 700; ++n)
      ASSERT_EQ(lt::checkpoint_io::crc32(b.data() + off, n), zlib_crc(b.data() + off, n)) << "n " << n << " offset " << off;
}

TEST(Crc32, ContinuesARunningCrcAsZlibDoes) {
  const auto b = random_bytes(5000);
  const uint32_t first = lt::checkpoint_io::crc32(b.data(), 1234);
  EXPECT_EQ(lt::checkpoint_io::crc32(b.data() + 1234, 5000 - 1234, first), zlib_crc(b.data(), 5000));
  EXPECT_EQ(lt::checkpoint_io::crc32(b.data() + 1234, 5000 - 1234, first), zlib_crc(b.data() + 1234, 5000 - 1234, first));
}

TEST(Crc32, MatchesZlibOnALargeBufferAndKnownValues) {
  const auto b = random_bytes((64 << 20) + 13);
  EXPECT_EQ(lt::checkpoint_io::crc32(b.data(), b.size()), zlib_crc(b.data(), b.size()));
  const char* check = "123456789";  // the CRC-32 catalogue's check value
  EXPECT_EQ(lt::checkpoint_io::crc32(check, 9), 0xCBF43926u);
  const std::vector<unsigned char> zeros(4096, 0);
  EXPECT_EQ(lt::checkpoint_io::crc32(zeros.data(), zeros.size()), zlib_crc(zeros.data(), zeros.size()));
}

}  // namespace
