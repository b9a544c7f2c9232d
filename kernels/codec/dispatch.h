// Format -> element traits, for the implementations in kernels/codec/ (internal).
#pragma once

#include "ina/kernels/codec.h"
#include "ina/kernels/elements.h"

namespace ina::kernels {

// Calls f(E{}) with the traits of float format t; false for kI32.
template <class F>
bool with_float(Format t, F&& f) {
  switch (t) {
    case Format::kF32: f(F32{}); return true;
    case Format::kF16: f(F16{}); return true;
    case Format::kBF16: f(BF16{}); return true;
    case Format::kE4M3: f(E4M3{}); return true;
    case Format::kE5M2: f(E5M2{}); return true;
    case Format::kI32: return false;
  }
  return false;
}

inline KeyOp key_op(KeyFold k) {
  return k == KeyFold::kStore ? KeyOp::kStore : k == KeyFold::kMax ? KeyOp::kMax : KeyOp::kMin;
}

}  // namespace ina::kernels
