#include "worker/host/tcp_mesh.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "worker/host/socket.h"

namespace ina::host {

namespace {

constexpr uint32_t kMagic = 0x4D414E49;  // "INAM"

std::string rank_name(int r) { return "rank " + std::to_string(r); }

Status peer_errno(int peer, int err) {
  if (err == ECONNRESET) return unavailable(rank_name(peer) + ": connection reset");
  if (err == EPIPE) return unavailable(rank_name(peer) + ": connection closed (broken pipe)");
  return errno_status(rank_name(peer), err);
}

void put_hello(uint8_t* p, int rank, int size) {
  put_u32(p, kMagic);
  put_u32(p + 4, static_cast<uint32_t>(rank));
  put_u32(p + 8, static_cast<uint32_t>(size));
  put_u32(p + 12, 0);
}

// Checks a hello: our magic and world size; returns the sender's rank.
Result<int> check_hello(const uint8_t* p, int size, const std::string& from) {
  if (get_u32(p) != kMagic) return unavailable(from + ": not an INA mesh peer (bad magic)");
  if (get_u32(p + 8) != static_cast<uint32_t>(size))
    return invalid_argument(from + ": world size " + std::to_string(get_u32(p + 8)) +
                            ", this rank has " + std::to_string(size));
  const uint32_t r = get_u32(p + 4);
  if (r >= static_cast<uint32_t>(size))
    return invalid_argument(from + ": bad rank " + std::to_string(r));
  return static_cast<int>(r);
}

constexpr int kMinBacklog = 128;            // the listen backlog of a small world (see connect)
constexpr int kRecvSliceMs = 100;           // a blocking receive re-checks the deadline this often
constexpr size_t kSmallMessage = 64 << 10;  // the blocking path's limit (larger ones poll)
// A wait polls without sleeping (yielding the CPU between polls) for up to kSpin before it
// blocks: a message due within microseconds then costs no wake-up (10-15 us at each end on a
// virtualized 2-core machine). On a quiet 2-core VM, 4 ranks on loopback, AllToAll of 32-512 KiB
// per rank took 0.61-0.69x the time it took blocking at once, AllToAllv under Zipf(1.2) loads
// 0.59-0.87x from 1 to 256 KiB, at the same CPU per byte within the noise
// (testbed/results/alltoall-loopback-20261206/).
constexpr std::chrono::microseconds kSpin{50};
// A yield after which this rank got the CPU back only kYieldLost later handed the core to a
// process that does not give it back at its next wait: another job's CPU-bound work, which holds
// the core for a scheduler slice (milliseconds), not a peer rank (which runs its sends and waits
// again within tens of microseconds, hundreds at most for MiB blocks). Spinning then costs a
// slice per yield, while a rank blocked in recvmsg/poll is woken, and scheduled early, when its
// data lands: the mesh stops spinning for kNoSpinFor and blocks at once (then tries again). On
// the shared 2-core VM, rounds paired with the mesh that always spins: 8 ranks, AllToAll of
// 128 KiB per rank 0.70x the time with other jobs holding 1.4-1.8 cores and 0.12x with them
// holding 1.6-1.95 (load 14-18), AllToAllv Zipf(1.2) of 64 KiB 0.68x and 0.16x; 4 ranks 0.78-0.98x
// (testbed/results/alltoall-contended-20261206/). The threshold is 2 ms, not less: with the
// cores otherwise idle, 4 ranks on 2 cores lose them to each other for up to about a millisecond
// at 32 KiB-2 MiB (a peer's large send), and at 500 us the rule fired there and cost 1.1-1.5x
// the time; at 2 ms the quiet runs were no slower than without the rule, and beside two CPU hogs
// 8 ranks still took 0.14-0.25x the time of spinning at 16 and 128 KiB (same record).
constexpr std::chrono::microseconds kYieldLost{2000};
constexpr std::chrono::milliseconds kNoSpinFor{100};

// An abort notice: in place of a message's 8-byte length, 0xFFFFFFFF then the rank that a failing
// rank found gone (see TcpMesh::fail). No message is 2^32 times 4 GiB long.
constexpr uint32_t kAbortMark = 0xFFFFFFFF;
void put_abort(uint8_t* p, int culprit) {
  put_u32(p, static_cast<uint32_t>(culprit));
  put_u32(p + 4, kAbortMark);
}
// The rank an abort notice names, or -1 when the 8 bytes are not one.
int abort_culprit(const uint8_t* p, int size) {
  if (get_u32(p + 4) != kAbortMark || get_u32(p) >= static_cast<uint32_t>(size)) return -1;
  return static_cast<int>(get_u32(p));
}

// After the handshake: a blocking socket (every call but the small-message receive passes
// MSG_DONTWAIT) whose blocking receives return EAGAIN after kRecvSliceMs.
Status make_blocking_with_slice(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
    return errno_status("fcntl(~O_NONBLOCK)", errno);
  timeval tv{};
  tv.tv_usec = kRecvSliceMs * 1000;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0)
    return errno_status("setsockopt(SO_RCVTIMEO)", errno);
  return ok_status();
}

void set_buffers(int fd, int bytes) {
  if (bytes <= 0) return;
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

}  // namespace

Result<std::unique_ptr<TcpMesh>> TcpMesh::connect(Store& store, int rank, int size,
                                                  const TcpMeshOptions& opts) {
  if (size < 1 || rank < 0 || rank >= size)
    return invalid_argument("TcpMesh: rank " + std::to_string(rank) + " outside world of " +
                            std::to_string(size));
  auto mesh = std::unique_ptr<TcpMesh>(new TcpMesh(rank, size, opts.timeout));
  if (size == 1) return mesh;
  const auto deadline = Clock::now() + opts.timeout;

  // The backlog holds every higher rank's connection and its retries at once (a rank that saw
  // a reset connects again before this one accepted the first).
  INA_ASSIGN_OR_RETURN(int lfd, listen_tcp(opts.address, 0, std::max(2 * size, kMinBacklog)));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{lfd};
  INA_ASSIGN_OR_RETURN(uint16_t port, local_port(lfd));
  const bool v6 = opts.address.find(':') != std::string::npos;
  const std::string me =
      (v6 ? "[" + opts.address + "]" : opts.address) + ":" + std::to_string(port);
  INA_RETURN_IF_ERROR(store.set("mesh/addr/" + std::to_string(rank), to_bytes(me)));

  uint8_t hello[16];
  put_hello(hello, rank, size);
  // Lower ranks: connect, say hello, expect theirs. A connection reset or closed during the
  // handshake (the peer's backlog overflowed, a slow accept under load) is retried until the
  // deadline; a peer that answers wrongly (another job, another world size) is an error at once.
  for (int peer = 0; peer < rank; ++peer) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    INA_ASSIGN_OR_RETURN(Bytes addr, store.get("mesh/addr/" + std::to_string(peer),
                                               std::max(left, std::chrono::milliseconds(1))));
    INA_ASSIGN_OR_RETURN(HostPort hp, parse_host_port(to_string(addr)));
    const std::string name = rank_name(peer);
    for (int attempt = 1;; ++attempt) {
      INA_ASSIGN_OR_RETURN(int fd, connect_tcp(hp.host, hp.port, deadline));
      Peer& p = mesh->peers_[static_cast<size_t>(peer)];
      if (p.fd >= 0) close(p.fd);
      p.fd = fd;  // owned by the mesh from here on
      set_buffers(fd, opts.socket_buffer_bytes);
      uint8_t reply[16];
      Status s = send_all(fd, hello, sizeof(hello), deadline, name);
      if (s.ok()) s = recv_all(fd, reply, sizeof(reply), deadline, name);
      if (s.ok()) {
        INA_ASSIGN_OR_RETURN(int got, check_hello(reply, size, name));
        if (got != peer)
          return unavailable(name + ": the address published by rank " + std::to_string(peer) +
                             " answered as rank " + std::to_string(got));
        break;
      }
      if (s.code() != StatusCode::kUnavailable || Clock::now() >= deadline)
        return Status(s.code(), "TcpMesh: rank " + std::to_string(rank) + ": connecting to " +
                                    to_string(addr) + " (" + name + "), attempt " +
                                    std::to_string(attempt) + ": " + s.message());
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(5 * attempt, 100)));
    }
  }
  // Higher ranks: accept, expect hello, answer. A connection that fails before the handshake
  // completes is dropped (its rank connects again); a second connection from a rank replaces
  // the first (that rank saw the first one fail).
  int joined = 0;
  while (joined < size - 1 - rank) {
    Result<int> fd = accept_tcp(lfd, deadline);
    if (!fd.ok()) {
      std::string missing;
      for (int p = rank + 1; p < size; ++p)
        if (mesh->peers_[static_cast<size_t>(p)].fd < 0)
          missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      return deadline_exceeded("TcpMesh: rank " + std::to_string(rank) + ": ranks " + missing +
                               " did not connect within " + std::to_string(opts.timeout.count()) +
                               " ms");
    }
    uint8_t got_hello[16];
    Status s = recv_all(*fd, got_hello, sizeof(got_hello), deadline, "mesh peer");
    if (!s.ok() || get_u32(got_hello) != kMagic) {
      // Not one of ours (a port scanner, a stale client), or one that failed before its hello
      // came (it retries): drop it and keep accepting until the deadline.
      close(*fd);
      continue;
    }
    Result<int> peer = check_hello(got_hello, size, "mesh peer");
    if (peer.ok() && *peer <= rank)
      peer =
          invalid_argument("mesh peer: unexpected connection from rank " + std::to_string(*peer));
    if (!peer.ok()) {
      close(*fd);
      return peer.status();
    }
    set_buffers(*fd, opts.socket_buffer_bytes);
    if (!send_all(*fd, hello, sizeof(hello), deadline, rank_name(*peer)).ok()) {
      close(*fd);  // it failed on the peer's side too: the peer connects again
      continue;
    }
    Peer& p = mesh->peers_[static_cast<size_t>(*peer)];
    if (p.fd >= 0) {
      close(p.fd);  // the peer gave up on that one and connected again
    } else {
      ++joined;
    }
    p.fd = *fd;
  }
  for (const Peer& p : mesh->peers_)
    if (p.fd >= 0) INA_RETURN_IF_ERROR(make_blocking_with_slice(p.fd));
  return mesh;
}

TcpMesh::~TcpMesh() {
  for (auto& p : peers_)
    if (p.fd >= 0) close(p.fd);
}

Context::Handle TcpMesh::post(int peer, bool is_send, uint8_t* buf, size_t bytes) {
  const Handle h = next_handle_++;
  if (!broken_.ok()) return h;  // not in ops_: wait() reports broken_
  if (peer < 0 || peer >= size_ || peer == rank_) {
    (void)fail(invalid_argument("TcpMesh: bad peer " + std::to_string(peer)));
    return h;
  }
  auto op = std::make_unique<Op>();
  op->peer = peer;
  op->is_send = is_send;
  op->buf = buf;
  op->bytes = bytes;
  put_u64(op->header, bytes);
  Peer& p = peers_[static_cast<size_t>(peer)];
  (is_send ? p.sends : p.recvs).push_back(op.get());
  ops_.emplace(h, std::move(op));
  // Eager send: a message goes to the kernel now, without waiting for the next wait() (lower
  // latency, and the peer can progress while this rank computes), unless the socket is full.
  if (is_send && !p.send_full) {
    Status s = progress_send(peer);
    if (!s.ok()) (void)fail(std::move(s));
  }
  return h;
}

Context::Handle TcpMesh::isend(int peer, const void* buf, size_t bytes) {
  return post(peer, true, static_cast<uint8_t*>(const_cast<void*>(buf)), bytes);
}

Context::Handle TcpMesh::irecv(int peer, void* buf, size_t bytes) {
  return post(peer, false, static_cast<uint8_t*>(buf), bytes);
}

Status TcpMesh::fail(Status s) {
  if (broken_.ok()) {
    broken_ = std::move(s);
    send_abort_notices();
  }
  for (auto& p : peers_) {
    p.sends.clear();
    p.recvs.clear();
  }
  ops_.clear();
  return broken_;
}

// This rank fails because culprit_ is gone: it tells every other live peer, so that a rank waiting
// on this one (a ring or halving-doubling neighbour, which never talks to the culprit) names the
// culprit too, not this rank that merely stopped. Best effort and never blocking; skipped on a
// connection with a message half sent (the notice would land inside it).
void TcpMesh::send_abort_notices() {
  if (culprit_ < 0) return;
  uint8_t notice[8];
  put_abort(notice, culprit_);
  for (int r = 0; r < size_; ++r) {
    const Peer& p = peers_[static_cast<size_t>(r)];
    if (r == culprit_ || p.fd < 0 || p.closed) continue;
    if (!p.sends.empty() && p.sends.front()->done != 0) continue;
    (void)!send(p.fd, notice, sizeof notice, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

// Moves as many bytes of the queued sends as the socket takes.
Status TcpMesh::progress_send(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  p.send_full = false;  // set again below if the kernel takes less than offered
  while (!p.sends.empty()) {
    Op* op = p.sends.front();
    iovec iov[2];
    int n = 0;
    if (op->done < 8) iov[n++] = {op->header + op->done, 8 - op->done};
    const size_t body_done = op->done < 8 ? 0 : op->done - 8;
    if (op->bytes > body_done) iov[n++] = {op->buf + body_done, op->bytes - body_done};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t k = sendmsg(p.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        p.send_full = true;
        return ok_status();
      }
      return peer_gone(peer, peer_errno(peer, errno));
    }
    op->done += static_cast<size_t>(k);
    if (op->done == op->bytes + 8) {
      if (op->bytes >= kFlushFrom) flush_tcp(p.fd);  // the message's tail out now (kFlushFrom)
      op->complete = true;
      p.sends.pop_front();
    } else {
      p.send_full = true;  // a partial write: the socket buffer is full
      return ok_status();
    }
  }
  return ok_status();
}

// Reads into the queued receives as far as the socket has data.
Status TcpMesh::progress_recv(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  while (!p.recvs.empty()) {
    Op* op = p.recvs.front();
    iovec iov[2];
    int n = 0;
    uint8_t got[8];
    if (op->done < 8) iov[n++] = {got, 8 - op->done};
    const size_t body_done = op->done < 8 ? 0 : op->done - 8;
    if (op->bytes > body_done) iov[n++] = {op->buf + body_done, op->bytes - body_done};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t k = recvmsg(p.fd, &msg, MSG_DONTWAIT);
    if (k == 0) return peer_gone(peer, unavailable(rank_name(peer) + ": connection closed"));
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return ok_status();
      return peer_gone(peer, peer_errno(peer, errno));
    }
    if (op->done < 8) INA_RETURN_IF_ERROR(check_header(*op, got, static_cast<size_t>(k)));
    op->done += static_cast<size_t>(k);
    if (op->done == op->bytes + 8) {
      op->complete = true;
      p.recvs.pop_front();
    }
  }
  return ok_status();
}

// k bytes arrived for op, the first of them (up to the header's end) in `got`. They are kept in
// op.header until the header is whole; it must then be op's length, or an abort notice.
Status TcpMesh::check_header(Op& op, const uint8_t* got, size_t k) {
  const size_t part = std::min<size_t>(k, 8 - op.done);
  std::memcpy(op.header + op.done, got, part);
  if (op.done + part < 8) return ok_status();
  uint8_t expected[8];
  put_u64(expected, op.bytes);
  if (std::memcmp(op.header, expected, 8) == 0) return ok_status();
  const int culprit = abort_culprit(op.header, size_);
  if (culprit >= 0) return reported_gone(culprit, op.peer);
  return invalid_argument(rank_name(op.peer) + " sent a message of another size than the " +
                          std::to_string(op.bytes) + " bytes expected");
}

// `reporter` sent an abort notice naming `culprit`: the error names the culprit first.
Status TcpMesh::reported_gone(int culprit, int reporter) {
  if (culprit == rank_) {
    return unavailable(rank_name(reporter) + " failed, naming this rank gone");
  }
  culprit_ = culprit;
  mark_closed(culprit);
  mark_closed(reporter);
  return unavailable(rank_name(culprit) + ": gone (reported by " + rank_name(reporter) + ")");
}

bool TcpMesh::sends_queued() const {
  for (const Peer& p : peers_)
    if (!p.sends.empty()) return true;
  return false;
}

// The small-message path: blocks in recvmsg() for `op` (the front receive of its peer) until it
// completes, or for one kRecvSliceMs slice (then returns OK with op incomplete).
Status TcpMesh::recv_blocking(Op& op) {
  Peer& p = peers_[static_cast<size_t>(op.peer)];
  while (!op.complete) {
    iovec iov[2];
    int n = 0;
    uint8_t got[8];
    if (op.done < 8) iov[n++] = {got, 8 - op.done};
    const size_t body_done = op.done < 8 ? 0 : op.done - 8;
    if (op.bytes > body_done) iov[n++] = {op.buf + body_done, op.bytes - body_done};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t k = recvmsg(p.fd, &msg, 0);
    if (k == 0) return peer_gone(op.peer, unavailable(rank_name(op.peer) + ": connection closed"));
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return ok_status();  // a slice went by
      return peer_gone(op.peer, peer_errno(op.peer, errno));
    }
    if (op.done < 8) INA_RETURN_IF_ERROR(check_header(op, got, static_cast<size_t>(k)));
    op.done += static_cast<size_t>(k);
    if (op.done == op.bytes + 8) {
      op.complete = true;
      p.recvs.pop_front();
    }
  }
  return ok_status();
}

Status TcpMesh::poll_once(int timeout_ms) {
  std::vector<pollfd>& fds = poll_fds_;  // reused: no allocation per poll
  std::vector<int>& who = poll_ranks_;
  fds.clear();
  who.clear();
  for (int r = 0; r < size_; ++r) {
    Peer& p = peers_[static_cast<size_t>(r)];
    if (p.fd < 0) continue;
    short ev = 0;
    if (!p.sends.empty()) ev |= POLLOUT;
    if (!p.recvs.empty()) ev |= POLLIN;
    if (ev == 0 && p.closed) continue;
    ev |= POLLRDHUP;  // to notice a peer that goes away (alone: an idle peer)
    fds.push_back({p.fd, ev, 0});
    who.push_back(r);
  }
  const int n = poll(fds.data(), fds.size(), timeout_ms);
  if (n < 0) return errno == EINTR ? ok_status() : errno_status("poll", errno);
  // Peers that closed, noted before any error is returned: when a rank dies and a neighbour that
  // saw it fails and closes too, the error names both (peer_gone), the one seen first first.
  mark_hung_up(fds, who);
  for (size_t i = 0; i < fds.size(); ++i) {
    const short re = fds[i].revents;
    if (re == 0 || fds[i].events == POLLRDHUP) continue;
    const int r = who[i];
    Peer& p = peers_[static_cast<size_t>(r)];
    if (!p.recvs.empty() && (re & (POLLIN | POLLHUP | POLLERR)))
      INA_RETURN_IF_ERROR(progress_recv(r));
    if (!p.sends.empty() && (re & (POLLOUT | POLLHUP | POLLERR)))
      INA_RETURN_IF_ERROR(progress_send(r));
  }
  return ok_status();
}

// Marks closed every peer whose entry of a finished poll() reports a hang-up, in fds' order.
void TcpMesh::mark_hung_up(const std::vector<pollfd>& fds, const std::vector<int>& who) {
  for (size_t i = 0; i < fds.size(); ++i) {
    if ((fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) mark_closed(who[i]);
  }
}

void TcpMesh::note_closed_peers(int except) {
  std::vector<pollfd> fds;  // not poll_fds_: poll_once may be iterating over it (an error path)
  std::vector<int> who;
  for (int r = 0; r < size_; ++r) {
    const Peer& p = peers_[static_cast<size_t>(r)];
    if (r == except || p.fd < 0 || p.closed) continue;
    fds.push_back({p.fd, POLLRDHUP, 0});
    who.push_back(r);
  }
  if (fds.empty() || poll(fds.data(), fds.size(), 0) <= 0) return;
  mark_hung_up(fds, who);
}

void TcpMesh::mark_closed(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.closed) return;
  p.closed = true;
  p.closed_order = ++closed_seen_;
}

std::vector<int> TcpMesh::closed_in_order() const {
  std::vector<int> v;
  for (int r = 0; r < size_; ++r) {
    if (peers_[static_cast<size_t>(r)].closed) v.push_back(r);
  }
  std::sort(v.begin(), v.end(), [this](int a, int b) {
    return peers_[static_cast<size_t>(a)].closed_order <
           peers_[static_cast<size_t>(b)].closed_order;
  });
  return v;
}

// A peer's connection failed. When a rank dies, its neighbours may fail first and close: the
// rank reported is the one seen closing first (this poll loop watches every idle peer's
// connection for its close), the others follow.
Status TcpMesh::peer_gone(int peer, Status s) {
  // A rank that dies closes all its connections at once, and a neighbour reacts to that only
  // later: look at the other connections first, so that a rank waiting on the neighbour (the ring,
  // halving-doubling) still finds the dead rank's close already there and names it first.
  note_closed_peers(peer);
  // A peer that closed may have said why first: an abort notice still in its socket (this peer's
  // first, then the others').
  for (int i = 0; i < size_; ++i) {
    const int r = (peer + i) % size_;
    const Peer& q = peers_[static_cast<size_t>(r)];
    if (r == rank_ || q.fd < 0 || (r != peer && !q.closed)) continue;
    uint8_t notice[8];
    if (recv(q.fd, notice, sizeof notice, MSG_PEEK | MSG_DONTWAIT) != 8) continue;
    const int culprit = abort_culprit(notice, size_);
    if (culprit >= 0 && culprit != rank_) return reported_gone(culprit, r);
  }
  const std::vector<int> before = closed_in_order();
  culprit_ = before.empty() || before[0] == peer ? peer : before[0];
  mark_closed(peer);
  std::string others;  // closed before, other than the first and this one
  for (size_t i = 1; i < before.size(); ++i) {
    if (before[i] != peer) others += (others.empty() ? "" : ", ") + std::to_string(before[i]);
  }
  const std::string also = others.empty() ? "" : "; closed too: rank " + others;
  if (before.empty() || before[0] == peer) {
    return others.empty() ? s : Status(s.code(), s.message() + " (" + also.substr(2) + ")");
  }
  return Status(s.code(), rank_name(before[0]) + ": connection closed (seen first; then " +
                              s.message() + also + ")");
}

Status TcpMesh::timeout_error(const Op& op) const {
  const std::string what = rank_name(op.peer) +
                           (op.is_send ? " did not receive" : " did not send") + " within " +
                           std::to_string(timeout_.count()) + " ms";
  std::string closed;
  for (int r : closed_in_order()) closed += (closed.empty() ? "" : ", ") + std::to_string(r);
  if (!closed.empty())
    return unavailable((closed.find(',') == std::string::npos ? "rank " : "ranks ") + closed +
                       ": connection closed (" + what + ")");
  return deadline_exceeded(what);
}

Status TcpMesh::spin(Op& op, bool one_peer) {
  auto now = Clock::now();
  if (now < no_spin_until_) return ok_status();  // the core is contended: block at once
  for (const auto end = now + kSpin; !op.complete && now < end;) {
    INA_RETURN_IF_ERROR(one_peer ? progress_recv(op.peer) : poll_once(0));
    if (op.complete) break;
    const auto before = Clock::now();
    sched_yield();
    now = Clock::now();
    if (now - before > kYieldLost) {
      no_spin_until_ = now + kNoSpinFor;
      break;
    }
  }
  return ok_status();
}

Status TcpMesh::wait(Handle h) {
  if (h == 0) return ok_status();
  if (!broken_.ok()) return broken_;
  auto it = ops_.find(h);
  if (it == ops_.end()) return ok_status();  // already waited
  Op* op = it->second.get();
  const auto deadline = Clock::now() + timeout_;
  if (!op->is_send && op->bytes <= kSmallMessage && !sends_queued() &&
      peers_[static_cast<size_t>(op->peer)].recvs.front() == op) {
    // The small-message path (see the header): nothing else needs this rank's progress.
    if (Status s = spin(*op, true); !s.ok()) return fail(std::move(s));
    while (!op->complete) {
      if (ms_until(deadline) == 0) return fail(timeout_error(*op));
      Status s = recv_blocking(*op);
      if (s.ok() && !op->complete) s = poll_once(0);  // a slice went by: note closed peers
      if (!s.ok()) return fail(std::move(s));
    }
    ops_.erase(it);
    return ok_status();
  }
  // Try the waited-for peer first: small messages often complete without a poll.
  Status s = op->is_send
                 ? (peers_[static_cast<size_t>(op->peer)].send_full ? ok_status()
                                                                    : progress_send(op->peer))
                 : progress_recv(op->peer);
  if (!s.ok()) return fail(std::move(s));
  s = spin(*op, false);
  if (!s.ok()) return fail(std::move(s));
  while (!op->complete) {
    const int ms = ms_until(deadline);
    if (ms == 0) return fail(timeout_error(*op));
    s = poll_once(ms);
    if (!s.ok()) return fail(std::move(s));
  }
  ops_.erase(it);
  return ok_status();
}

}  // namespace ina::host
