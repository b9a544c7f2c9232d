// The packet MAC (mac.h): POLYVAL against RFC 8452's vector and an independent Python rendering
// (protocol/testdata/gen_vectors.py's polyval()), the carry-less path against the portable one,
// and the MAC's handling of the tag word, the length and the key cache.
#include "ina/protocol/mac.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ina/protocol/codec.h"
#include "ina/protocol/wire.h"

namespace ina {
namespace {

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<uint8_t>(std::stoul(h.substr(i, 2), nullptr, 16)));
  return out;
}

Gf128 gf_from_hex(const std::string& h) {
  const std::vector<uint8_t> b = from_hex(h);
  Gf128 x;
  std::memcpy(&x.lo, b.data(), 8);
  std::memcpy(&x.hi, b.data() + 8, 8);
  return x;
}

std::string hex(const Gf128& x) {
  uint8_t b[16];
  std::memcpy(b, &x.lo, 8);
  std::memcpy(b + 8, &x.hi, 8);
  std::string s;
  char two[3];
  for (uint8_t v : b) {
    std::snprintf(two, sizeof two, "%02x", v);
    s += two;
  }
  return s;
}

std::vector<MacPath> available_paths() {
  std::vector<MacPath> out;
  for (MacPath p : {MacPath::kPortable, MacPath::kClmul, MacPath::kClmul512})
    if (mac_path_available(p)) out.push_back(p);
  return out;
}

// RFC 8452, Appendix A ("POLYVAL(H, X_1, X_2)").
const Gf128 kRfcH = gf_from_hex("25629347589242761d31f826ba4b757b");

TEST(Polyval, Rfc8452Vector) {
  const std::vector<uint8_t> x =
      from_hex("4f4f95668c83dfb6401762bb2d01a262d1a24ddd2721d006bbe45f20d3c9f362");
  for (MacPath path : available_paths()) {
    SCOPED_TRACE(mac_path_name(path));
    EXPECT_EQ(hex(polyval(kRfcH, x, path)), "f7a3b47b846119fae5b7866cf5e5b77e");
    EXPECT_EQ(hex(polyval(kRfcH, {}, path)), "00000000000000000000000000000000");
  }
}

TEST(Polyval, MatchesThePythonRendering) {
  // Byte i = 7i + 3: 300 bytes (18 whole blocks and a partial one: two folds of eight, a rest)
  // and 17 (one block and a one-byte partial block), zero-padded.
  std::vector<uint8_t> m(300);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::span<const uint8_t> m17(m.data(), 17);
  for (MacPath path : available_paths()) {
    SCOPED_TRACE(mac_path_name(path));
    EXPECT_EQ(hex(polyval(kRfcH, m, path)), "c9399608e39539e1af6d288ed0c826b6");
    EXPECT_EQ(hex(polyval(kRfcH, m17, path)), "0a5374b44f5d84e5a50d047c8ddb7709");
  }
}

TEST(Polyval, EveryPathEqualsThePortableOneOnRandomInputs) {
  // Lengths 0 .. 1600 bytes: every count of whole blocks in a fold, every partial last group of
  // the 512-bit path, runs longer than one fold.
  const std::vector<MacPath> paths = available_paths();
  std::printf("paths on this CPU:");
  for (MacPath p : paths) std::printf(" %s", mac_path_name(p));
  std::printf(" (best: %s)\n", mac_path_name(best_mac_path()));
  std::mt19937_64 rng(42);
  for (int t = 0; t < 600; ++t) {
    const Gf128 h{rng(), rng()};
    std::vector<uint8_t> m(t < 200 ? static_cast<size_t>(t) * 8
                                   : static_cast<size_t>(rng() % 1600));
    for (auto& b : m) b = static_cast<uint8_t>(rng());
    const Gf128 want = polyval(h, m, MacPath::kPortable);
    for (MacPath p : paths)
      ASSERT_EQ(polyval(h, m, p), want) << mac_path_name(p) << " " << m.size();
  }
}

TEST(Polyval, EveryPathEqualsThePortableOneOnJumboDatagramsAtEveryAlignment) {
  // Datagrams of a jumbo-frame block (up to 9000 bytes: many whole folds, where the 512-bit path
  // keeps the key's powers in registers), starting at every offset of a 64-byte line.
  const std::vector<MacPath> paths = available_paths();
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(9000 + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{511}, size_t{512}, size_t{513}, size_t{1024}, size_t{1472}, size_t{4136},
                   size_t{8232}, size_t{8233}, size_t{9000}}) {
    for (size_t off = 0; off < 64; off += 1 + off / 8) {
      const Gf128 h{rng(), rng()};
      const std::span<const uint8_t> m(buf.data() + off, n);
      const Gf128 want = polyval(h, m, MacPath::kPortable);
      for (MacPath p : paths)
        ASSERT_EQ(polyval(h, m, p), want) << mac_path_name(p) << " " << n << " at +" << off;
    }
  }
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> m(n);
  for (auto& b : m) b = static_cast<uint8_t>(rng());
  return m;
}

TEST(PacketMac, InTwoPartsEqualsTheMacOfTheConcatenation) {
  // Every head length up to kMaxMacHead, bodies from empty to a jumbo block at odd offsets, the
  // zeroed word anywhere in the first 48 bytes, by every path.
  std::mt19937_64 rng(11);
  std::vector<uint8_t> all(kMaxMacHead + 9000 + 16);
  for (auto& b : all) b = static_cast<uint8_t>(rng());
  const MacKey key = expand_mac_key(Key128{rng(), rng()});
  for (int t = 0; t < 400; ++t) {
    const size_t head = static_cast<size_t>(rng() % (kMaxMacHead + 1));
    const size_t body =
        t % 4 == 0 ? 8192 + static_cast<size_t>(rng() % 17) : static_cast<size_t>(rng() % 1200);
    const size_t n = head + body;
    if (n < 8) continue;
    const size_t zero_word = static_cast<size_t>(rng() % std::min<size_t>(6, n / 8));
    const size_t off = static_cast<size_t>(rng() % 16);
    // The body from elsewhere (its own alignment), the same bytes as the concatenation's.
    std::vector<uint8_t> body_buf(body + 16);
    std::memcpy(body_buf.data() + off, all.data() + head, body);
    const std::span<const uint8_t> h(all.data(), head);
    const std::span<const uint8_t> b(body_buf.data() + off, body);
    for (MacPath p : available_paths()) {
      const uint64_t want = packet_mac(key, std::span<const uint8_t>(all.data(), n), zero_word, p);
      ASSERT_EQ(packet_mac_parts(key, h, b, zero_word, p), want)
          << mac_path_name(p) << " head " << head << " body " << body << " zero " << zero_word;
      // packet_mac_parts_copy: the same MAC, the body copied exactly to a destination at another
      // alignment, nothing written beside it.
      const size_t dst_off = static_cast<size_t>(rng() % 64);
      std::vector<uint8_t> out(64 + body + 64, 0xCC);
      ASSERT_EQ(packet_mac_parts_copy(key, h, b, zero_word, out.data() + dst_off, p), want)
          << mac_path_name(p) << " head " << head << " body " << body << " zero " << zero_word;
      ASSERT_EQ(0, body == 0 ? 0 : std::memcmp(out.data() + dst_off, b.data(), body));
      for (size_t i = 0; i < out.size(); ++i) {
        if (i < dst_off || i >= dst_off + body) {
          ASSERT_EQ(out[i], 0xCC) << i;
        }
      }
    }
  }
}

TEST(PacketMac, WireSealInTwoPartsIsTheWholeDatagramsTag) {
  std::vector<uint8_t> d = random_bytes(wire::kHeaderSize + 8192, 5);
  const Key128 key{3, 4};
  wire::seal(d, key);
  std::vector<uint8_t> head(d.begin(), d.begin() + wire::kHeaderSize);
  std::memset(head.data() + wire::kOffTag, 0xAB, wire::kTagSize);  // overwritten
  wire::seal_parts(head, std::span<const uint8_t>(d).subspan(wire::kHeaderSize), key);
  EXPECT_EQ(0, std::memcmp(head.data(), d.data(), wire::kHeaderSize));
  EXPECT_TRUE(wire::tag_ok(d, key));
  // seal_copy: the datagram built in one buffer from a payload kept elsewhere.
  std::vector<uint8_t> built(d.size());
  std::memcpy(built.data(), d.data(), wire::kHeaderSize);
  std::memset(built.data() + wire::kOffTag, 0xAB, wire::kTagSize);
  wire::seal_copy(std::span<uint8_t>(built.data(), wire::kHeaderSize),
                  std::span<const uint8_t>(d).subspan(wire::kHeaderSize),
                  built.data() + wire::kHeaderSize, key);
  EXPECT_EQ(built, d);
}

TEST(PacketMac, TheZeroedWordIsIgnoredAndEveryOtherByteCounts) {
  const Key128 k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  const MacKey mk = expand_mac_key(k);
  for (size_t n : {size_t{40}, size_t{41}, size_t{47}, size_t{48}, size_t{49}, size_t{1472}}) {
    std::vector<uint8_t> m = random_bytes(n, n);
    const uint64_t t = packet_mac(mk, m, 4);
    EXPECT_EQ(packet_mac(k, m, 4), t) << n;  // the cached key gives the same tag
    for (size_t i = 32; i < 40; ++i) {
      m[i] ^= 0xA5;
      EXPECT_EQ(packet_mac(mk, m, 4), t) << "tag byte " << i << " of " << n;
    }
    for (size_t i = 0; i < n; ++i) {
      if (i >= 32 && i < 40) continue;
      m[i] ^= 1;
      EXPECT_NE(packet_mac(mk, m, 4), t) << "byte " << i << " of " << n;
      m[i] ^= 1;
    }
  }
}

TEST(PacketMac, LengthAndKeyAreBound) {
  const Key128 k{1, 2};
  std::vector<uint8_t> m = random_bytes(100, 7);
  const uint64_t t = packet_mac(k, m, 4);
  // Zero padding would make m and m + a zero byte the same blocks; the length tells them apart.
  m.push_back(0);
  EXPECT_NE(packet_mac(k, m, 4), t);
  m.pop_back();
  EXPECT_EQ(packet_mac(k, m, 4), t);
  EXPECT_NE(packet_mac(Key128{1, 3}, m, 4), t);
  EXPECT_NE(packet_mac(Key128{}, m, 4), t);
  // A key's hash key is derived, not the key itself: two keys, two hash keys.
  EXPECT_NE(expand_mac_key(Key128{1, 2}).hrev[kMacFold - 1],
            expand_mac_key(Key128{1, 3}).hrev[kMacFold - 1]);
  EXPECT_EQ(expand_mac_key(k).prf, k);
}

TEST(PacketMac, TheKeyCacheNeverServesAnotherKeysTag) {
  // More keys than cache entries, interleaved, several of them sharing the cache index's mix
  // (lo ^ hi equal): every tag as the freshly expanded key gives it.
  std::vector<Key128> keys;
  for (uint64_t i = 0; i < 40; ++i) keys.push_back(Key128{i * 0x1111, i * 0x1111 ^ 0x5555});
  for (uint64_t i = 0; i < 8; ++i) keys.push_back(Key128{i, i ^ 0x77});  // same lo ^ hi
  std::vector<uint8_t> m = random_bytes(600, 3);
  std::vector<uint64_t> want;
  for (const Key128& k : keys) want.push_back(packet_mac(expand_mac_key(k), m, 4));
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < keys.size(); ++i)
      ASSERT_EQ(packet_mac(keys[(i * 7 + static_cast<size_t>(round)) % keys.size()], m, 4),
                want[(i * 7 + static_cast<size_t>(round)) % keys.size()]);
}

TEST(PacketMac, EveryThreadHasItsOwnCache) {
  // Threads sealing under different keys at once: each tag as the expanded key gives it.
  const std::vector<uint8_t> m = random_bytes(300, 5);
  std::vector<uint64_t> want(8);
  for (size_t i = 0; i < want.size(); ++i) want[i] = packet_mac(expand_mac_key(Key128{i, 1}), m, 4);
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < wrong.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < 2000; ++it) {
        const size_t i = (t + static_cast<size_t>(it)) % want.size();
        if (packet_mac(Key128{i, 1}, m, 4) != want[i]) ++wrong[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

TEST(PacketMac, ManyAtOnceEqualsOneAtATime) {
  // Bursts of datagrams: runs of one length (the lockstep groups, full and partial: 1 to 9 of a
  // length) and of mixed lengths, under several keys, at every length from the tag word's end to
  // beyond two folds, odd alignments included; each datagram's MAC as packet_mac gives it, and a
  // flipped byte in one datagram changes its MAC only.
  const MacKey keys[3] = {expand_mac_key(Key128{1, 2}), expand_mac_key(Key128{3, 4}),
                          expand_mac_key(Key128{5, 6})};
  std::mt19937 rng(11);
  std::vector<uint8_t> pool = random_bytes(40000, 13);
  for (size_t len = 40; len <= 1100; len += (len < 200 ? 1 : 37)) {
    for (size_t run : {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{5}, size_t{9}}) {
      std::vector<std::span<const uint8_t>> msgs;
      std::vector<const MacKey*> ks;
      for (size_t i = 0; i < run + 3; ++i) {
        // The run, then three of other lengths.
        const size_t l = i < run ? len : len + 1 + rng() % 300;
        const size_t at = rng() % (pool.size() - l);
        msgs.emplace_back(pool.data() + at, l);
        ks.push_back(&keys[rng() % 3]);
      }
      std::vector<uint64_t> got(msgs.size());
      packet_mac_many(ks.data(), msgs.data(), msgs.size(), wire::kOffTag / 8, got.data());
      for (size_t i = 0; i < msgs.size(); ++i)
        ASSERT_EQ(got[i], packet_mac(*ks[i], msgs[i], wire::kOffTag / 8))
            << "length " << msgs[i].size() << ", datagram " << i << " of a run of " << run;
    }
  }
  std::vector<uint8_t> a = random_bytes(4136, 17);
  std::vector<std::vector<uint8_t>> copies(4, a);
  std::vector<std::span<const uint8_t>> msgs(copies.begin(), copies.end());
  const MacKey* ks[4] = {&keys[0], &keys[0], &keys[0], &keys[0]};
  uint64_t same[4];
  packet_mac_many(ks, msgs.data(), 4, wire::kOffTag / 8, same);
  for (size_t at : {size_t{0}, size_t{31}, size_t{39}, size_t{40}, size_t{4135}}) {
    copies[2][at] ^= 1;
    uint64_t got[4];
    packet_mac_many(ks, msgs.data(), 4, wire::kOffTag / 8, got);
    EXPECT_EQ(got[0], same[0]);
    EXPECT_EQ(got[3], same[3]);
    if (at / 8 == wire::kOffTag / 8)
      EXPECT_EQ(got[2], same[2]) << "the tag word is read as zero";
    else
      EXPECT_NE(got[2], same[2]) << "byte " << at;
    copies[2][at] ^= 1;
  }
}

TEST(PacketMac, WireTagIsThePacketMac) {
  const Key128 k{5, 6};
  std::vector<uint8_t> d = random_bytes(wire::kHeaderSize + 64, 9);
  EXPECT_EQ(wire::compute_tag(d, k), packet_mac(expand_mac_key(k), d, wire::kOffTag / 8));
}

// ---- the receive pass (packet_mac_copy): the MAC as packet_mac gives it, the bytes from `from`
// copied exactly (nothing written outside them), and the float32 scan as the codec's.

constexpr uint8_t kGuard = 0xCC;
constexpr size_t kGuardBytes = 64;

// packet_mac_copy(path) of msg into dst at dst_off of a guarded buffer, checked against packet_mac
// and a plain copy; with `codes`, the scanning variant, and packet_mac_scan (the same scan and
// MAC without the copy). Returns a failure message, empty if none.
std::string check_pass(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                       size_t from, size_t dst_off, MacPath p, MagnitudeCodes* codes,
                       CopyDst dst_kind = CopyDst::kResident) {
  const size_t len = msg.size() - from;
  std::vector<uint8_t> out(kGuardBytes + 64 + len + kGuardBytes, kGuard);
  uint8_t* dst = out.data() + kGuardBytes + dst_off;
  MagnitudeCodes scanned = codes != nullptr ? *codes : MagnitudeCodes{};
  const uint64_t got = codes == nullptr
                           ? packet_mac_copy(key, msg, zero_word, from, dst, p, dst_kind)
                           : packet_mac_copy(key, msg, zero_word, from, dst, codes, p);
  std::string where = std::string(mac_path_name(p)) + ", " + std::to_string(msg.size()) +
                      " bytes from " + std::to_string(from) + " (zero word " +
                      std::to_string(zero_word) + "), dst at +" + std::to_string(dst_off) +
                      (dst_kind == CopyDst::kStream ? " (stream)" : "") + ": ";
  if (got != packet_mac(key, msg, zero_word, p)) return where + "MAC differs";
  if (codes != nullptr) {
    if (packet_mac_scan(key, msg, zero_word, from, &scanned, p) != got)
      return where + "packet_mac_scan's MAC differs";
    if (scanned.top != codes->top || scanned.nonfinite != codes->nonfinite)
      return where + "packet_mac_scan's scan differs";
  }
  if (len > 0 && std::memcmp(dst, msg.data() + from, len) != 0) return where + "copy differs";
  for (size_t i = 0; i < out.size(); ++i) {
    const bool inside = i >= kGuardBytes + dst_off && i < kGuardBytes + dst_off + len;
    if (!inside && out[i] != kGuard)
      return where + "wrote outside the copy at " + std::to_string(i);
  }
  return {};
}

TEST(ReceivePass, CopiesThePayloadAndGivesThePacketMacAtEveryLengthAndAlignment) {
  // Every payload length up to 4136 bytes (many whole 32-block folds) with the source and the
  // destination at varied offsets of a 64-byte line, into resident storage and into a stream (the
  // pass then prefetches past its stores), then every pair of offsets 0..63 for lengths around the
  // vector and fold sizes; the portable (bit-serial) path over fewer lengths.
  std::mt19937_64 rng(21);
  const MacKey key = expand_mac_key(Key128{rng(), rng()});
  std::vector<uint8_t> all(64 + wire::kHeaderSize + 4136);
  for (auto& b : all) b = static_cast<uint8_t>(rng());
  for (MacPath p : available_paths()) {
    const size_t max_len = p == MacPath::kPortable ? 700 : 4136;
    for (size_t len = 0; len <= max_len; ++len) {
      const size_t src_off = (len * 13) % 64, dst_off = (len * 29 + 5) % 64;
      const std::span<const uint8_t> msg(all.data() + src_off, wire::kHeaderSize + len);
      for (CopyDst where : {CopyDst::kResident, CopyDst::kStream}) {
        const std::string e =
            check_pass(key, msg, 4, wire::kHeaderSize, dst_off, p, nullptr, where);
        ASSERT_TRUE(e.empty()) << e;
      }
    }
    const std::vector<size_t> lens =
        p == MacPath::kPortable
            ? std::vector<size_t>{0, 1, 7, 8, 9, 24, 57}
            : std::vector<size_t>{0, 1, 7, 8, 9, 24, 56, 57, 63, 64, 65, 120, 504, 512, 1024, 1432};
    for (size_t len : lens) {
      for (size_t src_off = 0; src_off < 64; ++src_off) {
        for (size_t dst_off = 0; dst_off < 64; dst_off += p == MacPath::kPortable ? 7 : 1) {
          const std::span<const uint8_t> msg(all.data() + src_off, wire::kHeaderSize + len);
          const std::string e = check_pass(key, msg, 4, wire::kHeaderSize, dst_off, p, nullptr);
          ASSERT_TRUE(e.empty()) << e;
        }
      }
    }
    // Other zeroed words and copy starts mac.h allows (the copy starting in the blocks read from
    // the zeroed copy, or right after them), short messages included.
    for (const auto& [zero_word, from] : std::vector<std::pair<size_t, size_t>>{
             {0, 8}, {0, 16}, {1, 16}, {2, 24}, {2, 32}, {4, 44}, {4, 48}, {7, 64}}) {
      for (size_t n = from; n < from + 300; n += p == MacPath::kPortable ? 13 : 1) {
        const std::span<const uint8_t> msg(all.data() + n % 64, n);
        const std::string e = check_pass(key, msg, zero_word, from, (n * 7) % 64, p, nullptr);
        ASSERT_TRUE(e.empty()) << e;
      }
    }
  }
}

// float32 words with every kind of edge value among random finite ones.
std::vector<uint32_t> edgy_floats(size_t n, std::mt19937_64& rng, bool finite_only) {
  static constexpr uint32_t kEdges[] = {
      0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0xFFBFFFFFu,  // quiet and signalling NaNs
      0x7F800000u, 0xFF800000u,                            // +-Inf
      0x00000001u, 0x807FFFFFu, 0x00400000u,               // subnormals
      0x00000000u, 0x80000000u,                            // +-0
      0x7F7FFFFFu, 0xFF7FFFFFu, 0x00800000u, 0x3F800000u,  // largest finite, smallest normal, 1
  };
  std::vector<uint32_t> w(n);
  const size_t edges = finite_only ? 4 : std::size(kEdges);  // the first finite edge is index 6
  for (auto& x : w) {
    if (rng() % 16 == 0) {
      x = kEdges[finite_only ? 6 + rng() % (std::size(kEdges) - 6) : rng() % edges];
    } else {
      // A random finite magnitude of any exponent, so that the largest varies.
      x = static_cast<uint32_t>(rng()) & 0x807FFFFFu;
      x |= static_cast<uint32_t>(rng() % 255) << 23;
    }
  }
  return w;
}

TEST(ReceivePass, ScansTheCopiedFloatsAsTheCodecDoes) {
  // The scanning variant: the copy and the MAC as above, and the largest finite code and the
  // non-finite mark giving codec::scan's block exponent and mark (SUM: Inf and NaN count; MIN/MAX:
  // NaN only), for every element count up to 1100 (then some grid of offsets), blocks with and
  // without non-finite values, the values carried over from the caller kept.
  std::mt19937_64 rng(33);
  const MacKey key = expand_mac_key(Key128{rng(), rng()});
  for (MacPath p : available_paths()) {
    const size_t max_count = p == MacPath::kPortable ? 180 : 1100;
    for (size_t count = 0; count <= max_count; ++count) {
      for (int variant = 0; variant < 3; ++variant) {
        const bool finite_only = variant == 0;
        const std::vector<uint32_t> w = edgy_floats(count, rng, finite_only);
        std::vector<uint8_t> msg(64 + wire::kHeaderSize + count * 4);
        const size_t src_off = (count + static_cast<size_t>(variant) * 21) % 64;
        for (size_t i = 0; i < wire::kHeaderSize; ++i) {
          msg[src_off + i] = static_cast<uint8_t>(rng());
        }
        // A tag field whose bytes look like NaNs and huge floats: never scanned.
        std::memset(msg.data() + src_off + wire::kOffTag, 0x7F, wire::kTagSize);
        if (count > 0) std::memcpy(msg.data() + src_off + wire::kHeaderSize, w.data(), count * 4);
        const std::span<const uint8_t> m(msg.data() + src_off, wire::kHeaderSize + count * 4);
        const ReduceOp op = variant == 2 ? ReduceOp::kMax : ReduceOp::kSum;
        MagnitudeCodes codes;
        codes.bad = codec::nonfinite_code(DType::kFloat32, op);
        const std::string e =
            check_pass(key, m, 4, wire::kHeaderSize, (count * 11) % 64, p, &codes);
        ASSERT_TRUE(e.empty()) << e;
        const codec::Scan want = codec::scan(w.data(), count, DType::kFloat32, op);
        const codec::Scan got = codec::scan_of_codes(DType::kFloat32, codes.top, codes.nonfinite);
        ASSERT_EQ(got.exp, want.exp) << mac_path_name(p) << " count " << count << " v" << variant;
        ASSERT_EQ(got.nonfinite, want.nonfinite)
            << mac_path_name(p) << " count " << count << " v" << variant;
        // Carried over: a larger top and a set mark stay.
        MagnitudeCodes carried{codes.bad, 0x7F7FFFFFu, true};
        ASSERT_TRUE(check_pass(key, m, 4, wire::kHeaderSize, 3, p, &carried).empty());
        EXPECT_EQ(carried.top, 0x7F7FFFFFu);
        EXPECT_TRUE(carried.nonfinite);
      }
    }
    for (size_t count : {size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{16}, size_t{255},
                         size_t{256}, size_t{358}}) {
      const std::vector<uint32_t> w = edgy_floats(count, rng, false);
      std::vector<uint8_t> msg(64 + wire::kHeaderSize + count * 4);
      for (size_t src_off = 0; src_off < 64; src_off += p == MacPath::kPortable ? 5 : 1) {
        for (size_t i = 0; i < wire::kHeaderSize; ++i) msg[src_off + i] = static_cast<uint8_t>(i);
        std::memcpy(msg.data() + src_off + wire::kHeaderSize, w.data(), count * 4);
        const std::span<const uint8_t> m(msg.data() + src_off, wire::kHeaderSize + count * 4);
        for (size_t dst_off = 0; dst_off < 64; dst_off += p == MacPath::kPortable ? 9 : 1) {
          MagnitudeCodes codes;
          const std::string e = check_pass(key, m, 4, wire::kHeaderSize, dst_off, p, &codes);
          ASSERT_TRUE(e.empty()) << e;
          const codec::Scan want = codec::scan(w.data(), count, DType::kFloat32, ReduceOp::kSum);
          const codec::Scan got = codec::scan_of_codes(DType::kFloat32, codes.top, codes.nonfinite);
          ASSERT_EQ(got.exp, want.exp) << count << " +" << src_off << " +" << dst_off;
          ASSERT_EQ(got.nonfinite, want.nonfinite) << count << " +" << src_off << " +" << dst_off;
        }
      }
    }
  }
}

TEST(ReceivePass, WireTagOkCopyIsTagOkPlusTheCopy) {
  std::vector<uint8_t> d = random_bytes(wire::kHeaderSize + 1024, 13);
  const Key128 key{7, 8};
  wire::seal(d, key);
  std::vector<uint8_t> out(1024);
  EXPECT_TRUE(wire::tag_ok_copy(d, key, out.data()));
  EXPECT_EQ(0, std::memcmp(out.data(), d.data() + wire::kHeaderSize, 1024));
  MagnitudeCodes codes;
  std::fill(out.begin(), out.end(), 0);
  EXPECT_TRUE(wire::tag_ok_copy(d, key, out.data(), &codes));
  EXPECT_EQ(0, std::memcmp(out.data(), d.data() + wire::kHeaderSize, 1024));
  EXPECT_TRUE(wire::tag_ok_scan(d, key, &codes));
  // Any flipped bit outside the tag field, another key, or a short datagram: false.
  for (size_t i : {size_t{0}, size_t{31}, size_t{40}, size_t{500}, size_t{1063}}) {
    d[i] ^= 0x10;
    EXPECT_FALSE(wire::tag_ok_copy(d, key, out.data())) << i;
    EXPECT_FALSE(wire::tag_ok_copy(d, key, out.data(), &codes)) << i;
    EXPECT_FALSE(wire::tag_ok_scan(d, key, &codes)) << i;
    d[i] ^= 0x10;
  }
  EXPECT_FALSE(wire::tag_ok_copy(d, Key128{7, 9}, out.data()));
  EXPECT_FALSE(wire::tag_ok_copy(std::span<const uint8_t>(d.data(), 39), key, out.data()));
}

}  // namespace
}  // namespace ina
