// Packet builders shared by the aggregator tests.
#pragma once

#include <cstdint>
#include <vector>

#include "ina/protocol/frame.h"
#include "ina/protocol/wire.h"

namespace ina::agg::testing {

// Encodes header + payload (host-order words) exactly as a worker would.
inline std::vector<uint8_t> encode_packet(const wire::Header& h, const int32_t* payload) {
  std::vector<uint8_t> b(wire::packet_size(h.count));
  wire::encode_header(h, b.data());
  if (h.count > 0) wire::store_payload(b.data() + wire::kHeaderSize, payload, h.count);
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
  const size_t len = wire::packet_size(h.count);
  std::vector<uint8_t> f(frame::kUdpHeadroom + len);
  uint8_t* dg = f.data() + frame::kUdpHeadroom;
  wire::encode_header(h, dg);
  if (!payload.empty()) wire::store_payload(dg + wire::kHeaderSize, payload.data(), h.count);
  frame::write_udp_headers(f.data(), from, to, len, frame::sum16(dg, len), 1);
  return f;
}

// A DATA header with the usual defaults.
inline wire::Header data_header(JobId job, uint64_t key, uint16_t rank, uint16_t slot, bool shadow,
                                BlockSeq seq, uint16_t count) {
  wire::Header h;
  h.job = job;
  h.key = key;
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
  h.job = job;
  h.key = key;
  h.rank = rank;
  h.seq = seq;
  h.count = 1;
  return h;
}

// Host-order payload words of a decoded packet.
inline std::vector<int32_t> payload_words(const wire::PacketView& p) {
  std::vector<int32_t> v(p.hdr.count);
  if (!v.empty()) wire::load_payload(v.data(), p.payload, v.size());
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
