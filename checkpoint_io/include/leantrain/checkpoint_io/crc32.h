#pragma once
// The checksum of every checkpoint dataset (its `crc32` attribute): zlib's CRC-32 (the
// gzip polynomial, as Python's zlib.crc32), of the raw bytes. Torch-free.
#include <cstddef>
#include <cstdint>

namespace lt::checkpoint_io {

/// zlib's crc32 of `size` bytes at `data`, continuing from `crc` (0 to start). On x86-64
/// CPUs with PCLMULQDQ the bulk is folded with carry-less multiplies (~5x zlib 1.2's speed
/// here), the tail and other CPUs go through zlib: a checkpoint's checksums must not cost
/// more than its write (Note [Checksums during writeback] in checkpoint.cpp).
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

}  // namespace lt::checkpoint_io
