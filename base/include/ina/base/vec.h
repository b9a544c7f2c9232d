// Portable SIMD pieces shared by the payload loops (the slot table's reduction in aggregator/,
// the result encoder and checksums in frame.cc): GCC/Clang vector types of 16 and 32 bytes and
// the byte swap of each 32-bit lane (wire order <-> host order).
//
// The loops using them are always-inlined templates instantiated inside functions compiled for a
// target (SSSE3, AVX2: [[gnu::target]]) and chosen at run time, so the permutation is lowered with
// that target: pshufb / vpshufb where there is a byte shuffle (kShuffle), shifts and masks where
// there is none (GCC lowers the permutation to scalar code there). Vectors go by reference, never
// by value: a 32-byte vector argument or return value outside AVX code changes the ABI (GCC's
// -Wpsabi), even where the helper is always inlined.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ina::vec {

// Whether the build's own target has a byte shuffle (DPDK's -march=corei7 does; baseline x86-64
// does not).
#if defined(__SSSE3__) || defined(__ARM_NEON)
inline constexpr bool kTargetShuffle = true;
#else
inline constexpr bool kTargetShuffle = false;
#endif

// (GCC drops vector_size on a type that depends on a template parameter: one specialization per
// width.)
template <size_t kBytes>
struct Vec;
template <>
struct Vec<16> {
  using U32 = uint32_t __attribute__((vector_size(16)));
  using I32 = int32_t __attribute__((vector_size(16)));
  using U8 = uint8_t __attribute__((vector_size(16)));
  static constexpr size_t kLanes = 4;
};
template <>
struct Vec<32> {
  using U32 = uint32_t __attribute__((vector_size(32)));
  using I32 = int32_t __attribute__((vector_size(32)));
  using U8 = uint8_t __attribute__((vector_size(32)));
  static constexpr size_t kLanes = 8;
};

// Byte-swaps each 32-bit lane of w in place.
template <size_t kBytes, bool kShuffle>
[[gnu::always_inline]] inline void bswap_lanes(typename Vec<kBytes>::U32& w) {
  using V = Vec<kBytes>;
  if constexpr (kShuffle && kBytes == 16) {
    const typename V::U8 b = reinterpret_cast<typename V::U8>(w);
    w = reinterpret_cast<typename V::U32>(
        __builtin_shufflevector(b, b, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12));
  } else if constexpr (kShuffle && kBytes == 32) {
    const typename V::U8 b = reinterpret_cast<typename V::U8>(w);
    w = reinterpret_cast<typename V::U32>(
        __builtin_shufflevector(b, b, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12, 19, 18,
                                17, 16, 23, 22, 21, 20, 27, 26, 25, 24, 31, 30, 29, 28));
  } else {
    w = (w >> 24) | ((w >> 8) & 0xFF00u) | ((w << 8) & 0xFF0000u) | (w << 24);
  }
}

// w = the kBytes / 4 big-endian 32-bit words at p (unaligned), in host order.
template <size_t kBytes, bool kShuffle>
[[gnu::always_inline]] inline void load_be(const uint8_t* p, typename Vec<kBytes>::U32& w) {
  std::memcpy(&w, p, sizeof w);
  bswap_lanes<kBytes, kShuffle>(w);
}

}  // namespace ina::vec
