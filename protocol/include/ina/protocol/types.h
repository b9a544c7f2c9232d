// Shared vocabulary types: data types, reduction ops and identifiers.
// The numeric values of DType and ReduceOp are wire values (see wire.h) and the C ABI's values
// (ina/ina.h): never renumber them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ina {

using JobId = uint32_t;
using Rank = uint32_t;      // on the wire: 16 bits (world sizes up to 65535)
using SlotId = uint32_t;    // on the wire: 15 bits plus the shadow-copy bit
using BlockSeq = uint32_t;  // per-job block sequence, compared in serial-number arithmetic

// Exponent of a block with no finite non-zero element (see quantize.h).
inline constexpr int16_t kNoExponent = INT16_MIN;

enum class DType : uint8_t {
  kInt32 = 1,
  kFloat32 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kFloat8E4M3 = 5,  // OCP FP8 E4M3FN (fp8.h): no Inf, saturating conversions
  kFloat8E5M2 = 6,  // OCP FP8 E5M2 (fp8.h): IEEE-like, with Inf
};

enum class ReduceOp : uint8_t {
  kSum = 1,
  kMin = 2,
  kMax = 3,
};

inline constexpr bool is_valid_dtype(uint8_t v) { return v >= 1 && v <= 6; }

inline constexpr bool is_float8(DType t) {
  return t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2;
}
inline constexpr bool is_valid_op(uint8_t v) { return v >= 1 && v <= 3; }

// Bytes per element in the user's buffer.
inline constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kInt32:
    case DType::kFloat32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return 1;
  }
  return 0;
}

// Views of string literals: .data() is NUL-terminated.
// "int32", "float32", "float16", "bfloat16", "float8_e4m3", "float8_e5m2"
std::string_view dtype_name(DType t);
std::string_view op_name(ReduceOp op);  // "sum", "min", "max"
// Accepts the names above, the nccl-tests spellings ("float", "half", "bfloat16", "int") and
// "e4m3", "e5m2", "fp8_e4m3", "fp8_e5m2" (and nccl-tests' "f8e4m3", "f8e5m2").
std::optional<DType> parse_dtype(std::string_view s);
std::optional<ReduceOp> parse_op(std::string_view s);

}  // namespace ina
