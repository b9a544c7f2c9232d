// TcpMesh: a full TCP mesh between the ranks of a job, built through a rendezvous Store.
//
// Setup: every rank listens on an ephemeral port of its configured address and publishes
// "host:port" under the key "mesh/addr/<rank>"; it then connects to every lower rank (retrying
// until the deadline) and accepts every higher one. Each connection starts with a handshake of
// magic, rank and world size in both directions, so a connection that reached the wrong job or
// rank is refused. Lower ranks never wait on higher ones while connecting, so setup cannot
// deadlock. Setup does not flake under load: a connection reset or closed during the handshake
// (an overflowing backlog, a slow accept) is made again until the deadline, the accepting side
// drops a connection that fails before its hello and takes a rank's second connection in place
// of its first, the listen backlog holds twice the world (at least 128), and connect_tcp never
// returns a TCP self-connect (socket.h). The address is host/mesh_address.h's. Use a PrefixStore
// to build several meshes through one store.
//
// Data: every message is framed by its 8-byte length (little-endian) so that a size mismatch is
// caught. Every socket operation but one is non-blocking (MSG_DONTWAIT); wait() polls every peer
// with posted operations and moves bytes with sendmsg/recvmsg as the kernel allows, so sends and
// receives to different peers progress together. A send goes to the kernel as soon as it is posted,
// even behind queued ones, unless the socket was full at the last try (then POLLOUT resumes it): a
// rank working through received data without polling (each wait completing at once) still feeds its
// peers, instead of holding its sends until its next poll, which stalled a pipelined ring behind
// the slowest-scheduled rank. Once the kernel holds the whole of a message of 8 KiB or more, the
// socket is flushed (TCP_NODELAY set again): Linux would otherwise keep the message's last, partial
// segment back while its earlier ones wait in the queue below TCP, which on a link-bound path holds
// every flow's burst (milliseconds per message on 1 Gbit/s links).
//
// Small-message path: a wait() on a receive of at most 64 KiB while no send is queued anywhere (the
// latency-bound steps of hd, tree and the agreement messages: the send went out eagerly when
// posted) blocks in recvmsg() on that one socket instead of poll() + read: one send and one receive
// system call per step. Every wait first polls without sleeping, yielding the CPU between polls,
// for up to 50 us (kSpin), so that a message due within microseconds costs no wake-up; a yield that
// kept the rank off the CPU for a scheduler slice (another job holds the core) stops the spinning
// for a while, since spinning then delays the rank by a slice per yield (kYieldLost). The blocking
// receive wakes every kRecvSliceMs (SO_RCVTIMEO) to check the deadline and to notice peers that
// closed meanwhile, so a vanished rank is still named. Errors name the rank: "rank 3: connection
// closed", "rank 3: connection reset", "rank 3 did not send within 5000 ms". A peer that closes
// while this rank waits on another one is remembered and named when that wait times out (the peer
// that died is the cause). A rank that fails because a peer is gone sends its other peers an abort
// notice naming that peer (in place of a message's length), so a rank that waits on it, and never
// talks to the dead one, names the dead one too: "rank 3: gone (reported by rank 1)".
#pragma once

#include <poll.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ina/base/status.h"
#include "worker/host/context.h"
#include "worker/host/store.h"

namespace ina::host {

struct TcpMeshOptions {
  std::string address = "127.0.0.1";         // listen on and publish this address
  std::chrono::milliseconds timeout{30000};  // setup, and every wait
  int socket_buffer_bytes = 0;               // SO_SNDBUF/SO_RCVBUF; 0: the kernel's autotuning
};

class TcpMesh final : public Context {
 public:
  static Result<std::unique_ptr<TcpMesh>> connect(Store& store, int rank, int size,
                                                  const TcpMeshOptions& opts);
  ~TcpMesh() override;
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) override { timeout_ = t; }

  Handle isend(int peer, const void* buf, size_t bytes) override;
  Handle irecv(int peer, void* buf, size_t bytes) override;
  Status wait(Handle h) override;

  // The error that broke the mesh (OK while healthy).
  const Status& error() const { return broken_; }

 private:
  struct Op {
    int peer = -1;
    bool is_send = false;
    bool complete = false;
    uint8_t* buf = nullptr;
    size_t bytes = 0;
    size_t done = 0;  // bytes moved, the 8-byte header included
    uint8_t header[8] = {};
  };
  struct Peer {
    int fd = -1;
    bool closed = false;        // the peer shut its side while we had nothing posted
    uint64_t closed_order = 0;  // when closed: 1 for the first peer seen closing, 2 the next...
    bool send_full = false;     // the last sendmsg hit EAGAIN: wait for POLLOUT before trying again
    std::deque<Op*> sends;
    std::deque<Op*> recvs;
  };

  TcpMesh(int rank, int size, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), timeout_(timeout), peers_(static_cast<size_t>(size)) {}
  Handle post(int peer, bool is_send, uint8_t* buf, size_t bytes);
  Status progress_send(int peer);
  Status progress_recv(int peer);
  Status recv_blocking(Op& op);
  bool sends_queued() const;
  Status poll_once(int timeout_ms);
  // Progresses without sleeping, yielding the CPU between tries, until `op` completes or kSpin
  // went by: on the small-message path its peer's socket alone (one_peer), else every peer's.
  // Returns at once while no_spin_until_ lies ahead, and sets it when a yield lost the core.
  Status spin(Op& op, bool one_peer);
  Status fail(Status s);
  Status timeout_error(const Op& op) const;
  // Marks a peer closed, in the order they are seen; the ranks seen closed, first seen first.
  void mark_closed(int peer);
  void mark_hung_up(const std::vector<pollfd>& fds, const std::vector<int>& who);
  // Marks every other peer whose connection has closed by now (a poll that does not wait).
  void note_closed_peers(int except);
  std::vector<int> closed_in_order() const;
  uint64_t closed_seen_ = 0;
  Status peer_gone(int peer, Status s);
  Status check_header(Op& op, const uint8_t* got, size_t k);
  Status reported_gone(int culprit, int reporter);
  void send_abort_notices();
  int culprit_ = -1;  // the rank this mesh's failure names first, when a peer went away

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<Peer> peers_;
  std::unordered_map<Handle, std::unique_ptr<Op>> ops_;  // posted, not yet waited
  std::vector<pollfd> poll_fds_;
  std::vector<int> poll_ranks_;
  Handle next_handle_ = 1;
  Status broken_;
  // Until then waits block at once: a yield lost the core to another process (tcp_mesh.cc).
  std::chrono::steady_clock::time_point no_spin_until_{};
};

}  // namespace ina::host
