// SipHash-2-4, after the reference implementation (github.com/veorq/SipHash, siphash.c): four
// 64-bit words of state, two compression rounds per 8-byte message word, four finalization
// rounds. Message words are little-endian loads (memcpy: no alignment assumed).
#include "ina/protocol/siphash.h"

#include <bit>
#include <cstring>

namespace ina {

namespace {

inline uint64_t load_le64(const uint8_t* p) {
  static_assert(std::endian::native == std::endian::little,
                "load_le64 assumes a little-endian host");
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

struct State {
  uint64_t v0, v1, v2, v3;
  inline void round() {
    v0 += v1;
    v1 = std::rotl(v1, 13);
    v1 ^= v0;
    v0 = std::rotl(v0, 32);
    v2 += v3;
    v3 = std::rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = std::rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = std::rotl(v1, 17);
    v1 ^= v2;
    v2 = std::rotl(v2, 32);
  }
  inline void absorb(uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

inline State init(const Key128& key) {
  return State{key.lo ^ 0x736f6d6570736575ull, key.hi ^ 0x646f72616e646f6dull,
               key.lo ^ 0x6c7967656e657261ull, key.hi ^ 0x7465646279746573ull};
}

// Absorbs the whole words of msg from byte `from`, then the tail and the length, and finalizes.
inline uint64_t finish(State s, std::span<const uint8_t> msg, size_t from) {
  const uint8_t* p = msg.data() + from;
  const size_t n = msg.size();
  const uint8_t* end = msg.data() + (n & ~size_t{7});
  for (; p < end; p += 8) s.absorb(load_le64(p));
  // The last word: the 0..7 remaining bytes, the length mod 256 in the top byte.
  uint64_t b = uint64_t{n & 0xFF} << 56;
  const size_t left = n & 7;
  for (size_t i = 0; i < left; ++i) b |= uint64_t{p[i]} << (8 * i);
  s.absorb(b);
  s.v2 ^= 0xFF;
  s.round();
  s.round();
  s.round();
  s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

}  // namespace

uint64_t siphash24(const Key128& key, std::span<const uint8_t> msg) {
  return finish(init(key), msg, 0);
}

uint64_t siphash24_zeroed(const Key128& key, std::span<const uint8_t> msg, size_t zero_word) {
  State s = init(key);
  const uint8_t* p = msg.data();
  for (size_t i = 0; i < zero_word; ++i, p += 8) s.absorb(load_le64(p));
  s.absorb(0);
  return finish(s, msg, 8 * (zero_word + 1));
}

std::string key_to_hex(const Key128& k) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[static_cast<size_t>(15 - i)] = kDigits[(k.hi >> (4 * i)) & 0xF];
    s[static_cast<size_t>(31 - i)] = kDigits[(k.lo >> (4 * i)) & 0xF];
  }
  return s;
}

bool parse_key_hex(std::string_view text, Key128* out) {
  if (text.size() != 32) return false;
  uint64_t w[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const char c = text[i];
    uint64_t d;
    if (c >= '0' && c <= '9') {
      d = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<uint64_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      d = static_cast<uint64_t>(c - 'A' + 10);
    } else {
      return false;
    }
    uint64_t& word = w[i / 16];
    word = (word << 4) | d;
  }
  *out = Key128{w[1], w[0]};
  return true;
}

}  // namespace ina
