// The choice of the codec implementation: the best the CPU runs, once, at the first call;
// tests set another by name (set_codec_kernels_for_testing).
#include <array>
#include <atomic>

#include "ina/kernels/codec.h"

namespace ina::kernels {
namespace {

struct Available {
  std::array<const CodecKernels*, 5> list{};
  size_t n = 0;
};

const Available& available() {
  static const Available a = [] {
    Available r;
    for (const CodecKernels* k :
         {avx512bf16_codec_kernels(), avx512_codec_kernels(), avx2_codec_kernels(),
          neon_codec_kernels(), &portable_codec_kernels()}) {
      if (k != nullptr) r.list[r.n++] = k;
    }
    return r;
  }();
  return a;
}

std::atomic<const CodecKernels*> g_active{nullptr};

}  // namespace

const CodecKernels& codec_kernels() {
  const CodecKernels* k = g_active.load(std::memory_order_acquire);
  if (k == nullptr) {
    k = available().list[0];
    g_active.store(k, std::memory_order_release);
  }
  return *k;
}

std::span<const CodecKernels* const> codec_implementations() {
  const Available& a = available();
  return {a.list.data(), a.n};
}

bool set_codec_kernels_for_testing(std::string_view name) {
  for (const CodecKernels* k : codec_implementations()) {
    if (name.empty() || name == k->name) {
      g_active.store(k, std::memory_order_release);
      return true;
    }
  }
  return false;
}

}  // namespace ina::kernels
