// The packet MAC (mac.h): POLYVAL, then SipHash-2-4 over its value and the length.
//
// POLYVAL works in GF(2^128) modulo P = x^128 + x^127 + x^126 + x^121 + 1, a block's 16 bytes read
// little-endian (bit i of the 128-bit integer is the coefficient of x^i), and multiplies with
// dot(a, b) = a * b * x^-128 mod P: S_0 = 0, S_j = dot(S_{j-1} ^ X_j, H). Unrolled over r blocks,
// S_r = dot(S_0 ^ X_1, H^r) ^ dot(X_2, H^(r-1)) ^ ... ^ dot(X_r, H), with H^k the dot-powers of H
// (mac.h, MacKey::hrev); since dot is a product followed by one multiplication by x^-128, the r
// 256-bit carry-less products are XORed first and reduced once (aggregated reduction, as in the
// AES-GCM-SIV implementations): r up to 8 with 128-bit vectors, up to kMacFold = 32 with 512-bit
// ones. Each product takes three multiplies (Karatsuba).
//
// The same loops serve the receive pass (packet_mac_copy): every vector a fold loads to multiply
// is also handed to a sink, which does nothing (the MAC alone), stores it at the same offset of a
// destination (verify and copy in one read of the datagram) or also scans its 4-byte lanes as
// float32 magnitude codes (verify, copy and scan). The sink is a template parameter, so the MAC
// alone compiles to the loops it always was.
#include "ina/protocol/mac.h"

#include <algorithm>
#include <cstring>

#if defined(__aarch64__)
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_epi32() (a self-initialized variable),
// which -Wmaybe-uninitialized reports once inlined (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

#include "ina/protocol/siphash.h"

namespace ina {

namespace {

// x^-128 mod P, the Montgomery factor of dot() (POLYVAL's order).
constexpr Gf128 kXInv128{0x0000000000000001ull, 0x9204000000000000ull};

// a * b mod P, one bit of b at a time (constant time: masks, no branches on the operands).
Gf128 gf_mul(Gf128 a, const Gf128& b) {
  Gf128 r;
  for (int i = 0; i < 128; ++i) {
    const uint64_t bit = (i < 64 ? b.lo >> i : b.hi >> (i - 64)) & 1;
    const uint64_t m = 0 - bit;
    r.lo ^= a.lo & m;
    r.hi ^= a.hi & m;
    // a *= x: x^128 = x^127 + x^126 + x^121 + 1 (mod P).
    const uint64_t carry = 0 - (a.hi >> 63);
    a.hi = (a.hi << 1) | (a.lo >> 63);
    a.lo = (a.lo << 1) ^ (carry & 1);
    a.hi ^= carry & 0xC200000000000000ull;
  }
  return r;
}

Gf128 load_block(const uint8_t* p) {
  Gf128 x;
  std::memcpy(&x.lo, p, 8);
  std::memcpy(&x.hi, p + 8, 8);
  return x;
}

// What a pass does beside the MAC with the bytes it reads (packet_mac_copy): copy them to `dst`
// (the bytes at src0 + i to dst + i) and, with kScan, scan them as float32 magnitude codes (4-byte
// lanes, sign cleared): the largest one below `bad` into top, and whether any is >= bad.
struct PassOut {
  const uint8_t* src0 = nullptr;
  uint8_t* dst = nullptr;
  bool stream = false;  // dst is CopyDst::kStream: prefetch ahead of the stores
  uint32_t bad = 0;
  uint32_t top = 0;
  bool nonfinite = false;
};

// Software prefetch ahead of a pass. Where the bytes a pass reads (a user's buffer sealed as it
// is sent) or writes (a result copied into the user's buffer) are not in cache, the fold's own
// loads and stores keep too few lines in flight: the MAC then ran at half a memcpy's speed over
// the same cold bytes (7-8 against 16 GB/s on a 2-core Xeon VM), the verify-and-copy at 0.7x.
// Each fold of the vector loops therefore asks for the lines kPrefetchAhead bytes past the ones it
// reads (the MAC alone) or, for a copy into a stream (CopyDst::kStream; its source is a datagram
// just received, in cache), past the ones it writes: within a datagram, and past its end into what
// a stream of consecutive blocks touches next. So the cold MAC runs at 14-15 GB/s and the
// verify-and-copy into a cold buffer at 13 (a plain memcpy 11). A copy into resident storage (the
// aggregator's slots) prefetches nothing: there the lines ahead are other slots' words, and asking
// for them cost the aggregator's pass 1.3x. The addresses are hints (a prefetch never faults),
// formed as integers since they may lie past the buffer. Always inlined: GCC 12 deems a function
// of prefetches alone free of effects and drops the calls.
constexpr uintptr_t kPrefetchAhead = 4096;

template <bool kCopy>
[[gnu::always_inline]] inline void prefetch_fold(const uint8_t* p, size_t bytes, const PassOut* o) {
  uintptr_t at = reinterpret_cast<uintptr_t>(p) + kPrefetchAhead;
  if constexpr (kCopy) {
    if (!o->stream) return;
    at += reinterpret_cast<uintptr_t>(o->dst) - reinterpret_cast<uintptr_t>(o->src0);
  }
  for (size_t q = 0; q < bytes; q += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(at + q), kCopy ? 1 : 0, 3);
}

// float32's first non-finite magnitude code: the largest finite code is the largest below it,
// whatever `bad` (MIN/MAX count only NaN non-finite; an Inf is still no finite magnitude).
constexpr uint32_t kF32Inf = 0x7F800000u;

// The scan of `bytes` bytes (a multiple of 4) as magnitude codes, one at a time.
void scan_codes(const uint8_t* p, size_t bytes, PassOut* o) {
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    uint32_t v;
    std::memcpy(&v, p + i, 4);
    v &= 0x7FFFFFFFu;
    if (v >= o->bad) o->nonfinite = true;
    if (v < kF32Inf && v > o->top) o->top = v;
  }
}

// The sinks: what happens to each vector of the datagram a loop loads. kCopy stores it, kScan
// scans it; with neither, nothing (the MAC alone).
template <bool kCopy, bool kScan>
struct PortableSink {
  PassOut* o;
  void operator()(const uint8_t* p16) const {
    if constexpr (kCopy) std::memcpy(o->dst + (p16 - o->src0), p16, 16);
    if constexpr (kScan) scan_codes(p16, 16, o);
  }
};

// S after `n` whole blocks at p, portably: S = (S ^ X) * h * x^-128.
template <class Sink>
Gf128 blocks_portable(Gf128 s, const uint8_t* p, size_t n, const Gf128& h_mont, const Sink& sink) {
  for (size_t j = 0; j < n; ++j, p += 16) {
    const Gf128 x = load_block(p);
    sink(p);
    s = gf_mul(Gf128{s.lo ^ x.lo, s.hi ^ x.hi}, h_mont);
  }
  return s;
}

#if defined(__x86_64__)
#define INA_CLMUL [[gnu::target("pclmul,avx")]]
#define INA_CLMUL512 [[gnu::target("pclmul,avx,avx2,avx512f,vpclmulqdq")]]

// hi:lo * x^-128 mod P (Montgomery reduction; poly's high word 0xC2..00 is P's x^127, x^126 and
// x^121 terms moved down by 64, its low word the x^0 term).
INA_CLMUL inline __m128i reduce(__m128i lo, __m128i hi) {
  const __m128i poly = _mm_set_epi64x(static_cast<long long>(0xC200000000000000ull), 1);
  __m128i t = _mm_clmulepi64_si128(lo, poly, 0x10);
  lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4E), t);
  t = _mm_clmulepi64_si128(lo, poly, 0x10);
  lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4E), t);
  return _mm_xor_si128(hi, lo);
}

// The 256-bit product's three Karatsuba terms, reduced: lo = a0 b0, hi = a1 b1, and
// kara = (a0 ^ a1)(b0 ^ b1), whose XOR with lo and hi is the middle term a0 b1 ^ a1 b0.
INA_CLMUL inline __m128i reduce_karatsuba(__m128i lo, __m128i hi, __m128i kara) {
  const __m128i mid = _mm_xor_si128(kara, _mm_xor_si128(lo, hi));
  return reduce(_mm_xor_si128(lo, _mm_slli_si128(mid, 8)),
                _mm_xor_si128(hi, _mm_srli_si128(mid, 8)));
}

INA_CLMUL inline __m128i to_m128(const Gf128& x) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(&x));
}
INA_CLMUL inline Gf128 from_m128(__m128i v) {
  Gf128 x;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&x), v);
  return x;
}

// The 128-bit sink (PortableSink's work on a loaded vector); the scan keeps its state in vectors
// until finish().
template <bool kCopy, bool kScan>
struct Sink128 {
  // PassOut's fields as values (the stores may alias anything: no reloads through `o`).
  PassOut* o;
  uint8_t* dst = o != nullptr ? o->dst : nullptr;
  const uint8_t* src0 = o != nullptr ? o->src0 : nullptr;
  int bad_minus_1 = o != nullptr ? static_cast<int>(o->bad - 1) : 0;
  __m128i top = _mm_setzero_si128();
  __m128i seen = _mm_setzero_si128();  // lanes that held a code >= bad
  INA_CLMUL void operator()(const __m128i& v, const uint8_t* at) {
    if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (at - src0)), v);
    if constexpr (kScan) {
      const __m128i m = _mm_and_si128(v, _mm_set1_epi32(0x7FFFFFFF));
      // Codes are below 2^31: signed compares and max.
      seen = _mm_or_si128(seen, _mm_cmpgt_epi32(m, _mm_set1_epi32(bad_minus_1)));
      const __m128i inf = _mm_cmpgt_epi32(m, _mm_set1_epi32(static_cast<int>(kF32Inf - 1)));
      top = _mm_max_epi32(top, _mm_andnot_si128(inf, m));
    }
  }
  INA_CLMUL void finish() {
    if constexpr (kScan) {
      alignas(16) uint32_t t[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(t), top);
      for (uint32_t x : t) o->top = std::max(o->top, x);
      o->nonfinite = o->nonfinite || _mm_testz_si128(seen, seen) == 0;
    }
  }
};

// r (1..8) blocks at p folded into s with one reduction: block j takes hp[j], hp = the key's
// hrev + kMacFold - r (the powers r down to 1).
template <class Sink>
INA_CLMUL inline __m128i fold128(__m128i s, const uint8_t* p, size_t r, const Gf128* hp,
                                 Sink& sink) {
  __m128i lo = _mm_setzero_si128(), hi = _mm_setzero_si128(), kara = _mm_setzero_si128();
  for (size_t j = 0; j < r; ++j) {
    __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j));
    sink(y, p + 16 * j);
    if (j == 0) y = _mm_xor_si128(y, s);
    const __m128i h = to_m128(hp[j]);
    lo = _mm_xor_si128(lo, _mm_clmulepi64_si128(y, h, 0x00));
    hi = _mm_xor_si128(hi, _mm_clmulepi64_si128(y, h, 0x11));
    const __m128i ys = _mm_xor_si128(y, _mm_shuffle_epi32(y, 0x4E));
    const __m128i hs = _mm_xor_si128(h, _mm_shuffle_epi32(h, 0x4E));
    kara = _mm_xor_si128(kara, _mm_clmulepi64_si128(ys, hs, 0x00));
  }
  return reduce_karatsuba(lo, hi, kara);
}

// dot(a, b): one block a folded into a zero state with the power b.
INA_CLMUL Gf128 dot_clmul(const Gf128& a, const Gf128& b) {
  Sink128<false, false> none{nullptr};
  return from_m128(fold128(_mm_setzero_si128(), reinterpret_cast<const uint8_t*>(&a), 1, &b, none));
}

template <bool kCopy, bool kScan>
INA_CLMUL Gf128 blocks_clmul(const Gf128& s0, const uint8_t* p, size_t n, const MacKey& k,
                             PassOut* o) {
  static_assert(sizeof(Gf128) == 16, "Gf128 is loaded as one 16-byte vector");
  Sink128<kCopy, kScan> sink{o};
  __m128i s = to_m128(s0);
  while (n > 0) {
    const size_t r = n < 8 ? n : 8;
    prefetch_fold<kCopy>(p, 16 * r, o);
    s = fold128(s, p, r, k.hrev + (kMacFold - r), sink);
    p += 16 * r;
    n -= r;
  }
  sink.finish();
  return from_m128(s);
}

INA_CLMUL512 inline __m128i xor_lanes(__m512i v) {
  const __m256i h = _mm256_xor_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  return _mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// The 512-bit sink: a vector of four blocks, stored under the mask it was loaded with.
template <bool kCopy, bool kScan>
struct Sink512 {
  PassOut* o;
  uint8_t* dst;
  const uint8_t* src0;
  int bad;
  __m512i top;
  __mmask16 seen = 0;
  INA_CLMUL512 explicit Sink512(PassOut* out)
      : o(out),
        dst(out != nullptr ? out->dst : nullptr),
        src0(out != nullptr ? out->src0 : nullptr),
        bad(out != nullptr ? static_cast<int>(out->bad) : 0),
        top(_mm512_setzero_si512()) {}
  INA_CLMUL512 void operator()(const __m512i& v, const uint8_t* at, __mmask8 m = 0xFF) {
    if constexpr (kCopy) _mm512_mask_storeu_epi64(dst + (at - src0), m, v);
    if constexpr (kScan) {
      // Lanes past the mask were loaded as zeros: code 0, which changes nothing.
      const __m512i c = _mm512_and_si512(v, _mm512_set1_epi32(0x7FFFFFFF));
      const __mmask16 b = _mm512_cmpge_epu32_mask(c, _mm512_set1_epi32(bad));
      seen = static_cast<__mmask16>(seen | b);
      const __mmask16 fin = _mm512_cmplt_epu32_mask(c, _mm512_set1_epi32(kF32Inf));
      top = _mm512_mask_max_epu32(top, fin, top, c);
    }
  }
  INA_CLMUL512 void finish() {
    if constexpr (kScan) {
      alignas(64) uint32_t t[16];
      _mm512_store_si512(t, top);
      for (uint32_t x : t) o->top = std::max(o->top, x);
      o->nonfinite = o->nonfinite || seen != 0;
    }
  }
};

// r (1..kMacFold) blocks at p folded into s with one reduction, four blocks per vector; a last
// group of fewer than four is loaded under a mask (the lanes past it multiply zeros).
template <class Sink>
INA_CLMUL512 inline __m128i fold512(__m128i s, const uint8_t* p, size_t r, const Gf128* hp,
                                    Sink& sink) {
  __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512(), kara = _mm512_setzero_si512();
  for (size_t j = 0; j < r; j += 4) {
    const size_t left = r - j;
    const __mmask8 m = left >= 4 ? __mmask8{0xFF} : static_cast<__mmask8>((1u << (2 * left)) - 1);
    __m512i y = _mm512_maskz_loadu_epi64(m, p + 16 * j);
    sink(y, p + 16 * j, m);
    if (j == 0) y = _mm512_xor_si512(y, _mm512_zextsi128_si512(s));
    const __m512i h = _mm512_maskz_loadu_epi64(m, hp + j);
    lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(y, h, 0x00));
    hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(y, h, 0x11));
    const __m512i ys = _mm512_xor_si512(y, _mm512_shuffle_epi32(y, _MM_PERM_BADC));
    const __m512i hs = _mm512_xor_si512(h, _mm512_shuffle_epi32(h, _MM_PERM_BADC));
    kara = _mm512_xor_si512(kara, _mm512_clmulepi64_epi128(ys, hs, 0x00));
  }
  return reduce_karatsuba(xor_lanes(lo), xor_lanes(hi), xor_lanes(kara));
}

// The reduction of a schoolbook product: lo = a0 b0, hi = a1 b1, mid = a0 b1 ^ a1 b0.
INA_CLMUL inline __m128i reduce_schoolbook(__m128i lo, __m128i hi, __m128i mid) {
  return reduce(_mm_xor_si128(lo, _mm_slli_si128(mid, 8)),
                _mm_xor_si128(hi, _mm_srli_si128(mid, 8)));
}

// kMacFold whole blocks at p folded into s, the key's powers already in registers (hv[i] holds
// hrev[4i .. 4i + 3]). Four multiplies per 128-bit product instead of Karatsuba's three: the
// Karatsuba operands cost a shuffle each, on the same port as the multiply. The state enters
// with the first group, whose product is added last, so that only one multiply, the lane sums
// and the reduction lie between one run's state and the next.
template <class Sink>
INA_CLMUL512 inline __m128i fold512_full(__m128i s, const uint8_t* p, const __m512i* hv,
                                         Sink& sink) {
  static_assert(kMacFold == 32, "eight groups of four blocks");
  __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512(), mid = _mm512_setzero_si512();
  for (size_t j = 1; j < 8; ++j) {
    const __m512i y = _mm512_loadu_si512(p + 64 * j);
    sink(y, p + 64 * j);
    lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(y, hv[j], 0x00));
    hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(y, hv[j], 0x11));
    mid = _mm512_ternarylogic_epi64(mid, _mm512_clmulepi64_epi128(y, hv[j], 0x01),
                                    _mm512_clmulepi64_epi128(y, hv[j], 0x10), 0x96);
  }
  const __m512i y0 = _mm512_loadu_si512(p);
  sink(y0, p);
  const __m512i y = _mm512_xor_si512(y0, _mm512_zextsi128_si512(s));
  lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(y, hv[0], 0x00));
  hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(y, hv[0], 0x11));
  mid = _mm512_ternarylogic_epi64(mid, _mm512_clmulepi64_epi128(y, hv[0], 0x01),
                                  _mm512_clmulepi64_epi128(y, hv[0], 0x10), 0x96);
  return reduce_schoolbook(xor_lanes(lo), xor_lanes(hi), xor_lanes(mid));
}

template <bool kCopy, bool kScan>
INA_CLMUL512 Gf128 blocks_clmul512(const Gf128& s0, const uint8_t* p, size_t n, const MacKey& k,
                                   PassOut* o) {
  Sink512<kCopy, kScan> sink(o);
  __m128i s = to_m128(s0);
  if (n >= kMacFold) {
    __m512i hv[kMacFold / 4];
    for (size_t i = 0; i < kMacFold / 4; ++i) hv[i] = _mm512_loadu_si512(k.hrev + 4 * i);
    do {
      prefetch_fold<kCopy>(p, 16 * kMacFold, o);
      s = fold512_full(s, p, hv, sink);
      p += 16 * kMacFold;
      n -= kMacFold;
    } while (n >= kMacFold);
  }
  while (n > 0) {
    const size_t r = n < kMacFold ? n : kMacFold;
    s = fold512(s, p, r, k.hrev + (kMacFold - r), sink);
    p += 16 * r;
    n -= r;
  }
  sink.finish();
  return from_m128(s);
}

// packet_mac_many's lockstep (mac.h): POLYVAL of kLanes datagrams of one length, in folds of
// kMacFold blocks from the first byte (fold_lane), each fold done for every lane before the next:
// the lanes' reductions are independent, so they overlap where one datagram's would wait for each
// other. No prefetching: the datagrams are a burst just received, in cache.
constexpr size_t kLanes = 4;

// As at the top: GCC 12 also reports the inlined _mm512_undefined_epi32() as -Wuninitialized here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define INA_CLMUL512BW [[gnu::target("pclmul,avx,avx2,avx512f,avx512bw,vpclmulqdq")]]

// One fold of r (1..kMacFold) blocks from p, `left` (> 0) bytes of the datagram from p: whole
// 64-byte vectors loaded as they are, the last one under a byte mask (zeros past the datagram: the
// last block's padding), and with `first`, the 8 bytes of word zero_word (< 8, in the first
// vector) zeroed. POLYVAL is linear in the blocks, so folds may start anywhere a run of blocks
// does: here from the datagram's first byte, with no copy of its head or tail.
INA_CLMUL512BW inline __m128i fold_lane(__m128i s, const uint8_t* p, size_t left, size_t r,
                                        const Gf128* hp, bool first, size_t zero_word) {
  __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512(), mid = _mm512_setzero_si512();
  for (size_t j = 0; j < r; j += 4) {
    const size_t rem = left - 16 * j;
    __m512i y = rem >= 64 ? _mm512_loadu_si512(p + 16 * j)
                          : _mm512_maskz_loadu_epi8((__mmask64{1} << rem) - 1, p + 16 * j);
    if (j == 0) {
      if (first) y = _mm512_maskz_mov_epi64(static_cast<__mmask8>(~(1u << zero_word)), y);
      y = _mm512_xor_si512(y, _mm512_zextsi128_si512(s));
    }
    const size_t nb = r - j < 4 ? r - j : 4;
    const __m512i h =
        nb == 4 ? _mm512_loadu_si512(hp + j)
                : _mm512_maskz_loadu_epi64(static_cast<__mmask8>((1u << (2 * nb)) - 1), hp + j);
    lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(y, h, 0x00));
    hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(y, h, 0x11));
    mid = _mm512_ternarylogic_epi64(mid, _mm512_clmulepi64_epi128(y, h, 0x01),
                                    _mm512_clmulepi64_epi128(y, h, 0x10), 0x96);
  }
  return reduce_schoolbook(xor_lanes(lo), xor_lanes(hi), xor_lanes(mid));
}

INA_CLMUL512BW void polyval_lanes(const MacKey* const* keys, const std::span<const uint8_t>* msgs,
                                  size_t zero_word, Gf128* out) {
  const size_t n = msgs[0].size();
  const size_t blocks = (n + 15) / 16;
  __m128i s[kLanes];
  for (size_t l = 0; l < kLanes; ++l) s[l] = _mm_setzero_si128();
  for (size_t b = 0; b < blocks; b += kMacFold) {
    const size_t r = blocks - b < kMacFold ? blocks - b : kMacFold;
    for (size_t l = 0; l < kLanes; ++l) {
      s[l] = fold_lane(s[l], msgs[l].data() + 16 * b, n - 16 * b, r, keys[l]->hrev + (kMacFold - r),
                       b == 0, zero_word);
    }
  }
  for (size_t l = 0; l < kLanes; ++l) out[l] = from_m128(s[l]);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// finish() for kLanes POLYVAL values of datagrams of length n: SipHash-2-4 (siphash.cc) over
// "INAtag-4", S and n, each lane of a 256-bit vector one datagram's state.
#define INA_SIP_LANES [[gnu::target("avx2,avx512f,avx512vl")]]
INA_SIP_LANES inline __m256i lanes_of(uint64_t v) {
  return _mm256_set1_epi64x(static_cast<long long>(v));
}
struct SipLanes {
  __m256i v0, v1, v2, v3;
  INA_SIP_LANES void round() {
    v0 = _mm256_add_epi64(v0, v1);
    v1 = _mm256_rol_epi64(v1, 13);
    v1 = _mm256_xor_si256(v1, v0);
    v0 = _mm256_rol_epi64(v0, 32);
    v2 = _mm256_add_epi64(v2, v3);
    v3 = _mm256_rol_epi64(v3, 16);
    v3 = _mm256_xor_si256(v3, v2);
    v0 = _mm256_add_epi64(v0, v3);
    v3 = _mm256_rol_epi64(v3, 21);
    v3 = _mm256_xor_si256(v3, v0);
    v2 = _mm256_add_epi64(v2, v1);
    v1 = _mm256_rol_epi64(v1, 17);
    v1 = _mm256_xor_si256(v1, v2);
    v2 = _mm256_rol_epi64(v2, 32);
  }
  INA_SIP_LANES void absorb(__m256i m) {
    v3 = _mm256_xor_si256(v3, m);
    round();
    round();
    v0 = _mm256_xor_si256(v0, m);
  }
};
static_assert(kLanes == 4, "one 256-bit vector of 64-bit lanes");

INA_SIP_LANES void finish_lanes(const MacKey* const* keys, const Gf128* s, size_t n,
                                uint64_t* out) {
  alignas(32) uint64_t klo[kLanes], khi[kLanes], slo[kLanes], shi[kLanes];
  for (size_t l = 0; l < kLanes; ++l) {
    klo[l] = keys[l]->prf.lo;
    khi[l] = keys[l]->prf.hi;
    slo[l] = s[l].lo;
    shi[l] = s[l].hi;
  }
  const __m256i k0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(klo));
  const __m256i k1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(khi));
  SipLanes st{_mm256_xor_si256(k0, lanes_of(0x736f6d6570736575ull)),
              _mm256_xor_si256(k1, lanes_of(0x646f72616e646f6dull)),
              _mm256_xor_si256(k0, lanes_of(0x6c7967656e657261ull)),
              _mm256_xor_si256(k1, lanes_of(0x7465646279746573ull))};
  uint64_t tag_word;
  std::memcpy(&tag_word, "INAtag-4", 8);  // little-endian, as siphash.cc loads it
  st.absorb(lanes_of(tag_word));
  st.absorb(_mm256_load_si256(reinterpret_cast<const __m256i*>(slo)));
  st.absorb(_mm256_load_si256(reinterpret_cast<const __m256i*>(shi)));
  st.absorb(lanes_of(n));
  st.absorb(
      lanes_of(uint64_t{32} << 56));  // no bytes left; the message's length (32) in the top byte
  st.v2 = _mm256_xor_si256(st.v2, lanes_of(0xFF));
  st.round();
  st.round();
  st.round();
  st.round();
  const __m256i r =
      _mm256_xor_si256(_mm256_xor_si256(st.v0, st.v1), _mm256_xor_si256(st.v2, st.v3));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), r);
}

bool cpu_has(MacPath path) {
  switch (path) {
    case MacPath::kPortable: return true;
    case MacPath::kClmul: return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx");
    case MacPath::kClmul512:
      return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
  }
  return false;
}
#elif defined(__aarch64__)
// The same 128-bit path with the Armv8 Crypto Extension's 64 x 64 carry-less multiply (PMULL).
#define INA_PMULL [[gnu::target("+crypto")]]

INA_PMULL inline uint8x16_t pmull_lo(uint8x16_t a, uint8x16_t b) {
  return vreinterpretq_u8_p128(vmull_p64(vgetq_lane_p64(vreinterpretq_p64_u8(a), 0),
                                         vgetq_lane_p64(vreinterpretq_p64_u8(b), 0)));
}
INA_PMULL inline uint8x16_t pmull_hi(uint8x16_t a, uint8x16_t b) {
  return vreinterpretq_u8_p128(vmull_high_p64(vreinterpretq_p64_u8(a), vreinterpretq_p64_u8(b)));
}
INA_PMULL inline uint8x16_t swap64(uint8x16_t x) { return vextq_u8(x, x, 8); }

// As the x86 reduce(): hi:lo * x^-128 mod P.
INA_PMULL inline uint8x16_t reduce(uint8x16_t lo, uint8x16_t hi) {
  const uint8x16_t poly = vreinterpretq_u8_u64(vdupq_n_u64(0xC200000000000000ull));
  uint8x16_t t = pmull_lo(lo, poly);
  lo = veorq_u8(swap64(lo), t);
  t = pmull_lo(lo, poly);
  lo = veorq_u8(swap64(lo), t);
  return veorq_u8(hi, lo);
}
INA_PMULL inline uint8x16_t reduce_karatsuba(uint8x16_t lo, uint8x16_t hi, uint8x16_t kara) {
  const uint8x16_t zero = vdupq_n_u8(0);
  const uint8x16_t mid = veorq_u8(kara, veorq_u8(lo, hi));
  return reduce(veorq_u8(lo, vextq_u8(zero, mid, 8)), veorq_u8(hi, vextq_u8(mid, zero, 8)));
}
INA_PMULL inline uint8x16_t load_gf(const Gf128& x) {
  return vld1q_u8(reinterpret_cast<const uint8_t*>(&x));
}
INA_PMULL inline Gf128 store_gf(uint8x16_t v) {
  Gf128 x;
  vst1q_u8(reinterpret_cast<uint8_t*>(&x), v);
  return x;
}
// As the x86 Sink128.
template <bool kCopy, bool kScan>
struct Sink128 {
  PassOut* o;
  uint8_t* dst = o != nullptr ? o->dst : nullptr;
  const uint8_t* src0 = o != nullptr ? o->src0 : nullptr;
  uint32_t bad = o != nullptr ? o->bad : 0;
  uint32x4_t top = vdupq_n_u32(0);
  uint32x4_t seen = vdupq_n_u32(0);
  INA_PMULL void operator()(const uint8x16_t& v, const uint8_t* at) {
    if constexpr (kCopy) vst1q_u8(dst + (at - src0), v);
    if constexpr (kScan) {
      const uint32x4_t c = vandq_u32(vreinterpretq_u32_u8(v), vdupq_n_u32(0x7FFFFFFF));
      seen = vorrq_u32(seen, vcgeq_u32(c, vdupq_n_u32(bad)));
      top = vmaxq_u32(top, vbicq_u32(c, vcgeq_u32(c, vdupq_n_u32(kF32Inf))));
    }
  }
  INA_PMULL void finish() {
    if constexpr (kScan) {
      o->top = std::max(o->top, vmaxvq_u32(top));
      o->nonfinite = o->nonfinite || vmaxvq_u32(seen) != 0;
    }
  }
};

// As the x86 fold128(): r (1..8) blocks at p folded into s with one reduction, block j taking
// hp[j].
template <class Sink>
INA_PMULL inline uint8x16_t fold128(uint8x16_t s, const uint8_t* p, size_t r, const Gf128* hp,
                                    Sink& sink) {
  uint8x16_t lo = vdupq_n_u8(0), hi = lo, kara = lo;
  for (size_t j = 0; j < r; ++j) {
    uint8x16_t y = vld1q_u8(p + 16 * j);
    sink(y, p + 16 * j);
    if (j == 0) y = veorq_u8(y, s);
    const uint8x16_t h = load_gf(hp[j]);
    lo = veorq_u8(lo, pmull_lo(y, h));
    hi = veorq_u8(hi, pmull_hi(y, h));
    kara = veorq_u8(kara, pmull_lo(veorq_u8(y, swap64(y)), veorq_u8(h, swap64(h))));
  }
  return reduce_karatsuba(lo, hi, kara);
}

// dot(a, b): one block a folded into a zero state with the power b.
INA_PMULL Gf128 dot_clmul(const Gf128& a, const Gf128& b) {
  Sink128<false, false> none{nullptr};
  return store_gf(fold128(vdupq_n_u8(0), reinterpret_cast<const uint8_t*>(&a), 1, &b, none));
}

template <bool kCopy, bool kScan>
INA_PMULL Gf128 blocks_clmul(const Gf128& s0, const uint8_t* p, size_t n, const MacKey& k,
                             PassOut* o) {
  Sink128<kCopy, kScan> sink{o};
  uint8x16_t s = load_gf(s0);
  while (n > 0) {
    const size_t r = n < 8 ? n : 8;
    prefetch_fold<kCopy>(p, 16 * r, o);
    s = fold128(s, p, r, k.hrev + (kMacFold - r), sink);
    p += 16 * r;
    n -= r;
  }
  sink.finish();
  return store_gf(s);
}

bool cpu_has(MacPath path) {
  if (path == MacPath::kPortable) return true;
  return path == MacPath::kClmul && (getauxval(AT_HWCAP) & HWCAP_PMULL) != 0;
}
#else
bool cpu_has(MacPath path) { return path == MacPath::kPortable; }
#endif

#if defined(__x86_64__) || defined(__aarch64__)
#define INA_HAVE_CLMUL128 1
#else
#define INA_HAVE_CLMUL128 0
#endif

MacPath detect_best() {
  if (cpu_has(MacPath::kClmul512)) return MacPath::kClmul512;
  if (cpu_has(MacPath::kClmul)) return MacPath::kClmul;
  return MacPath::kPortable;
}

MacPath best() {
  static const MacPath p = detect_best();
  return p;
}

// S after n whole blocks at p, by `path`, each block also through the sink <kCopy, kScan> (o:
// where to; null for the MAC alone).
template <bool kCopy = false, bool kScan = false>
Gf128 blocks(const Gf128& s, const uint8_t* p, size_t n, const MacKey& k, MacPath path,
             PassOut* o = nullptr) {
#if defined(__x86_64__)
  if (path == MacPath::kClmul512) return blocks_clmul512<kCopy, kScan>(s, p, n, k, o);
#endif
#if INA_HAVE_CLMUL128
  if (path == MacPath::kClmul) return blocks_clmul<kCopy, kScan>(s, p, n, k, o);
#else
  (void)path;
#endif
  return blocks_portable(s, p, n, k.h_mont, PortableSink<kCopy, kScan>{o});
}

// POLYVAL of msg (zero-padded), the 8 bytes at [8 * zero_word, +8) read as zero when zero_word is
// not kNoZero.
constexpr size_t kNoZero = ~size_t{0};

//
// With kCopy, the same pass also copies msg[from, n) to dst and, with kScan, scans those bytes as
// float32 magnitude codes (o: dst, bad; top and nonfinite out; kScan alone: no copy). `from` lies
// in the blocks read from the copy (from <= head_len; mac.h): those bytes and the last partial
// block's are copied (and scanned) from msg, every whole block after them by the fold loops' sink
// as it is loaded.
template <bool kCopy = false, bool kScan = false>
Gf128 polyval_of(const MacKey& k, std::span<const uint8_t> msg, size_t zero_word, MacPath path,
                 size_t from = 0, PassOut* o = nullptr) {
  const uint8_t* p = msg.data();
  const size_t n = msg.size();
  Gf128 s;
  size_t at = 0;
  if (zero_word != kNoZero) {
    // The blocks up to and including the one holding the zeroed word, from a copy.
    alignas(16) uint8_t head[(7 / 2 + 1) * 16] = {};  // zero_word < 8 (mac.h)
    const size_t head_len = std::min(n, (zero_word / 2 + 1) * 16);
    std::memcpy(head, p, head_len);
    std::memset(head + 8 * zero_word, 0, 8);
    s = blocks(s, head, (head_len + 15) / 16, k, path);
    at = head_len;
  }
  if constexpr (kCopy || kScan) {
    if (at > from) {
      if constexpr (kCopy) std::memcpy(o->dst, p + from, at - from);
      if constexpr (kScan) scan_codes(p + from, at - from, o);
    }
    o->src0 = p + from;
  }
  const size_t whole = (n - at) / 16;
  s = blocks<kCopy, kScan>(s, p + at, whole, k, path, o);
  at += whole * 16;
  if (at < n) {
    alignas(16) uint8_t last[16] = {};
    std::memcpy(last, p + at, n - at);
    if constexpr (kCopy) std::memcpy(o->dst + (at - from), p + at, n - at);
    if constexpr (kScan) scan_codes(p + at, n - at, o);
    s = blocks(s, last, 1, k, path);
  }
  return s;
}

// polyval_of(head || body) without the concatenation: the blocks up to the first whole block
// after the head (and through the zeroed word) from a copy, the rest of the body in place.
// With kCopy, the body is also copied to o->dst in the same pass (its first bytes, read into the
// bounce buffer, and the last partial block by memcpy; the whole blocks by the fold loops' sink).
template <bool kCopy = false>
Gf128 polyval_parts(const MacKey& k, std::span<const uint8_t> head, std::span<const uint8_t> body,
                    size_t zero_word, MacPath path, PassOut* o = nullptr) {
  const size_t n = head.size() + body.size();
  size_t lead = (head.size() + 15) / 16 * 16;
  if (zero_word != kNoZero) lead = std::max(lead, (zero_word / 2 + 1) * 16);
  lead = std::min(lead, n);
  alignas(16) uint8_t bounce[kMaxMacHead + 16] = {};  // lead <= 64 (mac.h)
  std::memcpy(bounce, head.data(), head.size());
  const size_t from_body = lead - head.size();
  if (from_body > 0) std::memcpy(bounce + head.size(), body.data(), from_body);
  if (zero_word != kNoZero) std::memset(bounce + 8 * zero_word, 0, 8);
  Gf128 s = blocks(Gf128{}, bounce, (lead + 15) / 16, k, path);
  const std::span<const uint8_t> rest = body.subspan(from_body);
  const size_t whole = rest.size() / 16;
  if constexpr (kCopy) {
    if (from_body > 0) std::memcpy(o->dst, body.data(), from_body);
    o->src0 = body.data();
  }
  s = blocks<kCopy, false>(s, rest.data(), whole, k, path, o);
  if (const size_t tail = rest.size() - whole * 16; tail > 0) {
    alignas(16) uint8_t last[16] = {};
    std::memcpy(last, rest.data() + whole * 16, tail);
    if constexpr (kCopy) std::memcpy(o->dst + from_body + whole * 16, last, tail);
    s = blocks(s, last, 1, k, path);
  }
  return s;
}

// The key for hash key h: its powers by the carry-less multiply when `fast`, else portably (the
// tests compare the two).
MacKey key_for_polyval(const Gf128& h, bool fast) {
  MacKey k;
#if INA_HAVE_CLMUL128
  // h * x^-128 = dot(h, 1).
  k.h_mont = fast ? dot_clmul(h, Gf128{1, 0}) : gf_mul(h, kXInv128);
#else
  (void)fast;
  k.h_mont = gf_mul(h, kXInv128);
#endif
  Gf128 pw = h;  // h^1
  for (size_t i = 1; i <= kMacFold; ++i) {
    k.hrev[kMacFold - i] = pw;
    if (i == kMacFold) break;
#if INA_HAVE_CLMUL128
    if (fast) {
      pw = dot_clmul(pw, h);
      continue;
    }
#endif
    pw = gf_mul(pw, k.h_mont);
  }
  return k;
}

uint64_t finish(const MacKey& k, const Gf128& s, size_t n) {
  // "INAtag-4", S, the length: 32 bytes. Every SipHash input under a job's or an incarnation's
  // key begins with 8 distinct bytes "INA..." (WIRE.md), so no two uses share an input.
  uint8_t m[32];
  std::memcpy(m, "INAtag-4", 8);
  std::memcpy(m + 8, &s.lo, 8);
  std::memcpy(m + 16, &s.hi, 8);
  const uint64_t len = n;
  std::memcpy(m + 24, &len, 8);
  return siphash24(k.prf, m);
}

}  // namespace

bool mac_path_available(MacPath p) { return cpu_has(p); }
MacPath best_mac_path() { return best(); }
const char* mac_path_name(MacPath p) {
  switch (p) {
    case MacPath::kPortable: return "portable";
    case MacPath::kClmul:
#if defined(__aarch64__)
      return "pmull";
#else
      return "pclmulqdq";
#endif
    case MacPath::kClmul512: return "vpclmulqdq-512";
  }
  return "?";
}

Gf128 polyval(const Gf128& h, std::span<const uint8_t> msg, MacPath path) {
  return polyval_of(key_for_polyval(h, path != MacPath::kPortable), msg, kNoZero, path);
}
Gf128 polyval(const Gf128& h, std::span<const uint8_t> msg) { return polyval(h, msg, best()); }

MacKey expand_mac_key(const Key128& key) {
  uint8_t m[16];
  std::memcpy(m, "INAmac-H", 8);
  Gf128 h;
  for (uint64_t i = 0; i < 2; ++i) {
    std::memcpy(m + 8, &i, 8);
    (i == 0 ? h.lo : h.hi) = siphash24(key, m);
  }
  MacKey k = key_for_polyval(h, best() != MacPath::kPortable);
  k.prf = key;
  return k;
}

uint64_t packet_mac(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                    MacPath path) {
  return finish(key, polyval_of(key, msg, zero_word, path), msg.size());
}

uint64_t packet_mac(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word) {
  return finish(key, polyval_of(key, msg, zero_word, best()), msg.size());
}

void packet_mac_many(const MacKey* const* keys, const std::span<const uint8_t>* msgs, size_t n,
                     size_t zero_word, uint64_t* out) {
  size_t i = 0;
#if defined(__x86_64__)
  static const bool lanes = best() == MacPath::kClmul512 && __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("avx512bw");
  while (lanes && i + 1 < n) {
    // A group: up to kLanes datagrams from i of i's length; a group of fewer fills its other lanes
    // with its last datagram again (a lane costs less than a chain computed alone).
    const size_t len = msgs[i].size();
    size_t g = 1;
    while (g < kLanes && i + g < n && msgs[i + g].size() == len) ++g;
    if (g == 1 || len < 8 * (zero_word + 1)) {
      out[i] = packet_mac(*keys[i], msgs[i], zero_word);
      ++i;
      continue;
    }
    const MacKey* k[kLanes];
    std::span<const uint8_t> m[kLanes];
    for (size_t l = 0; l < kLanes; ++l) {
      k[l] = keys[i + std::min(l, g - 1)];
      m[l] = msgs[i + std::min(l, g - 1)];
    }
    Gf128 s[kLanes];
    uint64_t tags[kLanes];
    polyval_lanes(k, m, zero_word, s);
    finish_lanes(k, s, len, tags);
    for (size_t l = 0; l < g; ++l) out[i + l] = tags[l];
    i += g;
  }
#endif
  for (; i < n; ++i) out[i] = packet_mac(*keys[i], msgs[i], zero_word);
}

uint64_t packet_mac_parts(const MacKey& key, std::span<const uint8_t> head,
                          std::span<const uint8_t> body, size_t zero_word, MacPath path) {
  return finish(key, polyval_parts(key, head, body, zero_word, path), head.size() + body.size());
}

uint64_t packet_mac_parts_copy(const MacKey& key, std::span<const uint8_t> head,
                               std::span<const uint8_t> body, size_t zero_word, uint8_t* dst,
                               MacPath path) {
  PassOut o;
  o.dst = dst;
  return finish(key, polyval_parts<true>(key, head, body, zero_word, path, &o),
                head.size() + body.size());
}

uint64_t packet_mac_copy(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, uint8_t* dst, MacPath path, CopyDst where) {
  PassOut o;
  o.dst = dst;
  o.stream = where == CopyDst::kStream;
  return finish(key, polyval_of<true, false>(key, msg, zero_word, path, from, &o), msg.size());
}

namespace {
// The pass that scans msg[from, n) as magnitude codes into `codes`, copying those bytes to dst
// with kCopy.
template <bool kCopy>
uint64_t packet_mac_codes(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                          size_t from, uint8_t* dst, MagnitudeCodes* codes, MacPath path) {
  PassOut o;
  o.dst = dst;
  o.bad = codes->bad;
  o.top = codes->top;
  o.nonfinite = codes->nonfinite;
  const Gf128 s = polyval_of<kCopy, true>(key, msg, zero_word, path, from, &o);
  codes->top = o.top;
  codes->nonfinite = o.nonfinite;
  return finish(key, s, msg.size());
}
}  // namespace

uint64_t packet_mac_copy(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, uint8_t* dst, MagnitudeCodes* codes, MacPath path) {
  return packet_mac_codes<true>(key, msg, zero_word, from, dst, codes, path);
}

uint64_t packet_mac_scan(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, MagnitudeCodes* codes, MacPath path) {
  return packet_mac_codes<false>(key, msg, zero_word, from, nullptr, codes, path);
}

namespace {
// The per-thread cache of expanded keys, direct-mapped: plain thread-local storage,
// zero-initialized (no TLS constructor or destructor), so that sealing never allocates (the
// aggregator's packet path must not: udp_backend_test counts) and a static object's destructor may
// still seal at exit. It costs each thread of a process that loads the library 8 x 568 bytes of
// TLS.
struct CachedKey {
  bool valid;
  MacKey k;
};
constexpr size_t kCacheEntries = 8;
thread_local CachedKey tls_keys[kCacheEntries];

const MacKey& cached_key(const Key128& key) {
  const uint64_t mix = (key.lo ^ key.hi) * 0x9E3779B97F4A7C15ull;
  static_assert(kCacheEntries == 8, "the index is the mix's top 3 bits");
  CachedKey& c = tls_keys[mix >> 61];
  if (!c.valid || c.k.prf != key) {
    c.k = expand_mac_key(key);
    c.valid = true;
  }
  return c.k;
}
}  // namespace

uint64_t packet_mac(const Key128& key, std::span<const uint8_t> msg, size_t zero_word) {
  return packet_mac(cached_key(key), msg, zero_word);
}

uint64_t packet_mac_parts(const Key128& key, std::span<const uint8_t> head,
                          std::span<const uint8_t> body, size_t zero_word) {
  return packet_mac_parts(cached_key(key), head, body, zero_word, best());
}

uint64_t packet_mac_copy(const Key128& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, uint8_t* dst, CopyDst where) {
  return packet_mac_copy(cached_key(key), msg, zero_word, from, dst, best(), where);
}

uint64_t packet_mac_copy(const Key128& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, uint8_t* dst, MagnitudeCodes* codes) {
  return packet_mac_copy(cached_key(key), msg, zero_word, from, dst, codes, best());
}

uint64_t packet_mac_parts_copy(const Key128& key, std::span<const uint8_t> head,
                               std::span<const uint8_t> body, size_t zero_word, uint8_t* dst) {
  return packet_mac_parts_copy(cached_key(key), head, body, zero_word, dst, best());
}

uint64_t packet_mac_scan(const Key128& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, MagnitudeCodes* codes) {
  return packet_mac_scan(cached_key(key), msg, zero_word, from, codes, best());
}

}  // namespace ina
