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
  return bad ? 1 : 0;
}
