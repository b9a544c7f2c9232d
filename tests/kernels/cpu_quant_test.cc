// The CPU kernels (kernels/include/ina/kernels/cpu_quant.h) against the reference
// (protocol/quantize.cc), bit for bit: scan results, int32 words, big-endian wire words and
// decoded outputs, for every float dtype and op, on random and adversarial blocks, through both
// paths (the reference path forced, and AVX2 where the CPU has it).
#include "ina/kernels/cpu_quant.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ina/protocol/quantize.h"
#include "ina/protocol/wire.h"
#include "quant_cases.h"

namespace ina::kernels::cpu {
namespace {

using testing::Block;

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax};
constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// Index of the first differing element, or -1.
long first_diff(const void* a, const void* b, size_t n, size_t elem) {
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(pa + i * elem, pb + i * elem, elem) != 0) return static_cast<long>(i);
  }
  return -1;
}

::testing::AssertionResult same_bytes(const void* want, const void* got, size_t n, size_t elem) {
  const long i = first_diff(want, got, n, elem);
  if (i < 0) return ::testing::AssertionSuccess();
  uint32_t w = 0, g = 0;
  std::memcpy(&w, static_cast<const uint8_t*>(want) + i * elem, elem);
  std::memcpy(&g, static_cast<const uint8_t*>(got) + i * elem, elem);
  return ::testing::AssertionFailure() << "element " << i << " of " << n << ": reference 0x"
                                       << std::hex << w << ", kernel 0x" << g;
}

// Runs every operation of the kernel API on one block (starting `offset` elements in, so that
// the loads are unaligned too) and compares with the reference.
void check_block(const Block& blk, size_t offset) {
  const DType t = blk.t;
  const size_t elem = dtype_size(t);
  if (offset > blk.n) return;
  const size_t n = blk.n - offset;
  const void* src = blk.bytes.data() + offset * elem;
  std::vector<int32_t> q_ref(n + 1), q_got(n + 1);
  std::vector<uint8_t> w_ref(4 * n + 4), w_got(4 * n + 4);
  std::vector<uint8_t> out_ref(elem * n + 8), out_got(elem * n + 8);

  for (const ReduceOp op : kOps) {
    SCOPED_TRACE(blk.name + " " + std::string(dtype_name(t)) + " " + std::string(op_name(op)) +
                 " offset=" + std::to_string(offset));
    const quant::BlockScan s_ref = quant::scan_block(src, n, t, op);
    const quant::BlockScan s_got = scan_block(src, n, t, op);
    ASSERT_EQ(s_ref.exp, s_got.exp);
    ASSERT_EQ(s_ref.nonfinite, s_got.nonfinite);

    const bool sum = op == ReduceOp::kSum;
    const std::vector<int16_t> exps =
        sum ? testing::exponents_for(s_ref.exp) : std::vector<int16_t>{kNoExponent};
    const std::vector<uint32_t> worlds = sum ? testing::world_sizes() : std::vector<uint32_t>{1};
    for (const int16_t e : exps) {
      for (const uint32_t ws : worlds) {
        SCOPED_TRACE("exp=" + std::to_string(e) + " world=" + std::to_string(ws));
        quant::encode(src, n, t, op, e, ws, q_ref.data());
        encode(src, n, t, op, e, ws, q_got.data());
        ASSERT_TRUE(same_bytes(q_ref.data(), q_got.data(), n, 4)) << "encode";

        kernels::cpu::store_be_words(w_ref.data(), q_ref.data(), n);
        encode_wire(src, n, t, op, e, ws, w_got.data());
        ASSERT_TRUE(same_bytes(w_ref.data(), w_got.data(), n, 4)) << "encode_wire";

        // Decode what was encoded, and the sum of `ranks` identical contributions (what the
        // aggregator returns when every rank held this block; |q| <= 2^B keeps it in range).
        const int32_t ranks = sum ? static_cast<int32_t>(ws > 3 ? 3 : ws) : 1;
        for (int32_t& v : q_ref)
          v = static_cast<int32_t>(static_cast<uint32_t>(v) * static_cast<uint32_t>(ranks));
        quant::decode(q_ref.data(), n, t, op, e, ws, out_ref.data());
        decode(q_ref.data(), n, t, op, e, ws, out_got.data());
        ASSERT_TRUE(same_bytes(out_ref.data(), out_got.data(), n, elem)) << "decode";

        kernels::cpu::store_be_words(w_ref.data(), q_ref.data(), n);
        std::memset(out_got.data(), 0xA5, out_got.size());
        decode_wire(w_ref.data(), n, t, op, e, ws, out_got.data());
        ASSERT_TRUE(same_bytes(out_ref.data(), out_got.data(), n, elem)) << "decode_wire";
      }
    }
  }
}

class CpuQuant : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!force_isa(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << isa_name(GetParam()) << " path";
    }
  }
  void TearDown() override { (void)force_isa(best_isa()); }
};

TEST_P(CpuQuant, ActivePathIsTheForcedOne) { EXPECT_EQ(active_isa(), GetParam()); }

TEST_P(CpuQuant, MatchesReferenceOnRandomAndAdversarialBlocks) {
  for (const DType t : kFloatTypes) {
    for (const Block& b : testing::make_blocks(t, 1234 + static_cast<int>(t))) {
      if (b.name == "all_16bit_patterns") continue;  // its own test below
      check_block(b, 0);
      check_block(b, 1);
      if (HasFatalFailure()) return;
    }
  }
}

// Every 16-bit pattern: as one buffer through every op (the widening of every pattern, NaNs
// included, and the round trip through MIN/MAX), and in blocks of 256 for the scan.
TEST_P(CpuQuant, Every16BitPattern) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    for (const Block& b : testing::make_blocks(t, 99)) {
      if (b.name != "all_16bit_patterns") continue;
      for (size_t start = 0; start < b.n; start += 256) {
        Block sub{b.name + "/" + std::to_string(start), t, {}, 0};
        sub.bytes.assign(b.bytes.begin() + static_cast<long>(start * 2),
                         b.bytes.begin() + static_cast<long>((start + 256) * 2));
        sub.n = 256;
        for (const ReduceOp op : kOps) {
          const quant::BlockScan r = quant::scan_block(sub.data(), sub.n, t, op);
          const quant::BlockScan g = scan_block(sub.data(), sub.n, t, op);
          ASSERT_EQ(r.exp, g.exp) << sub.name;
          ASSERT_EQ(r.nonfinite, g.nonfinite) << sub.name;
        }
      }
      check_block(b, 0);
    }
  }
}

// Decoding arbitrary words (not only encodings): SUM over random words and exponents that
// give subnormal, normal and overflowing outputs; MIN/MAX over float32 patterns with every
// sign/exponent/high-mantissa combination and low bits around the rounding points of the
// 16-bit narrowing (every rounding case of float_to_half and float_to_bf16, NaN payloads too).
TEST_P(CpuQuant, DecodesArbitraryWords) {
  std::mt19937_64 rng(7);
  std::vector<int32_t> words;
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000,
                           0x7FFF, 0x8000, 0x8001, 0xBFFF, 0xC000, 0xE000, 0xF000, 0xFFFF};
  for (uint32_t hi = 0; hi <= 0xFFFF; ++hi) {
    for (const uint32_t lo : lows) words.push_back(static_cast<int32_t>(hi << 16 | lo));
    words.push_back(static_cast<int32_t>(hi << 16 | (rng() & 0xFFFF)));
  }
  for (const DType t : kFloatTypes) {
    const size_t elem = dtype_size(t);
    std::vector<uint8_t> ref(words.size() * elem), got(words.size() * elem);
    for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      quant::decode(words.data(), words.size(), t, op, kNoExponent, 1, ref.data());
      decode(words.data(), words.size(), t, op, kNoExponent, 1, got.data());
      ASSERT_TRUE(same_bytes(ref.data(), got.data(), words.size(), elem)) << dtype_name(t);
    }
    std::vector<int32_t> rnd(4096);
    for (int32_t& v : rnd) v = static_cast<int32_t>(rng());
    for (int e = -200; e <= 200; e += 3) {
      for (const uint32_t ws : testing::world_sizes()) {
        quant::decode(rnd.data(), rnd.size(), t, ReduceOp::kSum, static_cast<int16_t>(e), ws,
                      ref.data());
        decode(rnd.data(), rnd.size(), t, ReduceOp::kSum, static_cast<int16_t>(e), ws, got.data());
        ASSERT_TRUE(same_bytes(ref.data(), got.data(), rnd.size(), elem))
            << dtype_name(t) << " exp=" << e << " world=" << ws;
      }
    }
  }
}

TEST_P(CpuQuant, Int32IsCopiedAndByteSwapped) {
  std::mt19937_64 rng(3);
  for (const size_t n : testing::block_sizes()) {
    std::vector<int32_t> v(n), q(n), back(n);
    std::vector<uint8_t> w_ref(4 * n + 1), w_got(4 * n + 1);
    for (int32_t& x : v) x = static_cast<int32_t>(rng());
    for (const ReduceOp op : kOps) {
      encode(v.data(), n, DType::kInt32, op, kNoExponent, 4, q.data());
      EXPECT_EQ(v, q);
      encode_wire(v.data(), n, DType::kInt32, op, kNoExponent, 4, w_got.data());
      kernels::cpu::store_be_words(w_ref.data(), v.data(), n);
      EXPECT_TRUE(same_bytes(w_ref.data(), w_got.data(), n, 4));
      decode_wire(w_got.data(), n, DType::kInt32, op, kNoExponent, 4, back.data());
      EXPECT_EQ(v, back);
      decode(v.data(), n, DType::kInt32, op, kNoExponent, 4, back.data());
      EXPECT_EQ(v, back);
      EXPECT_FALSE(scan_block(v.data(), n, DType::kInt32, op).nonfinite);
    }
  }
}

TEST_P(CpuQuant, FillNanMatchesReference) {
  for (const DType t : kFloatTypes) {
    std::vector<uint8_t> ref(257 * 4, 1), got(257 * 4, 1);
    quant::fill_nan(ref.data(), 257, t);
    fill_nan(got.data(), 257, t);
    EXPECT_EQ(ref, got);
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, CpuQuant, ::testing::Values(Isa::kReference, Isa::kAvx2),
                         [](const ::testing::TestParamInfo<Isa>& i) {
                           return std::string(isa_name(i.param));
                         });

TEST(CpuQuantDispatch, ForcingAnUnsupportedPathFails) {
  const Isa best = best_isa();
  EXPECT_TRUE(force_isa(Isa::kReference));
  EXPECT_EQ(active_isa(), Isa::kReference);
  EXPECT_EQ(force_isa(Isa::kAvx2), best == Isa::kAvx2);
  EXPECT_TRUE(force_isa(best));
  std::printf("best CPU kernel path here: %s\n", isa_name(best));
}

}  // namespace
}  // namespace ina::kernels::cpu
