// Wire format tests: the checked-in vectors (protocol/testdata/) are the specification, so every
// field of every vector is compared against values written here by hand, and encoding those
// values must reproduce the vector's bytes. Then every DecodeError is provoked, and random and
// mutated inputs are decoded from exact-size heap buffers (run under -fsanitize=address to catch
// any read past the end).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"
#include "testdata.h"

namespace ina::wire {
namespace {

using ::ina::testing::load_vector;
using ::ina::testing::parse_hex;

// Decodes from a heap buffer of exactly bytes.size() bytes, so that AddressSanitizer flags any
// read beyond it (a std::vector built from a range allocates exactly its size).
DecodeError decode_exact(const std::vector<uint8_t>& bytes, PacketView* view,
                         std::vector<uint8_t>* storage) {
  *storage = std::vector<uint8_t>(bytes.begin(), bytes.end());
  EXPECT_EQ(storage->capacity(), storage->size());
  return decode(std::span<const uint8_t>(storage->data(), storage->size()), view);
}

struct Vector {
  const char* file;
  Header hdr;
  std::vector<int32_t> words;
};

Header make_header(uint8_t flags, uint32_t seq, uint16_t rank, uint16_t slot, bool shadow,
                   uint16_t count, DType dtype, ReduceOp op, int16_t exp, int16_t next_exp) {
  Header h;
  h.flags = flags;
  h.job = 0x01020304;
  h.key = 0x1122334455667788ull;
  h.seq = seq;
  h.rank = rank;
  h.slot = slot;
  h.shadow = shadow;
  h.count = count;
  h.dtype = dtype;
  h.op = op;
  h.exp = exp;
  h.next_exp = next_exp;
  return h;
}

// The expected contents of each vector, transcribed from the vector files' comments and checked
// by hand against WIRE.md. Do not regenerate these from the encoder.
std::vector<Vector> expected_vectors() {
  return {
      {"data_f32_sum.hex",
       make_header(kFlagRetransmit | kFlagNonFinite, 0xA1B2C3D4u, 0x0203, 0x0123, true, 4,
                   DType::kFloat32, ReduceOp::kSum, -3, -5),
       {214748368, -2147484, 257698032, -134217728}},
      {"result_bf16_max.hex",
       make_header(kFlagResult, 0xFFFFFFFEu, 0, 0x7FFF, false, 4, DType::kBFloat16,
                   ReduceOp::kMax, kNoExponent, kNoExponent),
       {static_cast<int32_t>(0x807FFFFFu), static_cast<int32_t>(0xBFDFFFFFu), -1,
        0x3F800000}},
      {"error_missing_ranks.hex",
       make_header(kFlagError, 0xA1B2C3D4u, 0x0203, 0x0123, true, 3, DType::kInt32,
                   ReduceOp::kSum, kNoExponent, kNoExponent),
       {static_cast<int32_t>(ErrorReason::kMissingRanks), static_cast<int32_t>(0x80000027u),
        0x00000081}},
      {"hello.hex",
       make_header(kFlagHello | kFlagRetransmit, 0x5EED1234u, 39, 0, false, 1, DType::kInt32,
                   ReduceOp::kSum, kNoExponent, kNoExponent),
       {40}},
      {"welcome.hex",
       make_header(kFlagHello | kFlagResult, 0, 0, 0, false, 2, DType::kInt32, ReduceOp::kSum,
                   kNoExponent, kNoExponent),
       {512, 256}},
  };
}

void expect_header_eq(const Header& got, const Header& want) {
  EXPECT_EQ(got.version, want.version);
  EXPECT_EQ(got.flags, want.flags);
  EXPECT_EQ(got.job, want.job);
  EXPECT_EQ(got.key, want.key);
  EXPECT_EQ(got.seq, want.seq);
  EXPECT_EQ(got.rank, want.rank);
  EXPECT_EQ(got.slot, want.slot);
  EXPECT_EQ(got.shadow, want.shadow);
  EXPECT_EQ(got.count, want.count);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.op, want.op);
  EXPECT_EQ(got.exp, want.exp);
  EXPECT_EQ(got.next_exp, want.next_exp);
}

TEST(WireTestdata, ParserAcceptsCommentsAndRejectsJunk) {
  std::vector<uint8_t> b;
  std::string err;
  ASSERT_TRUE(parse_hex("# c\n49 4E # x\n\n0aFF\n", &b, &err)) << err;
  EXPECT_EQ(b, (std::vector<uint8_t>{0x49, 0x4E, 0x0A, 0xFF}));
  EXPECT_FALSE(parse_hex("494", &b, &err));
  EXPECT_FALSE(parse_hex("4 94e", &b, &err));
  EXPECT_FALSE(parse_hex("49zz", &b, &err));
}

TEST(WireVectors, DecodeToTheDocumentedFields) {
  for (const Vector& v : expected_vectors()) {
    SCOPED_TRACE(v.file);
    const std::vector<uint8_t> bytes = load_vector(v.file);
    ASSERT_EQ(bytes.size(), packet_size(v.hdr.count));
    std::vector<uint8_t> storage;
    PacketView view;
    ASSERT_EQ(decode_exact(bytes, &view, &storage), DecodeError::kOk);
    expect_header_eq(view.hdr, v.hdr);
    ASSERT_EQ(view.payload, storage.data() + kHeaderSize);
    std::vector<int32_t> loaded(v.words.size());
    load_payload(loaded.data(), view.payload, loaded.size());
    for (size_t i = 0; i < v.words.size(); ++i) {
      EXPECT_EQ(view.word(i), v.words[i]) << "word " << i;
      EXPECT_EQ(loaded[i], v.words[i]) << "word " << i;
    }
  }
}

TEST(WireVectors, EncodeReproducesTheBytes) {
  for (const Vector& v : expected_vectors()) {
    SCOPED_TRACE(v.file);
    const std::vector<uint8_t> bytes = load_vector(v.file);
    std::vector<uint8_t> out(packet_size(v.hdr.count), 0xCC);
    encode_header(v.hdr, out.data());
    store_payload(out.data() + kHeaderSize, v.words.data(), v.words.size());
    EXPECT_EQ(out, bytes);
  }
}

TEST(WireVectors, PacketKindsAreDistinguishedByFlags) {
  const std::vector<Vector> vs = expected_vectors();
  // DATA: none of RESULT, ERROR, HELLO.
  EXPECT_FALSE(vs[0].hdr.has(kFlagResult | kFlagError | kFlagHello));
  EXPECT_TRUE(vs[1].hdr.has(kFlagResult));
  EXPECT_FALSE(vs[1].hdr.has(kFlagHello));
  EXPECT_TRUE(vs[2].hdr.has(kFlagError));
  EXPECT_TRUE(vs[3].hdr.has(kFlagHello));
  EXPECT_FALSE(vs[3].hdr.has(kFlagResult));
  EXPECT_TRUE(vs[4].hdr.has(kFlagHello) && vs[4].hdr.has(kFlagResult));
}

TEST(WireVectors, ErrorBitmapNamesTheRanksPresent) {
  const std::vector<uint8_t> bytes = load_vector("error_missing_ranks.hex");
  std::vector<uint8_t> storage;
  PacketView view;
  ASSERT_EQ(decode_exact(bytes, &view, &storage), DecodeError::kOk);
  ASSERT_EQ(view.word(0), static_cast<int32_t>(ErrorReason::kMissingRanks));
  const uint32_t world = 40;
  ASSERT_EQ(view.hdr.count, 1 + (world + 31) / 32);
  std::set<uint32_t> present;
  for (uint32_t r = 0; r < world; ++r) {
    if ((static_cast<uint32_t>(view.word(1 + r / 32)) >> (r % 32)) & 1u) present.insert(r);
  }
  EXPECT_EQ(present, (std::set<uint32_t>{0, 1, 2, 5, 31, 32, 39}));
}

TEST(WireBytes, HelpersAreBigEndian) {
  uint8_t b[8];
  put_u16(b, 0x0102);
  EXPECT_EQ(b[0], 0x01);
  EXPECT_EQ(b[1], 0x02);
  EXPECT_EQ(get_u16(b), 0x0102);
  put_u32(b, 0x01020304u);
  EXPECT_EQ(std::vector<uint8_t>(b, b + 4), (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(get_u32(b), 0x01020304u);
  put_u64(b, 0x0102030405060708ull);
  EXPECT_EQ(std::vector<uint8_t>(b, b + 8), (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(get_u64(b), 0x0102030405060708ull);
}

TEST(WireBytes, PayloadRoundTripsExtremeWords) {
  const std::vector<int32_t> words = {0, 1, -1, INT32_MAX, INT32_MIN, 0x12345678, -0x12345678};
  std::vector<uint8_t> bytes(words.size() * kElemSize);
  store_payload(bytes.data(), words.data(), words.size());
  EXPECT_EQ(bytes[4 * 5 + 0], 0x12);
  EXPECT_EQ(bytes[4 * 5 + 3], 0x78);
  EXPECT_EQ(bytes[4 * 4 + 0], 0x80);  // INT32_MIN: sign byte first
  std::vector<int32_t> back(words.size());
  load_payload(back.data(), bytes.data(), back.size());
  EXPECT_EQ(back, words);
}

// The DATA vector, re-encoded from its header, as the base for crafted bad inputs.
std::vector<uint8_t> valid_packet() {
  const Vector v = expected_vectors()[0];
  std::vector<uint8_t> out(packet_size(v.hdr.count));
  encode_header(v.hdr, out.data());
  store_payload(out.data() + kHeaderSize, v.words.data(), v.words.size());
  return out;
}

TEST(WireDecode, EmptyAndMaximalPayloadsAreValid) {
  Header h = expected_vectors()[0].hdr;
  for (const uint16_t count : {uint16_t{0}, uint16_t{0xFFFF}}) {
    h.count = count;
    std::vector<uint8_t> bytes(packet_size(count), 0xAB);
    encode_header(h, bytes.data());
    std::vector<uint8_t> storage;
    PacketView view;
    ASSERT_EQ(decode_exact(bytes, &view, &storage), DecodeError::kOk) << count;
    EXPECT_EQ(view.hdr.count, count);
    if (count > 0) {
      EXPECT_EQ(view.word(count - 1u), static_cast<int32_t>(0xABABABABu));
    }
  }
}

TEST(WireDecode, EveryErrorKindIsDetectedAndCounted) {
  const std::vector<uint8_t> good = valid_packet();
  DecodeCounters counters;
  std::vector<uint8_t> storage;
  PacketView view;
  auto check = [&](const std::vector<uint8_t>& bytes, DecodeError want, const std::string& what) {
    const DecodeError got = decode_exact(bytes, &view, &storage);
    EXPECT_EQ(got, want) << what << ": got " << decode_error_name(got);
    counters.add(got);
  };
  check(good, DecodeError::kOk, "valid");

  for (size_t len = 0; len < kHeaderSize; ++len) {
    check(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<ptrdiff_t>(len)),
          DecodeError::kTruncated, "truncated to " + std::to_string(len));
  }
  for (const size_t at : {kOffMagic, kOffMagic + 1}) {
    std::vector<uint8_t> b = good;
    b[at] ^= 0x01;
    check(b, DecodeError::kBadMagic, "magic byte " + std::to_string(at));
  }
  for (const uint8_t version : {0, 2, 0xFF}) {
    std::vector<uint8_t> b = good;
    b[kOffVersion] = version;
    check(b, DecodeError::kBadVersion, "version " + std::to_string(version));
  }
  for (const uint8_t flag : {0x20, 0x40, 0x80}) {
    std::vector<uint8_t> b = good;
    b[kOffFlags] |= flag;
    check(b, DecodeError::kUnknownFlags, "flag " + std::to_string(flag));
  }
  for (const uint8_t dtype : {0, 7, 0xFF}) {
    std::vector<uint8_t> b = good;
    b[kOffDtype] = dtype;
    check(b, DecodeError::kUnknownDtype, "dtype " + std::to_string(dtype));
  }
  for (const uint8_t op : {0, 4, 0xFF}) {
    std::vector<uint8_t> b = good;
    b[kOffOp] = op;
    check(b, DecodeError::kUnknownOp, "op " + std::to_string(op));
  }
  for (const uint16_t count : {uint16_t{5}, uint16_t{0xFFFF}}) {
    std::vector<uint8_t> b = good;
    put_u16(b.data() + kOffCount, count);
    check(b, DecodeError::kCountBeyondPayload, "count " + std::to_string(count));
  }
  {  // a payload that is not a whole number of words short of `count`
    std::vector<uint8_t> b = good;
    b.pop_back();
    check(b, DecodeError::kCountBeyondPayload, "last byte missing");
  }
  for (const size_t extra : {1, 3, 4}) {
    std::vector<uint8_t> b = good;
    b.insert(b.end(), extra, 0);
    check(b, DecodeError::kTrailingBytes, "extra " + std::to_string(extra));
  }
  {
    std::vector<uint8_t> b = good;
    put_u16(b.data() + kOffCount, 3);
    check(b, DecodeError::kTrailingBytes, "count 3 of 4 words");
  }
  // Checks run in the documented order (WIRE.md): the first failing one is reported.
  {
    std::vector<uint8_t> b = good;
    b[kOffMagic] = 0;
    b[kOffVersion] = 9;
    b[kOffDtype] = 0;
    check(b, DecodeError::kBadMagic, "magic before version");
    b = good;
    b[kOffFlags] = 0xFF;
    b[kOffOp] = 0;
    check(b, DecodeError::kUnknownFlags, "flags before op");
    b = good;
    b[kOffDtype] = 0;
    b[kOffOp] = 0;
    check(b, DecodeError::kUnknownDtype, "dtype before op");
  }

  const auto n = [&](DecodeError e) { return counters.by_error[static_cast<size_t>(e)]; };
  EXPECT_EQ(n(DecodeError::kOk), 1u);
  EXPECT_EQ(n(DecodeError::kTruncated), kHeaderSize);
  EXPECT_EQ(n(DecodeError::kBadMagic), 3u);
  EXPECT_EQ(n(DecodeError::kBadVersion), 3u);
  EXPECT_EQ(n(DecodeError::kUnknownFlags), 4u);
  EXPECT_EQ(n(DecodeError::kUnknownDtype), 4u);
  EXPECT_EQ(n(DecodeError::kUnknownOp), 3u);
  EXPECT_EQ(n(DecodeError::kCountBeyondPayload), 3u);
  EXPECT_EQ(n(DecodeError::kTrailingBytes), 4u);
  EXPECT_EQ(counters.total_rejected(), kHeaderSize + 3 + 3 + 4 + 4 + 3 + 3 + 4);
}

TEST(WireDecode, ErrorNamesAreDistinct) {
  std::set<std::string_view> names;
  for (size_t i = 0; i < static_cast<size_t>(DecodeError::kCount_); ++i) {
    const std::string_view name = decode_error_name(static_cast<DecodeError>(i));
    EXPECT_FALSE(name.empty());
    EXPECT_NE(name, "?");
    names.insert(name);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(DecodeError::kCount_));
}

// Whatever decode accepts must be self-consistent: the payload lies inside the buffer right after
// the header, the size matches count, and re-encoding the header gives back the same 32 bytes
// (so no field is silently altered or dropped).
void expect_consistent(const std::vector<uint8_t>& storage, const PacketView& view) {
  ASSERT_EQ(storage.size(), packet_size(view.hdr.count));
  ASSERT_EQ(view.payload, storage.data() + kHeaderSize);
  uint8_t hdr[kHeaderSize];
  encode_header(view.hdr, hdr);
  EXPECT_TRUE(std::equal(hdr, hdr + kHeaderSize, storage.begin()));
  EXPECT_LE(view.hdr.slot, kMaxSlot);
  EXPECT_TRUE(is_valid_dtype(static_cast<uint8_t>(view.hdr.dtype)));
  EXPECT_TRUE(is_valid_op(static_cast<uint8_t>(view.hdr.op)));
  EXPECT_EQ(view.hdr.flags & ~kKnownFlags, 0);
}

TEST(WireFuzz, RandomBytesNeverCrash) {
  std::mt19937_64 rng(0x1A2B3C);
  DecodeCounters counters;
  std::vector<uint8_t> storage;
  size_t accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const size_t len = rng() % 80;
    std::vector<uint8_t> b(len);
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
    // Most random headers fail at the magic; give half of them a valid prefix to reach the
    // later checks.
    if (len >= 4 && (iter & 1)) {
      put_u16(b.data(), kMagic);
      b[kOffVersion] = kVersion;
      b[kOffFlags] &= kKnownFlags;
    }
    if (len >= kHeaderSize && (iter & 3) == 1) {
      b[kOffDtype] = static_cast<uint8_t>(1 + rng() % 4);
      b[kOffOp] = static_cast<uint8_t>(1 + rng() % 3);
      put_u16(b.data() + kOffCount, static_cast<uint16_t>((len - kHeaderSize) / 4));
    }
    PacketView view;
    const DecodeError e = decode_exact(b, &view, &storage);
    counters.add(e);
    if (e == DecodeError::kOk) {
      ++accepted;
      expect_consistent(storage, view);
    }
  }
  EXPECT_GT(accepted, 100u);  // the valid-prefix inputs do reach the success path
  EXPECT_GT(counters.total_rejected(), 10000u);
}

TEST(WireFuzz, MutationsAndTruncationsOfValidPacketsNeverCrash) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> storage;
  for (const Vector& v : expected_vectors()) {
    SCOPED_TRACE(v.file);
    const std::vector<uint8_t> good = load_vector(v.file);
    ASSERT_FALSE(good.empty());
    // Every single-byte mutation (several values per position).
    for (size_t at = 0; at < good.size(); ++at) {
      for (int k = 0; k < 8; ++k) {
        std::vector<uint8_t> b = good;
        b[at] = static_cast<uint8_t>(k == 0 ? b[at] ^ 0xFF : rng());
        PacketView view;
        if (decode_exact(b, &view, &storage) == DecodeError::kOk) {
          expect_consistent(storage, view);
          // Magic, version and count have exactly one acceptable value here.
          if (b[at] != good[at]) {
            EXPECT_TRUE(at != kOffMagic && at != kOffMagic + 1 && at != kOffVersion &&
                        at != kOffCount && at != kOffCount + 1)
                << "accepted a mutation at offset " << at;
          }
        }
      }
    }
    // Every truncation and a few extensions.
    for (size_t len = 0; len <= good.size() + 8; ++len) {
      std::vector<uint8_t> b(good.begin(), good.begin() + std::min(len, good.size()));
      b.resize(len, 0x5A);
      PacketView view;
      const DecodeError e = decode_exact(b, &view, &storage);
      EXPECT_EQ(e == DecodeError::kOk, len == good.size()) << len;
    }
  }
}

}  // namespace
}  // namespace ina::wire
