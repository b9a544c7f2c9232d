// The DATA packet stream the in-process Engine benches feed (ina-engine-bench,
// ina-tree-engine-bench): `rounds` blocks over a window of `slots` slots (alternating copies once
// the window wraps), one packet per rank per block, every payload `elems` words of 3, job 1.
#pragma once

#include <cstdint>
#include <vector>

#include "ina/protocol/wire.h"

namespace ina::bench {

inline std::vector<uint8_t> encode_packet(const wire::Header& h, const int32_t* payload) {
  std::vector<uint8_t> p(wire::packet_size(h.count));
  wire::encode_header(h, p.data());
  if (h.count > 0) wire::store_payload(p.data() + wire::kHeaderSize, payload, h.count);
  return p;
}

// Packet b * world + r is round b of rank r.
inline std::vector<std::vector<uint8_t>> data_stream(uint32_t rounds, uint32_t world,
                                                     uint32_t slots, uint32_t elems,
                                                     uint64_t key) {
  std::vector<std::vector<uint8_t>> pkts;
  pkts.reserve(size_t{rounds} * world);
  const std::vector<int32_t> payload(elems, 3);
  for (uint32_t b = 0; b < rounds; ++b) {
    for (uint32_t r = 0; r < world; ++r) {
      wire::Header h;
      h.job = 1;
      h.key = key;
      h.rank = static_cast<uint16_t>(r);
      h.slot = static_cast<uint16_t>(b % slots);
      h.shadow = (b / slots) % 2 == 1;
      h.seq = b + 1;
      h.count = static_cast<uint16_t>(elems);
      pkts.push_back(encode_packet(h, payload.data()));
    }
  }
  return pkts;
}

}  // namespace ina::bench
