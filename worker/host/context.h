// What a host collective sees of the job: its rank, the world size, and point-to-point byte
// messages to and from peers (Gloo's Context and Pair). Algorithms take a Context& and never a
// concrete transport, so the same schedule runs over TCP (TcpMesh) or RDMA verbs
// (rdma::VerbsMesh, worker/rdma/verbs_mesh.h).
//
// Semantics, which every implementation keeps:
//   * isend/irecv post an operation and return at once; the buffer must stay valid and untouched
//     until wait() on its handle returns. Progress is only guaranteed inside wait() (TcpMesh also
//     hands a send on an idle link to the kernel at once, but callers must not rely on it).
//   * Messages between a pair of ranks are matched in posting order, per direction: the n-th
//     isend from a to b fills the n-th irecv posted by b for a. Sizes must agree (checked: a
//     mismatch is an error naming the peer, never silent corruption). Zero-byte messages are
//     allowed.
//   * wait() makes progress on every posted operation (so a rank sends to one peer while it
//     receives from another, and large ring exchanges cannot deadlock) and returns when the
//     given one completes, or fails after timeout() with an error naming the peer.
//   * One thread drives a context at a time (it is not thread-safe); collectives on one context
//     run one after the other, in the same order on every rank.
//   * The first error breaks the context: pending operations are dropped (their buffers are no
//     longer touched) and every later wait() returns that error. A collective that fails leaves
//     the job to rebuild its context (or fall back), as Gloo does.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "ina/base/status.h"

namespace ina::host {

class Context {
 public:
  using Handle = uint64_t;  // 0: no operation (wait returns OK)

  virtual ~Context() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The deadline of every wait.
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void set_timeout(std::chrono::milliseconds t) = 0;

  virtual Handle isend(int peer, const void* buf, size_t bytes) = 0;
  virtual Handle irecv(int peer, void* buf, size_t bytes) = 0;
  virtual Status wait(Handle h) = 0;

  Status wait_all(std::span<const Handle> handles) {
    for (Handle h : handles) INA_RETURN_IF_ERROR(wait(h));
    return ok_status();
  }
  // Scratch memory kept between collectives: slot `slot` (0 .. kScratchSlots-1) grown to at least
  // `bytes`, contents undefined. A collective owns every slot while it runs (collectives run one
  // at a time). Reusing the memory matters: the first touch of a fresh page costs a page fault
  // (tens of microseconds on a virtual machine, more than copying the page over loopback TCP), so
  // a collective that allocated its buffers per call was bound by page faults, not by the link.
  // Slots in use: 0 the ring's receive window; 0, 1 halving-doubling; 0..3 the tree; 2
  // ReduceScatter's reduction buffer.
  static constexpr int kScratchSlots = 4;
  uint8_t* scratch(int slot, size_t bytes) {
    Scratch& s = scratch_[slot];
    if (s.bytes < bytes) {
      s.data.reset();  // free first: peak memory stays at the new size
      s.data = std::make_unique_for_overwrite<uint8_t[]>(bytes);
      s.bytes = bytes;
    }
    return s.data.get();
  }

  // Sends to `to` and receives from `from` concurrently.
  Status sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes) {
    const Handle r = irecv(from, rbuf, rbytes);
    const Handle s = isend(to, sbuf, sbytes);
    INA_RETURN_IF_ERROR(wait(r));
    return wait(s);
  }

 private:
  struct Scratch {
    std::unique_ptr<uint8_t[]> data;
    size_t bytes = 0;
  };
  Scratch scratch_[kScratchSlots];
};

}  // namespace ina::host
