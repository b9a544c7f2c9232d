// The avx2 table, for the avx512 one that starts from it (internal, x86-64 only).
#pragma once

#include "ina/kernels/codec.h"

namespace ina::kernels {
const CodecKernels& avx2_table();  // whether or not this CPU runs it
}  // namespace ina::kernels
