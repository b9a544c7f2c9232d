// Input blocks for the kernel tests: random and adversarial bit patterns of every float dtype,
// held as raw bytes (what a trainer passes). Shared by the CPU and CUDA kernel tests.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ina/base/half.h"
#include "ina/protocol/types.h"

namespace ina::kernels::testing {

struct Block {
  std::string name;
  DType t;
  std::vector<uint8_t> bytes;
  size_t n = 0;
  const void* data() const { return bytes.data(); }
};

inline void push(Block& b, float x) {
  if (b.t == DType::kFloat32) {
    uint8_t p[4];
    std::memcpy(p, &x, 4);
    b.bytes.insert(b.bytes.end(), p, p + 4);
  } else {
    const uint16_t h = b.t == DType::kFloat16 ? float_to_half(x) : float_to_bf16(x);
    uint8_t p[2];
    std::memcpy(p, &h, 2);
    b.bytes.insert(b.bytes.end(), p, p + 2);
  }
  ++b.n;
}

// A raw pattern of the dtype's width (the low 16 bits for the 16-bit types).
inline void push_bits(Block& b, uint32_t bits) {
  if (b.t == DType::kFloat32) {
    push(b, std::bit_cast<float>(bits));
    return;
  }
  const uint16_t h = static_cast<uint16_t>(bits);
  uint8_t p[2];
  std::memcpy(p, &h, 2);
  b.bytes.insert(b.bytes.end(), p, p + 2);
  ++b.n;
}

// Random float over the whole binade range of float32 (both signs).
inline float wide_random(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> e(-149, 127);
  std::uniform_real_distribution<double> m(1.0, 2.0);
  const double v = std::ldexp(m(rng), e(rng));
  return static_cast<float>(rng() & 1 ? -v : v);
}

// Block sizes that exercise every tail length of 8- and 16-lane loops and the usual 256.
inline std::vector<size_t> block_sizes() {
  std::vector<size_t> s;
  for (size_t n = 0; n <= 40; ++n) s.push_back(n);
  for (size_t n : {63u, 64u, 65u, 255u, 256u, 257u, 1000u, 4099u}) s.push_back(n);
  return s;
}

// The adversarial and random blocks of one dtype.
inline std::vector<Block> make_blocks(DType t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Block> out;
  auto add = [&](const std::string& name) -> Block& {
    out.push_back(Block{name, t, {}, 0});
    return out.back();
  };
  const float kInf = INFINITY;
  const float kNaN = std::bit_cast<float>(0x7FC00000u);

  for (size_t n : block_sizes()) {
    Block& b = add("wide/" + std::to_string(n));
    for (size_t i = 0; i < n; ++i) push(b, wide_random(rng));
  }
  {
    std::normal_distribution<float> g(0.0f, 1e-3f);
    Block& b = add("gaussian");
    for (int i = 0; i < 256; ++i) push(b, g(rng));
  }
  {
    Block& b = add("zeros");
    for (int i = 0; i < 256; ++i) push(b, i % 3 ? 0.0f : -0.0f);
  }
  {
    Block& b = add("one_huge");
    for (int i = 0; i < 256; ++i) push(b, i == 77 ? 3.0e4f : std::ldexp(1.0f, -20) * (i + 1));
  }
  {
    // Subnormals of the dtype (and of float32 for float32).
    Block& b = add("subnormals");
    const int lo = t == DType::kFloat32 ? -149 : (t == DType::kFloat16 ? -24 : -133);
    for (int i = 0; i < 256; ++i) {
      const float v = std::ldexp(static_cast<float>(i + 1), lo);
      push(b, i & 1 ? -v : v);
    }
  }
  for (const float special : {kNaN, kInf, -kInf, -kNaN}) {
    Block& b = add("special/" + std::to_string(std::bit_cast<uint32_t>(special)));
    for (int i = 0; i < 256; ++i) push(b, i == 100 ? special : wide_random(rng) * 1e-20f);
  }
  {
    // Signalling NaNs and NaN payloads, raw patterns.
    Block& b = add("nan_payloads");
    for (int i = 0; i < 64; ++i) {
      if (t == DType::kFloat32) {
        push_bits(
            b, (0x7F800001u + static_cast<uint32_t>(rng() % 0x7FFFFF)) | (i & 1 ? 0x80000000u : 0));
      } else {
        const uint32_t inf = t == DType::kFloat16 ? 0x7C00u : 0x7F80u;
        const uint32_t span = t == DType::kFloat16 ? 0x3FFu : 0x7Fu;
        push_bits(b, (inf + 1 + static_cast<uint32_t>(rng() % span)) | (i & 1 ? 0x8000u : 0));
      }
    }
  }
  {
    // Ties: with a block maximum just under 1 (exponent 0) the quantum is 2^-B; values at odd
    // multiples of 2^-(B+1) are exactly halfway, for B in 10..30 (16-bit types: fewer bits).
    for (int b_bits : {30, 27, 20, 14, 10}) {
      Block& b = add("ties/B" + std::to_string(b_bits));
      push(b, 0.96875f);
      for (int i = 0; i < 255; ++i) {
        const int k = static_cast<int>(rng() % 64) * 2 + 1;
        const float v =
            std::ldexp(static_cast<float>(k), -(b_bits + 1) + static_cast<int>(rng() % 6));
        push(b, i & 1 ? -v : v);
      }
    }
  }
  {
    Block& b = add("random_bits");
    for (int i = 0; i < 4096; ++i) push_bits(b, static_cast<uint32_t>(rng()));
  }
  if (t != DType::kFloat32) {
    // Every 16-bit pattern, as one buffer (and in 256-element blocks by the callers that scan).
    Block& b = add("all_16bit_patterns");
    for (uint32_t p = 0; p <= 0xFFFF; ++p) push_bits(b, p);
  }
  return out;
}

// The world sizes the tests encode for: B from 30 down to -2.
inline std::vector<uint32_t> world_sizes() {
  return {1, 2, 3, 8, 64, 1024, 65535, 1u << 20, 0xFFFFFFFFu};
}

// Shared exponents to try for a block whose own exponent is `own`: its own, a few above (other
// ranks had larger values), one below (a broken peer: the encoder saturates), none, extremes.
inline std::vector<int16_t> exponents_for(int16_t own) {
  std::vector<int16_t> e = {kNoExponent, -32767, -300, -149, -130, -100, 0,
                            1,           100,    128,  200,  300,  32767};
  if (own != kNoExponent) {
    for (int d : {0, 1, 2, 7, 31, -1, -3}) e.push_back(static_cast<int16_t>(own + d));
  }
  return e;
}

}  // namespace ina::kernels::testing
