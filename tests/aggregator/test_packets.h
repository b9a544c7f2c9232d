// Packet builders shared by the aggregator tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "ina/protocol/frame.h"
#include "ina/protocol/wire.h"

namespace ina::agg::testing {

// The epoch of a job's current incarnation as the test's senders know it (from the WELCOME), or 0
// (none: the job's key itself), for a packet with these flags (a test that plays a tree leaf's
// parent seals RESULTs and ERRORs with the parent's). Tests that run an engine point it there (and
// reset it), so that encode_packet() and udp_frame() seal as the job's workers would (WIRE.md,
// "Incarnations").
using EpochOf = std::function<uint64_t(JobId, uint8_t flags)>;
inline EpochOf& epoch_of() {
  static EpochOf f;
  return f;
}
// Points epoch_of() at `f` for the life of the object.
class ScopedEpochOf {
 public:
  explicit ScopedEpochOf(EpochOf f) { epoch_of() = std::move(f); }
  ~ScopedEpochOf() { epoch_of() = nullptr; }
  ScopedEpochOf(const ScopedEpochOf&) = delete;
  ScopedEpochOf& operator=(const ScopedEpochOf&) = delete;
};

// Tests that play workers over a backend (sockets, DPDK rings): the epoch each job's workers
// learned from their own WELCOMEs (learn_welcome) and the one a test playing a leaf's parent
// names in its WELCOME; hook_worker_epochs() points epoch_of() at them (RESULT and ERROR sealed as
// the parent, the rest as the workers).
inline std::map<JobId, uint64_t>& worker_epochs() {
  static std::map<JobId, uint64_t> m;
  return m;
}
inline uint64_t& parent_epoch() {
  static uint64_t e = 0;
  return e;
}
inline void hook_worker_epochs() {
  epoch_of() = [](JobId job, uint8_t flags) -> uint64_t {
    if ((flags & (wire::kFlagResult | wire::kFlagError)) != 0) return parent_epoch();
    auto it = worker_epochs().find(job);
    return it == worker_epochs().end() ? 0 : it->second;
  };
}
// A WELCOME answering a HELLO (not the notice, seq 0) names its job's incarnation: kept.
inline void learn_welcome(const wire::PacketView& v) {
  const uint8_t welcome = wire::kFlagHello | wire::kFlagResult;
  if ((v.hdr.flags & welcome) == welcome && v.hdr.seq != 0 && v.hdr.count >= wire::kWelcomeWords) {
    worker_epochs()[v.hdr.job] = wire::welcome_epoch(v);
  }
}
// Whether a reply of job `job` is sealed with its key or with one of the incarnations above.
inline bool reply_tag_ok(std::span<const uint8_t> d, JobId job, uint64_t key) {
  const Key128 k{key};
  if (wire::tag_ok(d, k)) return true;
  auto it = worker_epochs().find(job);
  if (it != worker_epochs().end() && wire::tag_ok(d, wire::incarnation_key(k, it->second))) {
    return true;
  }
  return parent_epoch() != 0 && wire::tag_ok(d, wire::incarnation_key(k, parent_epoch()));
}

// Test convention: a header handed to encode_packet()/udp_frame() carries in `tag` the job key
// (a 64-bit test key, hi = 0) to seal the datagram with, as a worker seals with its job's key;
// the encoded datagram carries the real tag. data_header() and hello_header() set it; a header
// built by hand (tag 0) is sealed with the zero key, the key of a job configured with none. A
// packet but HELLO of a job whose epoch_of() is not 0 is sealed with that incarnation's key
// derived from it, as a worker seals its DATA and aborts.
inline void seal_test_datagram(std::span<uint8_t> d, uint64_t key) {
  Key128 k{key};
  if (epoch_of() && (d[wire::kOffFlags] & wire::kFlagHello) == 0) {
    const uint64_t e = epoch_of()(wire::get_u32(d.data() + wire::kOffJob), d[wire::kOffFlags]);
    if (e != 0) k = wire::incarnation_key(k, e);
  }
  wire::seal(d, k);
}

// Writes n words of `payload` at dst in the packet's word width (wire::payload_width): 4-byte
// words as they are, 2-byte and 1-byte ones truncated, 8-byte ones sign-extended.
inline void store_test_words(uint8_t* dst, const wire::Header& h, const int32_t* payload,
                             size_t n) {
  const size_t w = wire::payload_width(h.flags, h.dtype);
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = payload[i];
    std::memcpy(dst + i * w, &v, w);  // little-endian: the low bytes first
  }
}

// Encodes header + payload (host-order words) exactly as a worker would.
inline std::vector<uint8_t> encode_packet(const wire::Header& h, const int32_t* payload) {
  std::vector<uint8_t> b(wire::packet_size(h));
  wire::encode_header(h, b.data());
  if (h.count > 0) store_test_words(b.data() + wire::kHeaderSize, h, payload, h.count);
  seal_test_datagram(b, h.tag);
  return b;
}
// The same with payload bytes already in wire order (a Reply's payload: payload_width bytes each).
inline std::vector<uint8_t> encode_packet(const wire::Header& h, const uint8_t* payload) {
  std::vector<uint8_t> b(wire::packet_size(h));
  wire::encode_header(h, b.data());
  if (h.count > 0) std::memcpy(b.data() + wire::kHeaderSize, payload, b.size() - wire::kHeaderSize);
  seal_test_datagram(b, h.tag);
  return b;
}
inline std::vector<uint8_t> encode_packet(const wire::Header& h,
                                          const std::vector<int32_t>& payload) {
  wire::Header hh = h;
  hh.count = static_cast<uint16_t>(payload.size());
  return encode_packet(hh, payload.data());
}

// A worker's frame for the DPDK loop: Ethernet/IPv4/UDP headers from `from` to `to` (UDP checksum
// filled, IP id 1) around the datagram of `h` with `payload` (h.count words; none given: zeros).
inline std::vector<uint8_t> udp_frame(const frame::Endpoint& from, const frame::Endpoint& to,
                                      const wire::Header& h, const std::vector<int32_t>& payload) {
  const size_t len = wire::packet_size(h);
  std::vector<uint8_t> f(frame::kUdpHeadroom + len);
  uint8_t* dg = f.data() + frame::kUdpHeadroom;
  wire::encode_header(h, dg);
  if (!payload.empty()) store_test_words(dg + wire::kHeaderSize, h, payload.data(), h.count);
  seal_test_datagram(std::span<uint8_t>(dg, len), h.tag);
  frame::write_udp_headers(f.data(), from, to, len, frame::sum16(dg, len), 1);
  return f;
}

// A DATA header with the usual defaults.
inline wire::Header data_header(JobId job, uint64_t key, uint16_t rank, uint16_t slot, bool shadow,
                                BlockSeq seq, uint16_t count) {
  wire::Header h;
  h.tag = key;  // the key encode_packet() seals with (see above)
  h.job = job;
  h.rank = rank;
  h.slot = slot;
  h.shadow = shadow;
  h.seq = seq;
  h.count = count;
  h.dtype = DType::kInt32;
  h.op = ReduceOp::kSum;
  return h;
}

// A HELLO header (join with incarnation nonce `seq`; its one payload word is the world size).
inline wire::Header hello_header(JobId job, uint64_t key, uint16_t rank, BlockSeq seq) {
  wire::Header h;
  h.flags = wire::kFlagHello;
  h.tag = key;  // the key encode_packet() seals with (see above)
  h.job = job;
  h.rank = rank;
  h.seq = seq;
  h.count = 1;
  return h;
}

// Payload words of a decoded packet (sign-extended from their width; 8-byte words truncated).
inline std::vector<int32_t> payload_words(const wire::PacketView& p) {
  std::vector<int32_t> v(p.hdr.count);
  const size_t w = wire::payload_width(p.hdr.flags, p.hdr.dtype);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t x = 0;
    std::memcpy(&x, p.payload + i * w, w);
    const unsigned shift = static_cast<unsigned>(64 - 8 * w);
    v[i] = static_cast<int32_t>(static_cast<int64_t>(static_cast<uint64_t>(x) << shift) >> shift);
  }
  return v;
}

// Bitmap words of an ERROR payload [reason, words...] as a set of ranks.
inline std::vector<uint32_t> ranks_in_bitmap(const int32_t* words, size_t n_words) {
  std::vector<uint32_t> ranks;
  for (size_t w = 0; w < n_words; ++w) {
    const auto bits = static_cast<uint32_t>(words[w]);
    for (uint32_t b = 0; b < 32; ++b) {
      if ((bits >> b) & 1u) ranks.push_back(static_cast<uint32_t>(w * 32 + b));
    }
  }
  return ranks;
}

}  // namespace ina::agg::testing
