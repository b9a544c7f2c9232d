// Wire format tests: the checked-in vectors (protocol/testdata/vectors.hex) are the specification,
// so every field of every vector is compared against values written here by hand, and encoding
// those values must reproduce the vector's bytes. Then every DecodeError is provoked, and random
// and mutated inputs are decoded from exact-size heap buffers (run under -fsanitize=address to
// catch any read past the end).
#include "ina/protocol/wire.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ina/protocol/types.h"
#include "testdata.h"

namespace ina::wire {
namespace {

using ::ina::testing::load_vector;
using ::ina::testing::parse_hex;
using ::ina::testing::parse_vectors;

// Decodes from a heap buffer of exactly bytes.size() bytes, so that AddressSanitizer flags any
// read beyond it (a std::vector built from a range allocates exactly its size).
DecodeError decode_exact(const std::vector<uint8_t>& bytes, PacketView* view,
                         std::vector<uint8_t>* storage) {
  *storage = std::vector<uint8_t>(bytes.begin(), bytes.end());
  EXPECT_EQ(storage->capacity(), storage->size());
  return decode(std::span<const uint8_t>(storage->data(), storage->size()), view);
}

struct Vector {
  const char* name;  // the section of protocol/testdata/vectors.hex
  Header hdr;
  std::vector<int64_t> words;  // payload words, payload_width(flags, dtype) bytes each
};

Header make_header(uint8_t flags, uint32_t seq, uint16_t rank, uint16_t slot, bool shadow,
                   uint16_t count, DType dtype, ReduceOp op, uint32_t coll, uint32_t elems,
                   int16_t exp, uint16_t root) {
  Header h;
  h.flags = flags;
  h.job = 0x01020304;
  h.seq = seq;
  h.rank = rank;
  h.slot = slot;
  h.shadow = shadow;
  h.count = count;
  h.dtype = dtype;
  h.op = op;
  h.coll = coll;
  h.elems = elems;
  h.exp = exp;
  h.root = root;
  h.tag = 0;
  return h;
}

constexpr DType kI32 = DType::kInt32, kF32 = DType::kFloat32, kF16 = DType::kFloat16,
                kBF16 = DType::kBFloat16;
constexpr ReduceOp kSum = ReduceOp::kSum, kMin = ReduceOp::kMin, kMax = ReduceOp::kMax;

// The expected contents of each vector, transcribed from the vectors' comments and checked
// by hand against WIRE.md. Do not regenerate these from the encoder.
std::vector<Vector> expected_vectors() {
  return {
      {"data_i32_sum",
       make_header(kFlagRetransmit, 0xA1B2C3D4u, 515, 0x0123, true, 4, kI32, kSum, 7, 65540,
                   kNoExponent, kNoRoot),
       {1, -1, INT32_MAX, INT32_MIN}},
      {"data_f32_sum",
       make_header(kFlagRetransmit | kFlagNonFinite, 0x10, 3, 2, false, 4, kF32, kSum, 0xFFFFFFFFu,
                   0xFFFFFFFFu, kNoExponent, kNoRoot),
       {0x3DCCCCCD, 0xBA83126F, 0x3DF5C28F, 0xBD800000}},
      {"data_f16_min",
       make_header(0, 0x11, 1, 9, true, 5, kF16, kMin, 1, 5, kNoExponent, 2),
       {0x3C00, 0xC000, 0x7BFF, 0x8000, 0x0001}},
      {"data_bf16_sum",
       make_header(0, 0x12, 0, 0, false, 4, kBF16, kSum, 2, 1000000, kNoExponent, kNoRoot),
       {0x3F80, 0xC020, 0x4049, 0x0001}},
      {"result_i32_max",
       make_header(kFlagResult, 0xFFFFFFFEu, 0, 0x7FFF, false, 3, kI32, kMax, 0x80000000u, 3,
                   kNoExponent, kNoRoot),
       {7, -7, 0}},
      {"result_f32_sum",
       make_header(kFlagResult | kFlagNonFinite, 0x10, 0, 2, false, 2, kF32, kSum, 0xFFFFFFFFu,
                   0xFFFFFFFFu, kNoExponent, kNoRoot),
       {0x7FC00000, 0x7FC00000}},
      {"result_f16_sum",
       make_header(kFlagResult, 0x20, 0, 4, true, 3, kF16, kSum, 12, 3, kNoExponent, kNoRoot),
       {0x3C00, 0x3555, 0x8000}},
      {"result_bf16_max",
       make_header(kFlagResult | kFlagRetransmit, 0x21, 0, 5, false, 4, kBF16, kMax, 13, 4,
                   kNoExponent, kNoRoot),
       {0xFF80, 0xC020, 0x8000, 0x3F80}},
      {"partial_exp_f32",
       make_header(kFlagPartial | kFlagNonFinite, 0x30, 1, 6, false, 0, kF32, kSum, 20, 1024, -3,
                   kNoRoot),
       {}},
      {"partial_exp_answer_bf16",
       make_header(kFlagPartial | kFlagResult, 0x31, 0, 7, true, 0, kBF16, kSum, 21, 2048, 5,
                   kNoRoot),
       {}},
      {"partial_f32_sum",
       make_header(kFlagPartial, 0x30, 1, 6, false, 2, kF32, kSum, 20, 1024, -63, kNoRoot),
       {922337217429372928ll, -9223372474941440ll}},
      {"partial_f16_sum",
       make_header(kFlagPartial, 0x40, 2, 8, true, 2, kF16, kSum, 22, 2, -26, kNoRoot),
       {100663296, -33554432}},
      {"hello",
       make_header(kFlagHello | kFlagRetransmit, 0x5EED1234u, 39, 0, false, 1, kI32, kSum, 0, 0,
                   kNoExponent, kNoRoot),
       {40}},
      {"welcome",
       make_header(kFlagHello | kFlagResult, 0x5EED1234u, 0, 0, false, 4, kI32, kSum, 0, 0,
                   kNoExponent, kNoRoot),
       {512, 1024, static_cast<int32_t>(0xD92353FEu), static_cast<int32_t>(0x936A9C72u)}},
      {"error_missing_ranks",
       make_header(kFlagError, 0xA1B2C3D4u, 515, 0x0123, true, 3, kI32, kSum, 7, 65540, kNoExponent,
                   kNoRoot),
       {static_cast<int32_t>(ErrorReason::kMissingRanks), static_cast<int32_t>(0x80000027u),
        0x00000081}},
      {"error_aborted",
       make_header(kFlagError, 0x1234, 2, 9, true, 3, kI32, kSum, 11, 1000, kNoExponent, kNoRoot),
       {static_cast<int32_t>(ErrorReason::kAborted), 2, static_cast<int32_t>(kAbortDeadline)}},
      {"error_superseded",
       make_header(kFlagError, 0x1234, 3, 9, true, 2, kI32, kSum, 11, 1000, kNoExponent, kNoRoot),
       {static_cast<int32_t>(ErrorReason::kSuperseded), 0x1274}},
  };
}

size_t width_of(const Header& h) { return payload_width(h.flags, h.dtype); }

// Word i of a payload of `width`-byte little-endian words, sign-extended.
int64_t load_word(const uint8_t* p, size_t width, size_t i) {
  uint64_t v = 0;
  for (size_t b = 0; b < width; ++b) v |= uint64_t{p[i * width + b]} << (8 * b);
  const unsigned shift = static_cast<unsigned>(64 - 8 * width);
  return static_cast<int64_t>(v << shift) >> shift;
}
int64_t truncate_word(int64_t w, size_t width) {
  const unsigned shift = static_cast<unsigned>(64 - 8 * width);
  return static_cast<int64_t>(static_cast<uint64_t>(w) << shift) >> shift;
}

std::vector<uint8_t> encode_vector(const Vector& v) {
  std::vector<uint8_t> out(packet_size(v.hdr), 0xCC);
  encode_header(v.hdr, out.data());
  const size_t w = width_of(v.hdr);
  for (size_t i = 0; i < v.words.size(); ++i) {
    for (size_t b = 0; b < w; ++b) {
      out[kHeaderSize + i * w + b] =
          static_cast<uint8_t>(static_cast<uint64_t>(v.words[i]) >> (8 * b));
    }
  }
  return out;
}

void expect_header_eq(const Header& got, const Header& want) {
  EXPECT_EQ(got.version, want.version);
  EXPECT_EQ(got.flags, want.flags);
  EXPECT_EQ(got.job, want.job);
  EXPECT_EQ(got.seq, want.seq);
  EXPECT_EQ(got.rank, want.rank);
  EXPECT_EQ(got.slot, want.slot);
  EXPECT_EQ(got.shadow, want.shadow);
  EXPECT_EQ(got.count, want.count);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.op, want.op);
  EXPECT_EQ(got.coll, want.coll);
  EXPECT_EQ(got.elems, want.elems);
  EXPECT_EQ(got.exp, want.exp);
  EXPECT_EQ(got.root, want.root);
  EXPECT_EQ(got.tag, want.tag);
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

TEST(WireTestdata, SectionsSplitByName) {
  std::map<std::string, std::vector<uint8_t>> v;
  std::string err;
  ASSERT_TRUE(parse_vectors("# head\n\n=== a_1\n# what\n49 4E # x\n\n=== b\n0aFF\n", &v, &err))
      << err;
  EXPECT_EQ(
      v, (std::map<std::string, std::vector<uint8_t>>{{"a_1", {0x49, 0x4E}}, {"b", {0x0A, 0xFF}}}));
}

TEST(WireTestdata, MalformedSectionsAreRejectedWithTheLine) {
  std::map<std::string, std::vector<uint8_t>> v;
  std::string err;
  EXPECT_FALSE(parse_vectors("=== a\n49\n=== b\n4E\n=== a\n00\n", &v, &err));
  EXPECT_NE(err.find("line 5"), std::string::npos) << err;
  EXPECT_NE(err.find("twice"), std::string::npos) << err;
  EXPECT_FALSE(parse_vectors("=== a\n49\n=== b\n4E 0\n", &v, &err));  // an odd digit count
  EXPECT_NE(err.find("section b: line 4"), std::string::npos) << err;
  EXPECT_FALSE(parse_vectors("=== a\n49\n=== b\n4E0", &v, &err));
  EXPECT_NE(err.find("section b: odd number"), std::string::npos) << err;
  EXPECT_FALSE(parse_vectors("=== a\n49\n=== b\n4E\n4 E\n", &v, &err));
  EXPECT_NE(err.find("line 5"), std::string::npos) << err;
  EXPECT_FALSE(parse_vectors("=== a\n49\n=== b\n4E\n4x\n", &v, &err));
  EXPECT_NE(err.find("line 5: unexpected character 'x'"), std::string::npos) << err;
  EXPECT_FALSE(parse_vectors("49\n=== a\n4E\n", &v, &err));  // bytes before any section
  EXPECT_FALSE(parse_vectors("=== a\n# nothing\n=== b\n4E\n", &v, &err));  // an empty one
  EXPECT_FALSE(parse_vectors("=== A\n49\n", &v, &err));                    // bad names
  EXPECT_FALSE(parse_vectors("===a\n49\n", &v, &err));
  EXPECT_FALSE(parse_vectors("=== a b\n49\n", &v, &err));
  EXPECT_FALSE(parse_vectors("=== \n49\n", &v, &err));
  EXPECT_FALSE(parse_vectors("# no section\n", &v, &err));
}

TEST(WireTestdata, AnUnknownNameFailsTheTest) {
  EXPECT_NONFATAL_FAILURE(load_vector("no_such_vector"), "has no vector no_such_vector");
  EXPECT_EQ(load_vector("hello").size(), kHeaderSize + 4);
}

// A malformed vectors file fails the test that loads from it (with the reason), not a crash.
TEST(WireTestdata, AMalformedFileFailsTheTest) {
  const std::string real = ::ina::testing::testdata_dir();
  const std::string dir =
      ::testing::TempDir() + "/wire_test_bad_vectors." + std::to_string(getpid());
  ASSERT_TRUE(std::filesystem::create_directories(dir) || std::filesystem::is_directory(dir));
  std::ofstream(dir + "/vectors.hex") << "=== hello\n49\n=== hello\n4E\n";
  ASSERT_EQ(setenv("INA_TESTDATA", dir.c_str(), 1), 0);
  EXPECT_NONFATAL_FAILURE(load_vector("hello"), "line 3: section hello appears twice");
  ASSERT_EQ(setenv("INA_TESTDATA", real.c_str(), 1), 0);
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(load_vector("hello").empty());
}

TEST(WireVectors, DecodeToTheDocumentedFields) {
  for (const Vector& v : expected_vectors()) {
    SCOPED_TRACE(v.name);
    const std::vector<uint8_t> bytes = load_vector(v.name);
    ASSERT_EQ(bytes.size(), packet_size(v.hdr));
    std::vector<uint8_t> storage;
    PacketView view;
    ASSERT_EQ(decode_exact(bytes, &view, &storage), DecodeError::kOk);
    expect_header_eq(view.hdr, v.hdr);
    ASSERT_EQ(view.payload, storage.data() + kHeaderSize);
    ASSERT_EQ(view.payload_bytes, v.words.size() * width_of(v.hdr));
    for (size_t i = 0; i < v.words.size(); ++i) {
      EXPECT_EQ(load_word(view.payload, width_of(v.hdr), i),
                truncate_word(v.words[i], width_of(v.hdr)))
          << "word " << i;
    }
    if (width_of(v.hdr) == kControlWordSize && !v.words.empty()) {
      std::vector<int32_t> loaded(v.words.size());
      load_words(loaded.data(), view.payload, loaded.size());
      for (size_t i = 0; i < v.words.size(); ++i) {
        EXPECT_EQ(view.word(i), static_cast<int32_t>(v.words[i]));
        EXPECT_EQ(loaded[i], static_cast<int32_t>(v.words[i]));
      }
    }
  }
}

TEST(WireVectors, EncodeReproducesTheBytes) {
  for (const Vector& v : expected_vectors()) {
    SCOPED_TRACE(v.name);
    EXPECT_EQ(encode_vector(v), load_vector(v.name));
  }
}

// The vector data_f32_sealed carries the tag that gen_vectors.py (its own POLYVAL and SipHash)
// computed under the incarnation key of welcome: the C++ MAC must accept exactly that packet.
TEST(WireVectors, SealedPacketVerifiesUnderTheIncarnationKey) {
  const std::vector<uint8_t> bytes = load_vector("data_f32_sealed");
  ASSERT_EQ(bytes.size(), kHeaderSize + 400);
  const Key128 key(0x8F679BA281A92F94ull, 0x4B458006CB2DD636ull);
  PacketView v;
  ASSERT_EQ(decode(bytes, &v), DecodeError::kOk);
  EXPECT_EQ(v.hdr.count, 100);
  EXPECT_EQ(v.hdr.tag, 0x2C485B5853E4B84Bull);
  for (size_t i = 0; i < 100; ++i) {
    float x;
    std::memcpy(&x, v.payload + 4 * i, 4);
    EXPECT_EQ(x, (static_cast<float>(i) - 50.0f) / 8.0f) << i;
  }
  EXPECT_TRUE(tag_ok(bytes, key));
  EXPECT_EQ(compute_tag(bytes, key), v.hdr.tag);
  EXPECT_FALSE(tag_ok(bytes, Key128(0x0706050403020100ull, 0x0F0E0D0C0B0A0908ull)));  // job key
  std::vector<uint8_t> b = bytes;
  b[kHeaderSize + 399] ^= 0x80;  // the last payload byte, in the partial last block
  EXPECT_FALSE(tag_ok(b, key));
}

TEST(WireVectors, UserWordsAreTheUsersBytes) {
  // DATA and RESULT payloads are the user's elements as they lie in memory: no swap.
  const std::vector<uint8_t> bytes = load_vector("data_f32_sum");
  const float xs[4] = {0.1f, -0.001f, 0.12f, -0.0625f};
  ASSERT_EQ(bytes.size(), kHeaderSize + sizeof xs);
  EXPECT_EQ(std::memcmp(bytes.data() + kHeaderSize, xs, sizeof xs), 0);
  const std::vector<uint8_t> h = load_vector("data_f16_min");
  const uint16_t hs[5] = {0x3C00, 0xC000, 0x7BFF, 0x8000, 0x0001};
  ASSERT_EQ(h.size(), kHeaderSize + sizeof hs);
  EXPECT_EQ(std::memcmp(h.data() + kHeaderSize, hs, sizeof hs), 0);
}

TEST(WireVectors, EveryKindAndDtypeIsCovered) {
  std::set<std::pair<int, int>> seen;  // (kind, dtype) for DATA/RESULT/PARTIAL
  for (const Vector& v : expected_vectors()) {
    const int kind = v.hdr.has(kFlagPartial)              ? 2
                     : v.hdr.has(kFlagHello | kFlagError) ? 3
                     : v.hdr.has(kFlagResult)             ? 1
                                                          : 0;
    if (kind < 3) seen.insert({kind, static_cast<int>(v.hdr.dtype)});
  }
  for (int d = 1; d <= 4; ++d) {
    EXPECT_TRUE(seen.count({0, d})) << "DATA dtype " << d;
    EXPECT_TRUE(seen.count({1, d})) << "RESULT dtype " << d;
  }
  EXPECT_TRUE(seen.count({2, 2}) && seen.count({2, 3}) && seen.count({2, 4}));
}

TEST(WireVectors, ErrorBitmapNamesTheRanksPresent) {
  const std::vector<uint8_t> bytes = load_vector("error_missing_ranks");
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

// The DATA vector, re-encoded from its header, as the base for crafted bad inputs.
std::vector<uint8_t> valid_packet() { return encode_vector(expected_vectors()[0]); }

TEST(WireDecode, EmptyAndMaximalPayloadsAreValid) {
  for (const Vector& v : expected_vectors()) {
    Header h = v.hdr;
    for (const uint16_t count : {uint16_t{0}, uint16_t{0xFFFF}}) {
      h.count = count;
      std::vector<uint8_t> bytes(packet_size(h), 0xAB);
      encode_header(h, bytes.data());
      std::vector<uint8_t> storage;
      PacketView view;
      ASSERT_EQ(decode_exact(bytes, &view, &storage), DecodeError::kOk) << v.name << count;
      EXPECT_EQ(view.hdr.count, count);
      EXPECT_EQ(view.payload_bytes, size_t{count} * width_of(h));
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
  for (const uint8_t version : {0, 1, 2, 3, 0xFF}) {
    std::vector<uint8_t> b = good;
    b[kOffVersion] = version;
    check(b, DecodeError::kBadVersion, "version " + std::to_string(version));
  }
  for (const uint8_t flag : {0x40, 0x80}) {
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
  for (const size_t extra : {1, 3, 4}) {  // int32 words
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

  // Payload width follows the kind and dtype: a 16-bit dtype halves the words' bytes.
  {
    std::vector<uint8_t> b = good;
    b[kOffDtype] = static_cast<uint8_t>(DType::kFloat16);
    check(b, DecodeError::kTrailingBytes, "float16 words: 8 of 16 bytes");
    put_u16(b.data() + kOffCount, 8);
    check(b, DecodeError::kOk, "float16, count 8");
  }
  // PARTIAL only for a float SUM, never with HELLO or ERROR; exp only on PARTIAL.
  {
    std::vector<uint8_t> b = load_vector("partial_f16_sum");
    ASSERT_EQ(b.size(), kHeaderSize + 8);
    check(b, DecodeError::kOk, "partial");
    std::vector<uint8_t> c = b;
    c[kOffOp] = static_cast<uint8_t>(ReduceOp::kMax);
    check(c, DecodeError::kBadPartial, "partial max");
    c = b;
    c[kOffDtype] = static_cast<uint8_t>(DType::kInt32);
    check(c, DecodeError::kBadPartial, "partial int32");
    c = b;
    c[kOffFlags] |= kFlagHello;
    check(c, DecodeError::kBadPartial, "partial hello");
    c = b;
    c[kOffFlags] |= kFlagError;
    check(c, DecodeError::kBadPartial, "partial error");
    c = good;
    put_u16(c.data() + kOffExp, 5);
    check(c, DecodeError::kBadExponent, "exp on DATA");
    c = load_vector("result_f16_sum");
    ASSERT_EQ(c.size(), kHeaderSize + 6);
    put_u16(c.data() + kOffExp, 0);
    check(c, DecodeError::kBadExponent, "exp 0 on RESULT");
  }

  const auto n = [&](DecodeError e) { return counters.by_error[static_cast<size_t>(e)]; };
  EXPECT_EQ(n(DecodeError::kOk), 3u);
  EXPECT_EQ(n(DecodeError::kTruncated), kHeaderSize);
  EXPECT_EQ(n(DecodeError::kBadMagic), 3u);
  EXPECT_EQ(n(DecodeError::kBadVersion), 5u);
  EXPECT_EQ(n(DecodeError::kUnknownFlags), 3u);
  EXPECT_EQ(n(DecodeError::kUnknownDtype), 4u);
  EXPECT_EQ(n(DecodeError::kUnknownOp), 3u);
  EXPECT_EQ(n(DecodeError::kCountBeyondPayload), 3u);
  EXPECT_EQ(n(DecodeError::kTrailingBytes), 5u);
  EXPECT_EQ(n(DecodeError::kBadPartial), 4u);
  EXPECT_EQ(n(DecodeError::kBadExponent), 2u);
  EXPECT_EQ(counters.total_rejected(), kHeaderSize + 3 + 5 + 3 + 4 + 3 + 3 + 5 + 4 + 2);
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
// the header, the size matches count, and re-encoding the header gives back the same 40 bytes
// (so no field is silently altered or dropped).
void expect_consistent(const std::vector<uint8_t>& storage, const PacketView& view) {
  ASSERT_EQ(storage.size(), packet_size(view.hdr));
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
    const size_t len = rng() % 96;
    std::vector<uint8_t> b(len);
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
    // Most random headers fail at the magic; give half of them a valid prefix to reach the
    // later checks.
    if (len >= 4 && (iter & 1)) {
      put_u16(b.data(), kMagic);
      b[kOffVersion] = kVersion;
      b[kOffFlags] &= kKnownFlags & ~kFlagPartial;
    }
    if (len >= kHeaderSize && (iter & 3) == 1) {
      b[kOffDtype] = static_cast<uint8_t>(1 + rng() % 4);
      b[kOffOp] = static_cast<uint8_t>(1 + rng() % 3);
      put_u16(b.data() + kOffCount,
              static_cast<uint16_t>((len - kHeaderSize) /
                                    payload_width(b[kOffFlags], static_cast<DType>(b[kOffDtype]))));
      put_u16(b.data() + kOffExp, static_cast<uint16_t>(kNoExponent));
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
    SCOPED_TRACE(v.name);
    const std::vector<uint8_t> good = load_vector(v.name);
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

namespace ina::wire {
namespace {

// WIRE.md "Incarnations": the epoch of a barrier and an incarnation's key, against the values
// gen_vectors.py (an independent Python SipHash) wrote into the comment of the vector welcome.
TEST(WireIncarnation, EpochAndKeyMatchTheVectors) {
  const Key128 job(0x0706050403020100ull, 0x0F0E0D0C0B0A0908ull);  // the SipHash paper's key
  const BlockSeq nonces[3] = {0x5EED1234u, 0x5EED1235u, 0x5EED1200u};
  const uint64_t epoch = incarnation_epoch(job, 0x5A17, nonces);
  EXPECT_EQ(epoch, 0x936A9C72D92353FEull);
  EXPECT_EQ(incarnation_key(job, epoch), Key128(0x8F679BA281A92F94ull, 0x4B458006CB2DD636ull));
  std::vector<BlockSeq> sixty(60);
  for (BlockSeq r = 0; r < 60; ++r) sixty[r] = r + 1;
  EXPECT_EQ(incarnation_epoch(job, 0, sixty), 0xFB2DFEF17D0BC860ull);  // three chain blocks

  // Each input moves the epoch: the salt, any one nonce, the key.
  EXPECT_NE(incarnation_epoch(job, 0x5A18, nonces), epoch);
  const BlockSeq newer[3] = {0x5EED1234u, 0x5EED1236u, 0x5EED1200u};
  EXPECT_NE(incarnation_epoch(job, 0x5A17, newer), epoch);
  EXPECT_NE(incarnation_epoch(Key128(1, 0), 0x5A17, nonces), epoch);
  EXPECT_NE(incarnation_key(job, epoch + 1), incarnation_key(job, epoch));
  EXPECT_NE(incarnation_key(job, epoch), job);
}

}  // namespace
}  // namespace ina::wire
