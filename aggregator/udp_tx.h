// The replies of one serving thread of the UDP aggregator on their way out. Each reply is encoded
// and sealed into an arena as the Engine produces it (its payload pointer lives only until the
// next packet); flush() sends them all with sendmmsg.
//
// With UDP GSO (UDP_SEGMENT): RESULT packets of consecutive completions of one job go to the same
// ranks and usually have the same size (a full block), so for each rank a run of them is one
// sendmmsg entry whose iovecs point at the encoded packets and whose cmsg says the segment size:
// the kernel cuts it into the same datagrams, in order, for a fraction of the per-packet cost.
// Only same-size packets are grouped (GSO segments are equal but the last), at most
// kMaxGsoSegments per entry and within the 64 KiB limit of one send. If the kernel refuses a GSO
// send (a route whose MTU is below the segment size, a device without checksum offload), the
// packets go one by one and GSO is turned off for every thread for the rest of the run.
// Everything is allocated by init(): enqueue and flush never allocate.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "aggregator/backend_shell.h"
#include "aggregator/engine.h"
#include "aggregator/udp_net.h"
#include "ina/base/status.h"

namespace ina::agg::udp {

class ReplyQueue {
 public:
  struct Counters {
    uint64_t tx_datagrams = 0;
    uint64_t tx_entries = 0;  // sendmmsg entries (a GSO entry carries several datagrams)
    uint64_t tx_gso_entries = 0;
    uint64_t send_errors = 0;
    uint64_t unroutable = 0;  // replies for a rank whose address is not known yet
  };

  // Room for the replies to `batch` received datagrams (two each with the dup hook) of up to
  // `max_packet` bytes, sent from `fd` to the ranks in `peers` (multicasts). `gso` is shared by
  // the threads. Allocates.
  Status init(size_t batch, size_t max_packet, int fd, std::atomic<bool>* gso,
              AddressBook<Peer>* peers);
  // Encodes and seals `r` for `dest` (a kAllRanks reply: every known rank of its job); flushes
  // first when the arena is full.
  void enqueue(const Reply& r, const sockaddr_in& dest);
  // Sends every pending reply, in order per destination.
  void flush();
  void count_unroutable() { ++c_.unroutable; }
  const Counters& counters() const { return c_; }

 private:
  struct Pending {
    bool multicast = false;  // to every rank of `job`, else to `dest`
    JobId job = 0;
    sockaddr_in dest{};
    uint32_t off = 0;
    uint32_t len = 0;
  };
  void stage(const sockaddr_in& dest, const Pending* first, size_t n);
  void send_staged();
  void send_one_by_one(size_t entry);

  int fd_ = -1;
  std::atomic<bool>* gso_ = nullptr;
  AddressBook<Peer>* peers_ = nullptr;
  size_t mc_rotate_ = 0;  // first rank of the next multicast (see flush)
  Counters c_;
  std::vector<uint8_t> arena_;
  size_t arena_used_ = 0;
  std::vector<Pending> pending_;  // capacity reserved; never grows past it
  size_t pending_cap_ = 0;
  // sendmmsg staging
  std::vector<mmsghdr> msgs_;
  std::vector<iovec> iov_;  // kMaxGsoSegments per entry
  std::vector<sockaddr_in> addr_;
  std::vector<CmsgBuf> ctrl_;
  std::vector<uint16_t> segs_;  // datagrams per entry
  size_t n_ = 0;
};

}  // namespace ina::agg::udp
