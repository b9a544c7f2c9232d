#include "ina/protocol/types.h"

namespace ina {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kInt32: return "int32";
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat8E4M3: return "float8_e4m3";
    case DType::kFloat8E5M2: return "float8_e5m2";
  }
  return "?";
}

std::string_view op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "int32" || s == "int" || s == "i32") return DType::kInt32;
  if (s == "float32" || s == "float" || s == "f32" || s == "fp32") return DType::kFloat32;
  if (s == "float16" || s == "half" || s == "f16" || s == "fp16") return DType::kFloat16;
  if (s == "bfloat16" || s == "bf16") return DType::kBFloat16;
  if (s == "float8_e4m3" || s == "e4m3" || s == "fp8_e4m3" || s == "f8e4m3") {
    return DType::kFloat8E4M3;  // f8e4m3: the nccl-tests spelling
  }
  if (s == "float8_e5m2" || s == "e5m2" || s == "fp8_e5m2" || s == "f8e5m2") {
    return DType::kFloat8E5M2;
  }
  return std::nullopt;
}

std::optional<ReduceOp> parse_op(std::string_view s) {
  if (s == "sum") return ReduceOp::kSum;
  if (s == "min") return ReduceOp::kMin;
  if (s == "max") return ReduceOp::kMax;
  return std::nullopt;
}

}  // namespace ina
