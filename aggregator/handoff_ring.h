// A single-producer single-consumer ring of variable-size records (datagrams with a little
// metadata), for the kernel UDP backend's threads: a thread that receives a datagram of a slot
// another thread owns copies it here, and the owner processes it as if it had received it. Pure
// logic (no I/O, no allocation after construction), unit-tested alone.
//
// Layout: a byte buffer written at `head`, read at `tail` (both grow without bound; the position is
// the value mod the capacity). A record is an 8-byte-aligned [Meta][bytes]. A record that does not
// fit before the end of the buffer starts at offset 0, and a wrap marker (a Meta whose len is
// kWrap) fills the rest: the reader skips it. The producer publishes a record with a release store
// of head, the consumer frees it with a release store of tail.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace ina::agg {

class HandoffRing {
 public:
  struct Meta {
    uint32_t len = 0;         // bytes of the datagram (kWrap: a wrap marker)
    uint32_t mark = 0;        // the producer's tag for the record (the UDP backend: a HELLO copy)
    uint64_t arrival_ns = 0;  // the receiving thread's batch time
    sockaddr_in src{};        // the datagram's sender
  };
  static constexpr uint32_t kWrap = 0xFFFFFFFFu;

  // `bytes`: rounded up to a multiple of 8; at least one largest record should fit.
  explicit HandoffRing(size_t bytes) : buf_((bytes + 7) / 8 * 8 + sizeof(Meta)) {
    cap_ = buf_.size() - sizeof(Meta);  // the slack lets a wrap marker always fit
  }
  HandoffRing(const HandoffRing&) = delete;
  HandoffRing& operator=(const HandoffRing&) = delete;

  size_t capacity() const { return cap_; }

  // Producer: copies the datagram in. False (and nothing written) when it does not fit now.
  bool push(std::span<const uint8_t> data, uint64_t arrival_ns, const sockaddr_in& src,
            uint32_t mark = 0) {
    const size_t need = record_size(data.size());
    if (need > cap_) return false;
    const uint64_t head = head_.load(std::memory_order_relaxed);
    const uint64_t tail = tail_.load(std::memory_order_acquire);
    const size_t pos = static_cast<size_t>(head % cap_);
    const size_t rest = cap_ - pos;
    const size_t skip = rest < need ? rest : 0;  // wrap to offset 0
    if ((head - tail) + skip + need > cap_) return false;
    if (skip != 0) {
      Meta w;
      w.len = kWrap;
      std::memcpy(buf_.data() + pos, &w, sizeof w);  // fits: the buffer has sizeof(Meta) of slack
    }
    uint8_t* at = buf_.data() + (skip != 0 ? 0 : pos);
    Meta m;
    m.len = static_cast<uint32_t>(data.size());
    m.mark = mark;
    m.arrival_ns = arrival_ns;
    m.src = src;
    std::memcpy(at, &m, sizeof m);
    if (!data.empty()) std::memcpy(at + sizeof m, data.data(), data.size());
    head_.store(head + skip + need, std::memory_order_release);
    return true;
  }

  // Consumer: the oldest record, or false when the ring is empty. The bytes stay valid until pop().
  bool front(Meta* meta, std::span<const uint8_t>* data) {
    uint64_t tail = tail_.load(std::memory_order_relaxed);
    const uint64_t head = head_.load(std::memory_order_acquire);
    if (tail == head) return false;
    size_t pos = static_cast<size_t>(tail % cap_);
    std::memcpy(meta, buf_.data() + pos, sizeof *meta);
    if (meta->len == kWrap) {
      tail += cap_ - pos;
      tail_.store(tail, std::memory_order_release);
      if (tail == head) return false;  // cannot happen: a marker is always followed by a record
      pos = 0;
      std::memcpy(meta, buf_.data(), sizeof *meta);
    }
    *data = std::span<const uint8_t>(buf_.data() + pos + sizeof(Meta), meta->len);
    return true;
  }
  // Consumer: frees the record front() returned.
  void pop(const Meta& meta) {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    tail_.store(tail + record_size(meta.len), std::memory_order_release);
  }

  // Either side: no record waiting (a snapshot).
  bool empty() const {
    return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire);
  }

 private:
  static size_t record_size(size_t len) { return (sizeof(Meta) + len + 7) / 8 * 8; }

  std::vector<uint8_t> buf_;
  size_t cap_ = 0;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
};

}  // namespace ina::agg
