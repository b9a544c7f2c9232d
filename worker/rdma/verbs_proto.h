// Pure logic of the RDMA verbs peer transport (VerbsMesh, verbs_mesh.h), kept apart from the
// device so that it is unit-tested on machines without RDMA:
//
//   * VerbsPeerInfo: what one rank tells one peer through the rendezvous store to connect an RC
//     queue pair (LID/GID, QPN, PSN, MTU) and to write into its memory (the address and rkey of
//     its receive slots and of its credit word). Fixed little-endian layout with a magic and a
//     version; parse() checks every field and names the bad one.
//   * Chunking: a message of any size travels as chunks of at most slot_bytes (a zero-byte message
//     is one empty chunk). Each chunk is an RDMA WRITE WITH IMMEDIATE into the peer's next receive
//     slot; the immediate carries the chunk's length and a last-chunk flag, so the receiver checks
//     that the sizes of the two sides agree chunk by chunk.
//   * Credits: the receiver has `slots` receive slots per peer. SendWindow counts chunks posted,
//     completed locally and consumed by the peer (a cumulative counter that the peer RDMA-writes
//     into our credit word); a chunk may be posted while both its local staging slot and the
//     peer's receive slot are free. RecvWindow counts chunks arrived and consumed, and says when
//     the consumed counter must be written back to the sender.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ina/base/status.h"
#include "ina/ina.hpp"

namespace ina::rdma {

struct VerbsPeerInfo {
  static constexpr uint32_t kMagic = 0x56414E49;  // "INAV"
  static constexpr uint16_t kVersion = 1;
  static constexpr size_t kWireBytes = 80;
  static constexpr uint32_t kMaxSlots = 4096;
  static constexpr uint32_t kMaxSlotBytes = 1u << 30;  // fits the immediate's 31 length bits

  uint32_t world_size = 0;
  uint32_t from_rank = 0;   // the rank that owns the queue pair and memory described
  uint32_t to_rank = 0;     // the peer this queue pair is connected to
  uint16_t lid = 0;         // InfiniBand local id (0 on RoCE)
  uint8_t gid[16] = {};     // port GID (RoCE, or IB across subnets); all zero: none
  uint8_t port = 1;         // the HCA port
  uint8_t mtu = 0;          // enum ibv_mtu: 1 (256) .. 5 (4096)
  uint32_t qpn = 0;         // queue pair number, 24 bits
  uint32_t psn = 0;         // first packet sequence number, 24 bits
  uint64_t slots_addr = 0;  // receive slots of this pair (the peer writes its chunks here)
  uint32_t slots_rkey = 0;
  uint32_t slot_bytes = 0;
  uint32_t slot_count = 0;
  uint64_t credit_addr = 0;  // the 8-byte credit word (the peer writes its consumed count here)
  uint32_t credit_rkey = 0;

  std::vector<uint8_t> serialize() const;
  // Checks the layout and every field; `what` names the source in errors ("rank 3's queue pair
  // info"). Errors: "rank 3's queue pair info: qpn 16777216 out of range [1, 16777215]".
  static Result<VerbsPeerInfo> parse(const std::vector<uint8_t>& bytes, const std::string& what);
  bool has_gid() const;
};

// The store key under which rank `from` publishes its info for `to`, in one incarnation of the
// mesh (a rebuilt mesh uses fresh keys, so stale infos of an earlier one are never read).
std::string peer_info_key(uint64_t incarnation, int from, int to);
std::string ready_key(uint64_t incarnation, int rank);

// Chunks of a message of `bytes` in slots of `slot_bytes` (>= 1); 0 bytes: one empty chunk.
size_t chunk_count(size_t bytes, size_t slot_bytes);
// Length of chunk `i` (< chunk_count) of that message.
size_t chunk_length(size_t bytes, size_t slot_bytes, size_t i);

// The 32-bit immediate of a chunk: bit 31 = last chunk of its message, bits 0..30 = length.
uint32_t encode_imm(size_t length, bool last);
struct ChunkImm {
  size_t length;
  bool last;
};
ChunkImm decode_imm(uint32_t imm);
// Checks chunk `index` of a posted receive of `bytes` against what arrived; the error names the
// peer: "rank 2 sent a message of another size than the 4096 bytes expected".
Status check_chunk(const ChunkImm& got, size_t bytes, size_t slot_bytes, size_t index,
                   const std::string& peer_name);

// Sender side of one peer's slot ring.
class SendWindow {
 public:
  explicit SendWindow(uint32_t slots) : slots_(slots) {}

  uint32_t slots() const { return slots_; }
  uint64_t posted() const { return posted_; }
  uint64_t local_done() const { return local_done_; }
  uint64_t remote_consumed() const { return remote_consumed_; }
  // A chunk may be posted: its staging slot has completed locally and the peer freed its slot.
  bool can_post() const {
    return posted_ - local_done_ < slots_ && posted_ - remote_consumed_ < slots_;
  }
  // The slot of the next chunk (the same index locally and at the peer).
  uint32_t next_slot() const { return static_cast<uint32_t>(posted_ % slots_); }
  // Returns the sequence number of the chunk posted.
  uint64_t on_post() { return posted_++; }
  // One signalled write completed (completions of one queue pair come in posting order).
  Status on_local_complete();
  // The peer's cumulative consumed counter, read from the credit word: never decreases and never
  // exceeds what was posted, else the peer broke the protocol.
  Status on_remote_consumed(uint64_t consumed);

 private:
  uint32_t slots_;
  uint64_t posted_ = 0;
  uint64_t local_done_ = 0;
  uint64_t remote_consumed_ = 0;
};

// Receiver side of one peer's slot ring.
class RecvWindow {
 public:
  explicit RecvWindow(uint32_t slots) : slots_(slots) {}

  uint64_t arrived() const { return arrived_; }
  uint64_t consumed() const { return consumed_; }
  uint64_t pending() const { return arrived_ - consumed_; }
  // The slot holding the oldest unconsumed chunk.
  uint32_t next_slot() const { return static_cast<uint32_t>(consumed_ % slots_); }
  // A chunk landed; more than `slots` unconsumed means the sender ignored its credits.
  Status on_arrival();
  void on_consume() { ++consumed_; }
  // The consumed counter moved since it was last written back.
  bool credit_due() const { return consumed_ > returned_; }
  // Call when the write of the counter is posted; returns the value to write.
  uint64_t on_credit_posted() { return returned_ = consumed_; }

 private:
  uint32_t slots_;
  uint64_t arrived_ = 0;
  uint64_t consumed_ = 0;
  uint64_t returned_ = 0;
};

// Where the verbs mesh runs: INA_VERBS_DEVICE=name[:port] (default: the first device with an
// active port) and INA_VERBS_GID_INDEX=n (0 .. 255, default 0; RoCE v2 usually wants the index of
// the IPv4-mapped GID, `show_gids` lists them). Null arguments: unset. Errors name the variable and
// the expected form.
struct VerbsSelection {
  std::string device;
  uint8_t port = 0;  // 0: the first active port
  int gid_index = 0;
};
Result<VerbsSelection> parse_verbs_selection(const char* device, const char* gid_index);

// INA_HOST_TRANSPORT (Config::host_transport, parsed in config.cc): the peer transport of the
// host collectives.
const char* host_transport_name(HostTransport t);
// auto: verbs when the feature is built and a device exists, else tcp. verbs when unavailable:
// kFailedPrecondition naming the reason (`rdma_detail`).
Result<HostTransport> choose_host_transport(HostTransport requested, bool rdma_built,
                                            bool rdma_usable, const std::string& rdma_detail);

// Agreement across the ranks of a job, which may differ in hardware: each rank publishes its
// local choice and what it asked for. All equal: that one. Otherwise, when every rank that chose
// verbs only asked for auto, all use tcp; else kFailedPrecondition naming a rank on each side:
// "host transport mismatch: rank 0 uses verbs (INA_HOST_TRANSPORT=verbs), rank 2 tcp (auto)".
struct TransportVote {
  HostTransport chosen = HostTransport::kTcp;  // kTcp or kVerbs
  HostTransport requested = HostTransport::kAuto;
};
std::string encode_vote(const TransportVote& v);  // "verbs/auto"
Result<TransportVote> decode_vote(const std::string& s, const std::string& what);
Result<HostTransport> agree_host_transport(const std::vector<TransportVote>& votes);

}  // namespace ina::rdma
