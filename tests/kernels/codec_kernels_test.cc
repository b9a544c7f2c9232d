// Every codec kernel implementation this CPU runs (ina/kernels/codec.h) against the portable
// loops, bit for bit: every format, edge values (signed zeros, subnormals, the largest finite
// values, Inf, quiet and signalling NaNs with either sign, powers of two and their neighbours),
// random patterns, every length 0..80 and a long one (every tail), and source bytes at every
// offset 0..7 from a 64-byte boundary. A plain program (tests/check.h), so that the same source
// also runs cross-compiled under qemu-user (test codec_kernels_arm64, tests/arm64_check.sh: the
// NEON path).
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ina/kernels/codec.h"
#include "ina/kernels/elements.h"
#include "kernels/codec/dispatch.h"
#include "tests/check.h"

namespace {

using namespace ina::kernels;

constexpr Format kFloats[] = {Format::kF32, Format::kF16, Format::kBF16, Format::kE4M3,
                              Format::kE5M2};
constexpr Format kAll[] = {Format::kF32,  Format::kF16,  Format::kBF16,
                           Format::kE4M3, Format::kE5M2, Format::kI32};

size_t width(Format f) {
  switch (f) {
    case Format::kF32:
    case Format::kI32: return 4;
    case Format::kF16:
    case Format::kBF16: return 2;
    default: return 1;
  }
}
const char* fname(Format f) {
  static const char* const n[] = {"f32", "f16", "bf16", "e4m3", "e5m2", "i32"};
  return n[static_cast<int>(f)];
}

// The edge codes of a format (as the low bytes of a uint32).
std::vector<uint32_t> edges(Format f) {
  switch (f) {
    case Format::kF32:
    case Format::kI32:
      return {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007FFFFFu, 0x807FFFFFu,
              0x00800000u, 0x80800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F800000u, 0xFF800000u,
              0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x3F800000u,
              0xBF800000u, 0x3F7FFFFFu, 0x4B000000u, 0x4B000001u, 0x5E800000u, 0x5EFFFFFFu,
              0x7FFFFFFEu, 0x80000002u, 0x00400000u, 0x3EFFFFFFu};
    case Format::kF16:
    case Format::kBF16:
      return {0x0000u, 0x8000u, 0x0001u, 0x8001u, 0x03FFu, 0x007Fu, 0x0400u, 0x0080u,
              0x7BFFu, 0x7F7Fu, 0x7C00u, 0xFC00u, 0x7F80u, 0xFF80u, 0x7E00u, 0x7FC0u,
              0x7C01u, 0x7F81u, 0xFE00u, 0xFFFFu, 0x3C00u, 0x3F80u, 0xBC00u, 0x7FFFu};
    default:
      return {0x00u, 0x80u, 0x01u, 0x81u, 0x07u, 0x08u, 0x7Bu, 0x7Cu, 0x7Du,
              0x7Eu, 0x7Fu, 0xFCu, 0xFDu, 0xFEu, 0xFFu, 0x38u, 0x3Cu, 0xB8u};
  }
}

// n elements of format f: edge codes mixed into random ones.
std::vector<uint8_t> make(Format f, size_t n, std::mt19937_64& rng) {
  const size_t w = width(f);
  const std::vector<uint32_t> e = edges(f);
  std::vector<uint8_t> b(n * w);
  for (size_t i = 0; i < n; ++i) {
    uint32_t v = static_cast<uint32_t>(rng());
    const unsigned pick = static_cast<unsigned>(rng() % 4);
    if (pick == 0) {
      v = e[rng() % e.size()];
    } else if (pick == 1 && f == Format::kF32) {
      // A float near 1 (the gradients' range): exponent 120..130.
      v = (v & 0x807FFFFFu) | ((120u + static_cast<uint32_t>(rng() % 11)) << 23);
    }
    std::memcpy(b.data() + i * w, &v, w);
  }
  return b;
}

// A 64-byte aligned buffer with the bytes of `src` at offset `off`.
struct Placed {
  std::vector<uint64_t> store;
  uint8_t* p;
  Placed(const std::vector<uint8_t>& src, size_t off) : store(src.size() / 8 + 16) {
    auto base = reinterpret_cast<uintptr_t>(store.data());
    p = reinterpret_cast<uint8_t*>((base + 63) & ~uintptr_t{63}) + off;
    if (!src.empty()) std::memcpy(p, src.data(), src.size());
  }
};

std::vector<int64_t> random_acc(size_t n, std::mt19937_64& rng, int bits) {
  std::vector<int64_t> a(n);
  for (auto& x : a) {
    const auto r = static_cast<int64_t>(rng());
    x = bits >= 64 ? r : r >> (64 - bits);
  }
  return a;
}

int g_cases = 0;

void check_impl(const CodecKernels& k, const CodecKernels& ref, size_t n, size_t off,
                std::mt19937_64& rng) {
  char where[96];
  for (Format f : kAll) {
    std::snprintf(where, sizeof where, "%s %s n=%zu off=%zu", k.name, fname(f), n, off);
    const std::vector<uint8_t> data = make(f, n, rng);
    const Placed in(data, off);
    ++g_cases;
    if (f != Format::kI32) {
      // The magnitude scan, with SUM's and MIN/MAX's first non-finite code.
      for (uint32_t extra : {0u, 1u}) {
        uint32_t bad = 0;
        with_float(f, [&]<class E>(E) { bad = E::kInf + (E::kHasInf ? extra : 0u); });
        uint32_t t1 = 1, t2 = 2;
        bool n1 = true, n2 = false;
        k.scan_codes(f, in.p, n, bad, &t1, &n1);
        ref.scan_codes(f, in.p, n, bad, &t2, &n2);
        CHECK(t1 == t2 && n1 == n2, "%s: scan (bad %u): top %u/%u nonfinite %d/%d", where, bad, t1,
              t2, n1, n2);
      }
      // widen
      if (f != Format::kF32) {
        std::vector<float> a(n + 1, -1.0f), b(n + 1, -1.0f);
        k.widen(f, in.p, n, a.data());
        ref.widen(f, in.p, n, b.data());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0, "%s: widen", where);
      }
      // from_keys32 of valid keys (the portable keys of the elements), to a destination at
      // offset `off`: the same bytes, and every element but a NaN as it was.
      {
        const size_t w = width(f);
        std::vector<int32_t> key(n);
        ref.keys32(f, KeyFold::kStore, in.p, n, key.data());
        std::vector<uint8_t> a(n * w + 16, 0xA5), b(n * w + 16, 0xA5);
        k.from_keys32(f, key.data(), n, a.data() + off);
        ref.from_keys32(f, key.data(), n, b.data() + off);
        bool same = true;
        with_float(f, [&]<class E>(E) {
          for (size_t i = 0; i < n; ++i) {
            const float x = E::to_float(load<E>(in.p, i));
            same = same && (x != x || load<E>(b.data() + off, i) == load<E>(in.p, i));
          }
        });
        CHECK(a == b && same, "%s: from_keys32", where);
      }
    }
    // keys32: store, MIN and MAX into random int32 accumulators at word offsets 0..3, against
    // the plain fold of the keys (int32: the element; floats: ordered() of the widened value).
    std::vector<int32_t> plain(n);
    for (size_t i = 0; i < n; ++i) {
      if (!with_float(f, [&]<class E>(E) { plain[i] = ordered(E::to_float(load<E>(in.p, i))); })) {
        plain[i] = static_cast<int32_t>(load<F32>(in.p, i));
      }
    }
    for (KeyFold op : {KeyFold::kStore, KeyFold::kMin, KeyFold::kMax}) {
      for (size_t s = 0; s < 4; ++s) {
        std::vector<int32_t> c(n + 8), d(n + 8);
        for (size_t i = 0; i < n + 8; ++i) c[i] = d[i] = static_cast<int32_t>(rng());
        std::vector<int32_t> want(c);
        for (size_t i = 0; i < n; ++i) {
          int32_t& wi = want[s + i];
          wi = op == KeyFold::kStore ? plain[i]
               : op == KeyFold::kMin ? std::min(wi, plain[i])
                                     : std::max(wi, plain[i]);
        }
        k.keys32(f, op, in.p, n, c.data() + s);
        ref.keys32(f, op, in.p, n, d.data() + s);
        CHECK(c == d && d == want, "%s: keys32 op %d acc+%zu", where, static_cast<int>(op), s);
      }
    }
  }
  // The float32 quantizer: scales from a block exponent E near the data's, a low E (saturation),
  // a high one (everything rounds, ties included), B = 62 - 2 and 30 - 3; add and overwrite.
  {
    std::snprintf(where, sizeof where, "%s f32 n=%zu off=%zu", k.name, n, off);
    const std::vector<uint8_t> data = make(Format::kF32, n, rng);
    const Placed in(data, off);
    for (int b : {60, 27}) {
      for (int e : {1, -3, 40, -149, 129, 60}) {
        const double scale = pow2(b - e);
        const double limit = pow2(b);
        for (bool add : {false, true}) {
          const std::vector<int64_t> init = random_acc(n + 8, rng, 40);
          std::vector<int64_t> a(init), c(init);
          k.quantize_f32(in.p, n, scale, limit, a.data() + 1, add);
          ref.quantize_f32(in.p, n, scale, limit, c.data() + 1, add);
          CHECK(a == c, "%s: quantize B=%d E=%d add=%d", where, b, e, add);
        }
      }
    }
    // int32 SUM (modulo 2^32) and MIN/MAX in int32, into random accumulators at word offsets
    // 0..3, against the plain loop (float32 patterns as int32: edge words, random ones).
    for (WordFold op : {WordFold::kAdd, WordFold::kMin, WordFold::kMax}) {
      for (size_t s = 0; s < 4; ++s) {
        std::vector<int32_t> wa(n + 8), wc(n + 8);
        for (size_t i = 0; i < n + 8; ++i) wa[i] = wc[i] = static_cast<int32_t>(rng());
        std::vector<int32_t> want(wa);
        for (size_t i = 0; i < n; ++i) {
          const uint32_t x = load<F32>(in.p, i);
          int32_t& wi = want[s + i];
          wi = op == WordFold::kAdd   ? static_cast<int32_t>(static_cast<uint32_t>(wi) + x)
               : op == WordFold::kMin ? std::min(wi, static_cast<int32_t>(x))
                                      : std::max(wi, static_cast<int32_t>(x));
        }
        k.fold_int32(op, in.p, n, wa.data() + s);
        ref.fold_int32(op, in.p, n, wc.data() + s);
        CHECK(wa == wc && wc == want, "%s: fold_int32 op %d acc+%zu", where, static_cast<int>(op),
              s);
      }
    }
  }
  // The fused float SUM completion (where the table has one), every format, 0..5 ranks whose
  // blocks lie at an odd stride but the last, which lies apart at an odd address (a round
  // completed from its last datagram): against the portable loops it stands for (widen,
  // quantize_f32 adding rank by rank, dequantize_*), which is what the codec runs where a table
  // has none.
  if (k.quantize_sum != nullptr) {
    for (Format f : kFloats) {
      const size_t w = width(f);
      for (size_t ranks : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{5}}) {
        const size_t stride = n * w + 8 * w + 3;
        std::vector<uint8_t> data(ranks * stride);
        for (size_t r = 0; r < ranks; ++r) {
          const std::vector<uint8_t> block = make(f, n, rng);
          if (n > 0) std::memcpy(data.data() + r * stride, block.data(), block.size());
        }
        const Placed in(data, off);
        std::vector<const uint8_t*> src(ranks);
        for (size_t r = 0; r < ranks; ++r) src[r] = in.p + r * stride;
        std::vector<uint8_t> apart(n * w + 1);
        if (ranks > 0 && n > 0) {
          std::memcpy(apart.data() + 1, src[ranks - 1], n * w);
          src[ranks - 1] = apart.data() + 1;
        }
        for (int b : {60, 27}) {
          for (int e : {1, -3, 40, -149, 129, 60}) {
            std::snprintf(where, sizeof where, "%s %s n=%zu off=%zu ranks=%zu B=%d E=%d", k.name,
                          fname(f), n, off, ranks, b, e);
            const double scale = pow2(b - e);
            const double limit = pow2(b);
            const float m = std::bit_cast<float>(
                static_cast<uint32_t>(127 + std::clamp(e - b, -126, 127)) << 23);
            std::vector<uint8_t> a(n * w + 16, 0x5A), c(n * w + 16, 0x5A);
            k.quantize_sum(f, src.data(), ranks, n, scale, limit, m, false, a.data() + off % 4);
            std::vector<int64_t> q(n, 0);
            std::vector<float> x(n);
            for (size_t r = 0; r < ranks; ++r) {
              const uint8_t* blk = src[r];
              if (f != Format::kF32) ref.widen(f, blk, n, x.data());
              ref.quantize_f32(f == Format::kF32 ? static_cast<const void*>(blk) : x.data(), n,
                               scale, limit, q.data(), true);
            }
            if (f == Format::kF32) {
              ref.dequantize_f32(q.data(), n, m, c.data() + off % 4);
            } else {
              ref.dequantize_narrow(f, q.data(), n, m, c.data() + off % 4);
            }
            CHECK(a == c, "%s: quantize_sum", where);
            if (k.quantize_sum_words != nullptr) {
              // The same sums as words: Q's low 8 (float32) or 4 bytes, little-endian.
              const size_t ww = f == Format::kF32 ? 8 : 4;
              std::vector<uint8_t> wa(n * ww + 16, 0x5A), wc(n * ww + 16, 0x5A);
              k.quantize_sum_words(f, src.data(), ranks, n, scale, limit, wa.data() + off % 4);
              for (size_t i = 0; i < n; ++i) std::memcpy(wc.data() + off % 4 + i * ww, &q[i], ww);
              CHECK(wa == wc, "%s: quantize_sum_words", where);
            }
          }
        }
      }
    }
  }
  // The dequantizers: sums of up to 2^62 (and edges) at scales 2^-126 .. 2^127.
  {
    std::vector<int64_t> q = random_acc(n, rng, 63);
    const int64_t qe[] = {0,
                          1,
                          -1,
                          2,
                          (int64_t{1} << 24) + 1,
                          -((int64_t{1} << 24) + 3),
                          (int64_t{1} << 30) - 1,
                          -(int64_t{1} << 30),
                          int64_t{1} << 62,
                          -(int64_t{1} << 62),
                          (int64_t{1} << 53) + 1,
                          0x7FFFFFFF,
                          12345};
    for (size_t i = 0; i < n; ++i) {
      const unsigned pick = static_cast<unsigned>(rng() % 5);
      if (pick == 0) q[i] = qe[rng() % (sizeof qe / sizeof qe[0])];
      if (pick == 1) q[i] >>= 33;  // an honest narrow sum: |Q| < 2^30
      if (pick == 2) {
        // Just past a tie of a narrow type (p = its significand bits + 1): only the sticky bit of
        // the rounding to odd at 24 bits tells it from the tie itself.
        const int top = 26 + static_cast<int>(rng() % 30);
        const int p = std::array{3, 4, 8, 9, 11, 12}[rng() % 6];
        const int64_t v = (int64_t{1} << top) + (int64_t{1} << (top - p)) + 1;
        q[i] = rng() % 2 ? v : -v;
      }
    }
    for (int s : {-126, -100, -60, -24, 0, 30, 64, 100, 127}) {
      const float m = std::bit_cast<float>(static_cast<uint32_t>(127 + s) << 23);
      for (Format f : kFloats) {
        std::snprintf(where, sizeof where, "%s %s n=%zu off=%zu scale=%d", k.name, fname(f), n, off,
                      s);
        std::vector<uint8_t> a(n * width(f) + 16, 0x5A), c(n * width(f) + 16, 0x5A);
        if (f == Format::kF32) {
          k.dequantize_f32(q.data(), n, m, a.data() + off);
          ref.dequantize_f32(q.data(), n, m, c.data() + off);
        } else {
          k.dequantize_narrow(f, q.data(), n, m, a.data() + off);
          ref.dequantize_narrow(f, q.data(), n, m, c.data() + off);
        }
        CHECK(a == c, "%s: dequantize", where);
      }
    }
  }
}

}  // namespace

int main() {
  const CodecKernels& ref = portable_codec_kernels();
  std::printf("implementations this CPU runs:");
  for (const CodecKernels* k : codec_implementations()) std::printf(" %s", k->name);
  std::printf("; chosen: %s\n", codec_kernels().name);
  CHECK(codec_implementations().back() == &ref, "the portable implementation is always there");
  CHECK(codec_implementations().front() == &codec_kernels(), "the best one is chosen");
  CHECK(!set_codec_kernels_for_testing("no-such-isa"), "an unknown name is refused");
  CHECK(set_codec_kernels_for_testing("portable") && &codec_kernels() == &ref, "override");
  CHECK(set_codec_kernels_for_testing("") && &codec_kernels() == codec_implementations()[0],
        "back to the best");
  std::mt19937_64 rng(20261206);
  for (const CodecKernels* k : codec_implementations()) {
    if (k == &ref) continue;
    const int before = ina::testing::g_failures;
    for (size_t n = 0; n <= 80; ++n) {
      for (size_t off = 0; off < 8; ++off) check_impl(*k, ref, n, off, rng);
    }
    for (size_t off = 0; off < 8; off += 3) check_impl(*k, ref, 4099, off, rng);
    std::printf("%s: %s\n", k->name, ina::testing::g_failures == before ? "ok" : "DIFFERS");
  }
  std::printf("%d cases, %d failures\n", g_cases, ina::testing::g_failures);
  return ina::testing::g_failures == 0 ? 0 : 1;
}
