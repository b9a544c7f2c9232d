// The UDP aggregator's outgoing replies (see udp_tx.h).
#include "aggregator/udp_tx.h"

#include <netinet/udp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "ina/base/log.h"

namespace ina::agg::udp {
namespace {

constexpr const char* kComponent = "aggregator";
constexpr size_t kMaxGsoSegments = 64;  // UDP_MAX_SEGMENTS of older kernels (newer: 128)
constexpr size_t kMaxGsoBytes = kMaxUdpPayload;
constexpr size_t kTxMsgs = 256;             // sendmmsg entries staged per call
constexpr size_t kMaxArenaBytes = 8 << 20;  // encoded replies between flushes

}  // namespace

Status ReplyQueue::init(size_t batch, size_t max_packet, int fd, std::atomic<bool>* gso,
                        AddressBook<Peer>* peers) {
  fd_ = fd;
  gso_ = gso;
  peers_ = peers;
  try {
    // One received buffer can hold up to 64 GRO segments, each with a reply (two with the dup
    // hook); the arena is flushed whenever it fills, so its size only bounds GSO runs.
    pending_cap_ = batch * 2;
    pending_.reserve(pending_cap_);
    arena_.assign(std::max(max_packet, std::min(pending_cap_ * max_packet, kMaxArenaBytes)), 0);
    msgs_.assign(kTxMsgs, mmsghdr{});
    iov_.assign(kTxMsgs * kMaxGsoSegments, iovec{});
    addr_.assign(kTxMsgs, sockaddr_in{});
    ctrl_.assign(kTxMsgs, CmsgBuf{});
    segs_.assign(kTxMsgs, 0);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("udp: cannot allocate the reply buffers of batch " +
                              std::to_string(batch));
  }
  return ok_status();
}

void ReplyQueue::enqueue(const Reply& r, const sockaddr_in& dest) {
  const size_t len = r.packet_size();
  if (pending_.size() == pending_cap_ || arena_used_ + len > arena_.size()) flush();
  uint8_t* o = arena_.data() + arena_used_;
  wire::encode_header(r.hdr, o);
  // One sealed buffer, also for a multicast: the tag does not cover the destination. The payload
  // (a result kept in its slot, control words) is sealed as it is copied in.
  if (r.payload != nullptr) {
    wire::seal_copy(std::span<uint8_t>(o, wire::kHeaderSize),
                    std::span<const uint8_t>(r.payload, r.payload_bytes()), o + wire::kHeaderSize,
                    r.key);
  } else {
    wire::seal(std::span<uint8_t>(o, len), r.key);
  }
  Pending p;
  p.multicast = r.target == Reply::Target::kAllRanks;
  p.job = r.hdr.job;
  p.dest = dest;
  p.off = static_cast<uint32_t>(arena_used_);
  p.len = static_cast<uint32_t>(len);
  pending_.push_back(p);  // within the reserved capacity: no allocation
  arena_used_ += len;
}

// Sends every pending_ reply, in order per destination.
void ReplyQueue::flush() {
  const size_t n = pending_.size();
  const bool gso = gso_->load(std::memory_order_relaxed);
  size_t i = 0;
  while (i < n) {
    const Pending& first = pending_[i];
    const size_t seg_max = gso ? std::min(kMaxGsoSegments, kMaxGsoBytes / first.len) : 1;
    // A run: consecutive replies of the same kind, destination (or job) and size.
    size_t j = i + 1;
    while (j < n && pending_[j].multicast == first.multicast && pending_[j].len == first.len &&
           (first.multicast ? pending_[j].job == first.job
                            : same_addr(pending_[j].dest, first.dest))) {
      ++j;
    }
    if (!first.multicast) {
      for (size_t k = i; k < j; k += seg_max) {
        stage(first.dest, &pending_[k], std::min(seg_max, j - k));
      }
    } else if (std::vector<Peer>* p = peers_->find(first.job); p != nullptr) {
      // From a rotating first rank: sent in rank order, the last rank would always get its
      // results last, start every collective last and show as a small persistent straggler.
      const size_t np = p->size();
      size_t q = np == 0 ? 0 : mc_rotate_++ % np;
      for (size_t left = np; left > 0; --left, q = q + 1 == np ? 0 : q + 1) {
        const Peer& peer = (*p)[q];
        if (!peer.known) {
          c_.unroutable += j - i;
          continue;
        }
        for (size_t k = i; k < j; k += seg_max) {
          stage(peer.addr, &pending_[k], std::min(seg_max, j - k));
        }
      }
    } else {
      c_.unroutable += j - i;
    }
    i = j;
  }
  send_staged();
  pending_.clear();
  arena_used_ = 0;
}

// Adds one sendmmsg entry: n packets of equal size to `dest` (a GSO entry when n > 1).
void ReplyQueue::stage(const sockaddr_in& dest, const Pending* first, size_t n) {
  if (n_ == kTxMsgs) send_staged();
  const size_t e = n_++;
  iovec* iov = &iov_[e * kMaxGsoSegments];
  for (size_t k = 0; k < n; ++k) {
    iov[k].iov_base = arena_.data() + first[k].off;
    iov[k].iov_len = first[k].len;
  }
  addr_[e] = dest;
  msghdr& m = msgs_[e].msg_hdr;
  m = msghdr{};
  m.msg_name = &addr_[e];
  m.msg_namelen = sizeof(sockaddr_in);
  m.msg_iov = iov;
  m.msg_iovlen = n;
  segs_[e] = static_cast<uint16_t>(n);
  if (n > 1) {
    m.msg_control = ctrl_[e].buf;
    m.msg_controllen = CMSG_SPACE(sizeof(uint16_t));
    cmsghdr* cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    const auto gso_size = static_cast<uint16_t>(first[0].len);
    std::memcpy(CMSG_DATA(cm), &gso_size, sizeof gso_size);
  }
}

void ReplyQueue::send_staged() {
  size_t k = 0;
  while (k < n_) {
    const int rc = sendmmsg(fd_, &msgs_[k], static_cast<unsigned>(n_ - k), 0);
    if (rc > 0) {
      for (size_t e = k; e < k + static_cast<size_t>(rc); ++e) {
        c_.tx_datagrams += segs_[e];
        ++c_.tx_entries;
        if (segs_[e] > 1) ++c_.tx_gso_entries;
      }
      k += static_cast<size_t>(rc);
      continue;
    }
    const int err = errno;
    if (rc < 0 && err == EINTR) continue;
    // Entry k failed. A GSO entry the kernel refuses (EINVAL: segment above the route's MTU;
    // EIO: no checksum offload) goes out one datagram at a time, and GSO stays off.
    if (segs_[k] > 1 && (err == EINVAL || err == EIO || err == EMSGSIZE || err == EOPNOTSUPP)) {
      if (gso_->exchange(false, std::memory_order_relaxed)) {
        INA_WARN(kComponent, "UDP GSO send refused (%s); sending datagrams one by one",
                 std::strerror(err));
      }
      send_one_by_one(k);
    } else {
      c_.send_errors += segs_[k];
    }
    ++k;
  }
  n_ = 0;
}

void ReplyQueue::send_one_by_one(size_t entry) {
  msghdr m = msgs_[entry].msg_hdr;
  m.msg_control = nullptr;
  m.msg_controllen = 0;
  iovec* iov = m.msg_iov;
  const size_t n = m.msg_iovlen;
  m.msg_iovlen = 1;
  for (size_t s = 0; s < n; ++s) {
    m.msg_iov = &iov[s];
    ssize_t rc;
    do {
      rc = sendmsg(fd_, &m, 0);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) {
      ++c_.send_errors;
    } else {
      ++c_.tx_datagrams;
      ++c_.tx_entries;
    }
  }
}

}  // namespace ina::agg::udp
