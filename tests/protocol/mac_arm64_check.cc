// The packet MAC's arm64 path, run under qemu-user by test mac_arm64 (tests/arm64_check.sh) (no
// gtest: a static cross build). RFC 8452's vector by every path this CPU has, and PMULL against the
// portable path on random inputs; a failure exits 1. (The x86 paths: mac_test.)
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ina/protocol/mac.h"
using namespace ina;
int main() {
  int bad = 0;
  std::printf("best path: %s, pmull available: %d\n", mac_path_name(best_mac_path()),
              (int)mac_path_available(MacPath::kClmul));
  const uint8_t hb[16] = {0x25, 0x62, 0x93, 0x47, 0x58, 0x92, 0x42, 0x76,
                          0x1d, 0x31, 0xf8, 0x26, 0xba, 0x4b, 0x75, 0x7b};
  Gf128 h;
  std::memcpy(&h, hb, 16);
  const uint8_t x[32] = {0x4f, 0x4f, 0x95, 0x66, 0x8c, 0x83, 0xdf, 0xb6, 0x40, 0x17, 0x62,
                         0xbb, 0x2d, 0x01, 0xa2, 0x62, 0xd1, 0xa2, 0x4d, 0xdd, 0x27, 0x21,
                         0xd0, 0x06, 0xbb, 0xe4, 0x5f, 0x20, 0xd3, 0xc9, 0xf3, 0x62};
  const uint8_t want[16] = {0xf7, 0xa3, 0xb4, 0x7b, 0x84, 0x61, 0x19, 0xfa,
                            0xe5, 0xb7, 0x86, 0x6c, 0xf5, 0xe5, 0xb7, 0x7e};
  for (MacPath p : {MacPath::kPortable, MacPath::kClmul}) {
    if (!mac_path_available(p)) continue;
    Gf128 r = polyval(h, x, p);
    bool ok = std::memcmp(&r, want, 16) == 0;
    std::printf("RFC 8452 vector by %s: %s\n", mac_path_name(p), ok ? "ok" : "WRONG");
    bad += !ok;
  }
  std::mt19937_64 rng(1);
  int mism = 0;
  for (int t = 0; t < 300; ++t) {
    Gf128 k{rng(), rng()};
    std::vector<uint8_t> m(rng() % 1600);
    for (auto& b : m) b = (uint8_t)rng();
    if (mac_path_available(MacPath::kClmul) &&
        !(polyval(k, m, MacPath::kClmul) == polyval(k, m, MacPath::kPortable)))
      ++mism;
  }
  std::printf("random inputs, pmull vs portable: %d mismatches of 300\n", mism);
  bad += mism;
  // The receive pass (packet_mac_copy, with and without the float32 scan) by every path: the MAC
  // as packet_mac gives it, the payload copied and nothing past it, the codes as a plain loop
  // finds them (edge values: NaN, Inf, subnormals, -0, the largest finite).
  const uint32_t edges[] = {0x7FC00000u, 0xFF800000u, 0x7F800000u, 0x00000001u,
                            0x80000000u, 0x7F7FFFFFu, 0x807FFFFFu, 0x7F800001u};
  int pass_bad = 0;
  const MacKey key = expand_mac_key(Key128{rng(), rng()});
  for (MacPath p : {MacPath::kPortable, MacPath::kClmul}) {
    if (!mac_path_available(p)) continue;
    for (size_t count = 0; count < 400; count += (p == MacPath::kPortable ? 7 : 1)) {
      const size_t off = count % 64, doff = (count * 5) % 64;
      std::vector<uint8_t> m(64 + 40 + count * 4), out(64 + count * 4 + 64, 0xCC);
      for (auto& b : m) b = (uint8_t)rng();
      uint32_t top = 0;
      bool nonfinite = false;
      for (size_t i = 0; i < count; ++i) {
        uint32_t w = rng() % 8 == 0 ? edges[rng() % 8] : (uint32_t)rng() & 0xBFFFFFFFu;
        std::memcpy(m.data() + off + 40 + 4 * i, &w, 4);
        w &= 0x7FFFFFFFu;
        if (w >= 0x7F800000u) nonfinite = true;
        if (w < 0x7F800000u && w > top) top = w;
      }
      const std::span<const uint8_t> msg(m.data() + off, 40 + count * 4);
      const uint64_t want = packet_mac(key, msg, 4, p);
      MagnitudeCodes codes;
      const bool ok = packet_mac_copy(key, msg, 4, 40, out.data() + doff, &codes, p) == want &&
                      packet_mac_copy(key, msg, 4, 40, out.data() + doff, p) == want &&
                      std::memcmp(out.data() + doff, msg.data() + 40, count * 4) == 0 &&
                      out[doff + count * 4] == 0xCC && (doff == 0 || out[doff - 1] == 0xCC) &&
                      codes.top == top && codes.nonfinite == nonfinite;
      pass_bad += !ok;
    }
  }
  std::printf("receive pass (verify, copy, scan) vs packet_mac, memcpy, a plain scan: %d wrong\n",
              pass_bad);
  bad += pass_bad;
  return bad ? 1 : 0;
}
