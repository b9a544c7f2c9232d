// Reads a fuzz input front to back (unlike FuzzedDataProvider, whose integers come from the end),
// so that seeds are easy to write by hand (make_seeds.py). Past the end every read is zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ina::fuzz {

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  size_t remaining() const { return n_; }
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint16_t u16() { return static_cast<uint16_t>(u8() << 8 | u8()); }  // big-endian
  uint32_t u32() { return uint32_t{u16()} << 16 | u16(); }
  // Up to n bytes (fewer at the end of the input).
  std::vector<uint8_t> bytes(size_t n) {
    if (n > n_) n = n_;
    std::vector<uint8_t> v(p_, p_ + n);
    p_ += n;
    n_ -= n;
    return v;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace ina::fuzz
