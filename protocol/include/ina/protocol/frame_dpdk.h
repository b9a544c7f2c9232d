// The checksum verdicts a DPDK port's rx offload left in an mbuf, as frame::classify() takes them
// (frame::RxOffload). Header only, for the DPDK code of the aggregator and of the worker library:
// the protocol library itself never includes DPDK.
#pragma once

#include <rte_mbuf.h>

#include <cstdint>

#include "ina/protocol/frame.h"

namespace ina::frame {

inline RxOffload rx_offload(uint64_t ol_flags) {
  RxOffload o;
  switch (ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK) {
    case RTE_MBUF_F_RX_IP_CKSUM_GOOD: o.ip = HwCheck::kGood; break;
    case RTE_MBUF_F_RX_IP_CKSUM_BAD: o.ip = HwCheck::kBad; break;
    default: o.ip = HwCheck::kUnknown; break;
  }
  switch (ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK) {
    case RTE_MBUF_F_RX_L4_CKSUM_GOOD: o.l4 = HwCheck::kGood; break;
    case RTE_MBUF_F_RX_L4_CKSUM_BAD: o.l4 = HwCheck::kBad; break;
    default: o.l4 = HwCheck::kUnknown; break;
  }
  return o;
}

}  // namespace ina::frame
