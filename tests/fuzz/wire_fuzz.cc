// libFuzzer harness: the wire decoder (wire::decode) and the tag helpers on arbitrary datagrams,
// and the text forms of keys, dtypes and ops.
//
// Invariants: decode never reads past the buffer (ASan), reports kTruncated exactly for
// datagrams shorter than a header, and on success describes the buffer exactly (payload view,
// packet_size) and re-encodes to the same 40 header bytes; a sealed datagram verifies and still
// decodes the same; any one flipped bit breaks the tag; a parsed key prints back to its text.
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "ina/protocol/key.h"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"

using namespace ina;

namespace {

void check_text(std::string_view text) {
  Key128 k;
  if (parse_key_hex(text, &k)) {
    std::string lower(text);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    FUZZ_CHECK(key_to_hex(k) == lower);
  }
  if (auto t = parse_dtype(text)) FUZZ_CHECK(parse_dtype(dtype_name(*t)) == t);
  if (auto o = parse_op(text)) FUZZ_CHECK(parse_op(op_name(*o)) == o);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  wire::PacketView v;
  const wire::DecodeError e = wire::decode(in, &v);
  FUZZ_CHECK(!wire::decode_error_name(e).empty());
  FUZZ_CHECK((e == wire::DecodeError::kTruncated) == (size < wire::kHeaderSize));
  if (size < 64) check_text(std::string_view(reinterpret_cast<const char*>(data), size));
  if (e != wire::DecodeError::kOk) {
    if (size < wire::kHeaderSize) FUZZ_CHECK(!wire::tag_ok(in, Key128{}));
    return 0;
  }
  const wire::Header& h = v.hdr;
  FUZZ_CHECK(v.payload == data + wire::kHeaderSize);
  FUZZ_CHECK(v.payload_bytes == size - wire::kHeaderSize);
  FUZZ_CHECK(wire::packet_size(h) == size);
  FUZZ_CHECK(v.payload_bytes == size_t{h.count} * wire::payload_width(h.flags, h.dtype));
  FUZZ_CHECK(h.slot <= wire::kMaxSlot);
  FUZZ_CHECK(h.has(wire::kFlagPartial) || h.exp == kNoExponent);
  // Decode then encode: the same header bytes.
  uint8_t re[wire::kHeaderSize];
  wire::encode_header(h, re);
  FUZZ_CHECK(std::memcmp(re, data, wire::kHeaderSize) == 0);

  // Seal with a key taken from the packet itself, verify, decode again: the same header but the
  // tag; then one flipped bit (outside the tag field) must break the tag.
  std::vector<uint8_t> d(data, data + size);
  const Key128 key{wire::get_u64(data + wire::kOffSeq), h.job};
  wire::seal(d, key);
  FUZZ_CHECK(wire::tag_ok(d, key));
  FUZZ_CHECK(wire::compute_tag(d, key) == wire::compute_tag(in, key));  // the tag reads as zero
  wire::PacketView v2;
  FUZZ_CHECK(wire::decode(d, &v2) == wire::DecodeError::kOk);
  FUZZ_CHECK(v2.hdr.tag == wire::get_u64(d.data() + wire::kOffTag));
  v2.hdr.tag = h.tag;
  uint8_t re2[wire::kHeaderSize];
  wire::encode_header(v2.hdr, re2);
  FUZZ_CHECK(std::memcmp(re, re2, wire::kHeaderSize) == 0);
  size_t bit = (h.seq * 2654435761u) % (size * 8);
  if (bit / 8 >= wire::kOffTag && bit / 8 < wire::kOffTag + wire::kTagSize) bit = 0;
  d[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  FUZZ_CHECK(!wire::tag_ok(d, key));
  return 0;
}
