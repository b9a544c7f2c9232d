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
      ASSERT_EQ(packet_mac_parts(key, h, b, zero_word, p),
                packet_mac(key, std::span<const uint8_t>(all.data(), n), zero_word, p))
          << mac_path_name(p) << " head " << head << " body " << body << " zero " << zero_word;
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

TEST(PacketMac, WireTagIsThePacketMac) {
  const Key128 k{5, 6};
  std::vector<uint8_t> d = random_bytes(wire::kHeaderSize + 64, 9);
  EXPECT_EQ(wire::compute_tag(d, k), packet_mac(expand_mac_key(k), d, wire::kOffTag / 8));
}

}  // namespace
}  // namespace ina
