// Element-wise reduction of host buffers, the arithmetic of every host collective.
//
//   int32     SUM wraps modulo 2^32 (two's complement, as the in-network path does); MIN/MAX exact.
//   float32   IEEE float arithmetic.
//   float16,  each element is widened to float32 (exact), combined in float32, and rounded back
//   bfloat16, to its type (round to nearest even; float8 e4m3 saturates at +-448, fp8.h) at every
//   float8    step: convert, add, round.
//             A result therefore carries one 16-bit rounding per reduction step it went through
//             (at most world_size - 1 of them), each at most half an ulp of the partial sum.
//             The communicator avoids that for SUM: its float-mode AllReduce and its
//             reduce_scatter widen 16- and 8-bit buffers to float32 first and round once at
//             the end.
//   MIN/MAX   a NaN in either operand gives NaN (so a NaN anywhere reaches every rank); -0 < +0
//             (MIN of -0 and +0 is -0, MAX is +0, in any order), as on the in-network path.
//
// Every algorithm reduces each element along one fixed chain of ranks and then distributes that
// single result, so all ranks end with bitwise identical outputs.
#pragma once

#include <cstddef>

#include "ina/protocol/types.h"

namespace ina::host {

// acc[i] = op(acc[i], in[i]) for n elements of type t. acc and in must not overlap. int32 and
// float32 run 4 lanes at a time (GCC vector extensions, SSE2 on any x86-64); the 16- and 8-bit
// types convert element by element.
void reduce_into(void* acc, const void* in, size_t n, DType t, ReduceOp op);

}  // namespace ina::host
