#pragma once
// precision.mode as a type: the one mapping from its text to the dtype a run computes in
// (autocast's dtype; parameters, gradients and optimizer state stay FP32). Header-only; it
// needs c10's ScalarType, so only LibTorch code includes it (runtime/config.h keeps the text).
#include <string>

#include <c10/core/ScalarType.h>

#include "leantrain/runtime/errors.h"

namespace lt {

/// precision.mode: fp32 | bf16 | fp16 (autocast to bfloat16 / float16).
enum class Precision { kFp32, kBf16, kFp16 };

/// "fp32" | "bf16" | "fp16"; ConfigError naming precision.mode otherwise.
inline Precision parse_precision(const std::string& mode) {
  if (mode == "fp32") return Precision::kFp32;
  if (mode == "bf16") return Precision::kBf16;
  if (mode == "fp16") return Precision::kFp16;
  throw ConfigError("precision.mode = '" + mode + "': expected fp32, bf16 or fp16");
}

/// The text parse_precision reads.
inline const char* to_string(Precision p) {
  switch (p) {
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
    case Precision::kFp32: break;
  }
  return "fp32";
}

/// The dtype the precision computes in: float32, bfloat16 or float16.
inline c10::ScalarType compute_dtype(Precision p) {
  switch (p) {
    case Precision::kBf16: return c10::kBFloat16;
    case Precision::kFp16: return c10::kHalf;
    case Precision::kFp32: break;
  }
  return c10::kFloat;
}

}  // namespace lt
