// Pure logic of the RDMA verbs transport (worker/rdma/verbs_proto.h), no device needed: queue pair
// info serialization and validation, chunking, immediates, credit windows (with an in-memory
// model of the slot-ring protocol streaming random messages), and INA_HOST_TRANSPORT selection.
#include "worker/rdma/verbs_proto.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "ina/ina.hpp"

namespace ina::rdma {
namespace {

VerbsPeerInfo sample_info() {
  VerbsPeerInfo v;
  v.world_size = 4;
  v.from_rank = 1;
  v.to_rank = 3;
  v.lid = 0;
  for (int i = 0; i < 16; ++i) v.gid[i] = static_cast<uint8_t>(0xF0 + i);
  v.port = 1;
  v.mtu = 5;
  v.qpn = 0x123456;
  v.psn = 0xABCDE;
  v.slots_addr = 0x7F0000001000ull;
  v.slots_rkey = 0xDEADBEEF;
  v.slot_bytes = 262144;
  v.slot_count = 16;
  v.credit_addr = 0x7F0000000040ull;
  v.credit_rkey = 0xCAFEF00D;
  return v;
}

TEST(VerbsPeerInfo, RoundTrip) {
  const VerbsPeerInfo v = sample_info();
  const std::vector<uint8_t> b = v.serialize();
  ASSERT_EQ(b.size(), VerbsPeerInfo::kWireBytes);
  auto p = VerbsPeerInfo::parse(b, "rank 1's queue pair info");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->world_size, 4u);
  EXPECT_EQ(p->from_rank, 1u);
  EXPECT_EQ(p->to_rank, 3u);
  EXPECT_EQ(p->lid, 0);
  EXPECT_EQ(0, std::memcmp(p->gid, v.gid, 16));
  EXPECT_EQ(p->port, 1);
  EXPECT_EQ(p->mtu, 5);
  EXPECT_EQ(p->qpn, 0x123456u);
  EXPECT_EQ(p->psn, 0xABCDEu);
  EXPECT_EQ(p->slots_addr, 0x7F0000001000ull);
  EXPECT_EQ(p->slots_rkey, 0xDEADBEEFu);
  EXPECT_EQ(p->slot_bytes, 262144u);
  EXPECT_EQ(p->slot_count, 16u);
  EXPECT_EQ(p->credit_addr, 0x7F0000000040ull);
  EXPECT_EQ(p->credit_rkey, 0xCAFEF00Du);
  // Little-endian, fixed layout: the qpn's low byte sits at its offset.
  EXPECT_EQ(b[40], 0x56);
  EXPECT_EQ(b[42], 0x12);
}

// Each malformed field is refused with an error naming it.
TEST(VerbsPeerInfo, RejectsBadFieldsNamingThem) {
  struct Case {
    void (*mutate)(VerbsPeerInfo&);
    const char* expect;
  };
  const Case cases[] = {
      {[](VerbsPeerInfo& v) { v.qpn = 1u << 24; }, "qpn 16777216 out of range [1, 16777215]"},
      {[](VerbsPeerInfo& v) { v.qpn = 0; }, "qpn 0 out of range"},
      {[](VerbsPeerInfo& v) { v.psn = 1u << 24; }, "psn 16777216 out of range"},
      {[](VerbsPeerInfo& v) { v.mtu = 6; }, "mtu 6 out of range [1, 5]"},
      {[](VerbsPeerInfo& v) { v.mtu = 0; }, "mtu 0 out of range"},
      {[](VerbsPeerInfo& v) { v.port = 0; }, "port 0 out of range"},
      {[](VerbsPeerInfo& v) { v.from_rank = 4; }, "from_rank 4 out of range [0, 3]"},
      {[](VerbsPeerInfo& v) { v.to_rank = 1; }, "from_rank and to_rank are both 1"},
      {[](VerbsPeerInfo& v) { v.world_size = 0; }, "world_size 0 out of range"},
      {[](VerbsPeerInfo& v) { v.slot_bytes = 0; }, "slot_bytes 0 out of range"},
      {[](VerbsPeerInfo& v) { v.slot_count = 4097; }, "slot_count 4097 out of range [1, 4096]"},
      {[](VerbsPeerInfo& v) { std::memset(v.gid, 0, 16); }, "neither lid nor gid"},
      {[](VerbsPeerInfo& v) { v.slots_addr = 0; }, "slots_addr is 0"},
      {[](VerbsPeerInfo& v) { v.credit_addr = 0x1004; },
       "credit_addr 4100 is not a non-zero multiple of 8"},
  };
  for (const Case& c : cases) {
    VerbsPeerInfo v = sample_info();
    c.mutate(v);
    auto p = VerbsPeerInfo::parse(v.serialize(), "rank 2's queue pair info");
    ASSERT_FALSE(p.ok()) << c.expect;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("rank 2's queue pair info: "), std::string::npos)
        << p.status().message();
    EXPECT_NE(p.status().message().find(c.expect), std::string::npos) << p.status().message();
  }
  // An InfiniBand port with a LID and no GID is fine.
  VerbsPeerInfo ib = sample_info();
  std::memset(ib.gid, 0, 16);
  ib.lid = 7;
  EXPECT_TRUE(VerbsPeerInfo::parse(ib.serialize(), "x").ok());
}

TEST(VerbsPeerInfo, RejectsBadLayout) {
  std::vector<uint8_t> b = sample_info().serialize();
  auto shorter = b;
  shorter.pop_back();
  auto p = VerbsPeerInfo::parse(shorter, "rank 0's queue pair info");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("79 bytes, expected 80"), std::string::npos);
  auto magic = b;
  magic[0] ^= 1;
  p = VerbsPeerInfo::parse(magic, "w");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("bad magic"), std::string::npos);
  auto version = b;
  version[4] = 9;
  p = VerbsPeerInfo::parse(version, "w");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("version 9"), std::string::npos);
}

TEST(VerbsKeys, ScopedByIncarnation) {
  EXPECT_EQ(peer_info_key(3, 1, 2), "verbs/3/qp/1/2");
  EXPECT_NE(peer_info_key(3, 1, 2), peer_info_key(4, 1, 2));
  EXPECT_NE(peer_info_key(3, 1, 2), peer_info_key(3, 2, 1));
  EXPECT_EQ(ready_key(2, 5), "verbs/2/ready/5");
}

TEST(Chunking, CountsAndLengths) {
  EXPECT_EQ(chunk_count(0, 4096), 1u);
  EXPECT_EQ(chunk_length(0, 4096, 0), 0u);
  EXPECT_EQ(chunk_count(1, 4096), 1u);
  EXPECT_EQ(chunk_count(4096, 4096), 1u);
  EXPECT_EQ(chunk_count(4097, 4096), 2u);
  EXPECT_EQ(chunk_length(4097, 4096, 0), 4096u);
  EXPECT_EQ(chunk_length(4097, 4096, 1), 1u);
  // Lengths add up to the message for many sizes.
  for (size_t slot : {1u, 7u, 4096u}) {
    for (size_t bytes : {0u, 1u, 6u, 7u, 8u, 1000003u}) {
      size_t sum = 0;
      const size_t n = chunk_count(bytes, slot);
      for (size_t i = 0; i < n; ++i) {
        const size_t len = chunk_length(bytes, slot, i);
        EXPECT_LE(len, slot);
        if (i + 1 < n) {
          EXPECT_EQ(len, slot);
        }
        sum += len;
      }
      EXPECT_EQ(sum, bytes) << "slot " << slot;
    }
  }
}

TEST(Chunking, ImmediateRoundTripAndSizeCheck) {
  for (size_t len : {size_t{0}, size_t{1}, size_t{262144}, size_t{VerbsPeerInfo::kMaxSlotBytes}}) {
    for (bool last : {false, true}) {
      const ChunkImm c = decode_imm(encode_imm(len, last));
      EXPECT_EQ(c.length, len);
      EXPECT_EQ(c.last, last);
    }
  }
  // A 10000-byte receive in 4096-byte slots: 4096, 4096, 1808 (last).
  EXPECT_TRUE(check_chunk({4096, false}, 10000, 4096, 0, "rank 2").ok());
  EXPECT_TRUE(check_chunk({1808, true}, 10000, 4096, 2, "rank 2").ok());
  // The sender's message was shorter (its second chunk is its last) or longer.
  for (const ChunkImm& bad : {ChunkImm{4096, true}, ChunkImm{100, true}}) {
    const Status s = check_chunk(bad, 10000, 4096, 1, "rank 2");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message(), "rank 2 sent a message of another size than the 10000 bytes expected");
  }
  EXPECT_FALSE(check_chunk({1808, false}, 10000, 4096, 2, "rank 2").ok());
  EXPECT_FALSE(check_chunk({0, true}, 10000, 4096, 3, "rank 2").ok());  // beyond the message
  EXPECT_TRUE(check_chunk({0, true}, 0, 4096, 0, "rank 2").ok());
  EXPECT_FALSE(check_chunk({5, true}, 0, 4096, 0, "rank 2").ok());
}

TEST(Credits, SendWindowBlocksOnEitherSide) {
  SendWindow w(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(w.can_post());
    EXPECT_EQ(w.next_slot(), static_cast<uint32_t>(i));
    EXPECT_EQ(w.on_post(), static_cast<uint64_t>(i));
  }
  EXPECT_FALSE(w.can_post());
  // The peer consumed one, but the local write has not completed: the staging slot is busy.
  ASSERT_TRUE(w.on_remote_consumed(1).ok());
  EXPECT_FALSE(w.can_post());
  ASSERT_TRUE(w.on_local_complete().ok());
  EXPECT_TRUE(w.can_post());
  EXPECT_EQ(w.next_slot(), 0u);  // wraps
  w.on_post();
  EXPECT_FALSE(w.can_post());
  // Local completions without credits do not help.
  ASSERT_TRUE(w.on_local_complete().ok());
  ASSERT_TRUE(w.on_local_complete().ok());
  EXPECT_FALSE(w.can_post());
  // Protocol violations: a counter that goes back or beyond what was sent; a spurious completion.
  EXPECT_FALSE(w.on_remote_consumed(0).ok());
  EXPECT_FALSE(w.on_remote_consumed(5).ok());
  ASSERT_TRUE(w.on_local_complete().ok());
  EXPECT_FALSE(w.on_local_complete().ok());
}

TEST(Credits, RecvWindowRefusesOverrunAndReportsDueCredits) {
  RecvWindow r(2);
  EXPECT_FALSE(r.credit_due());
  ASSERT_TRUE(r.on_arrival().ok());
  ASSERT_TRUE(r.on_arrival().ok());
  const Status over = r.on_arrival();
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.message().find("ignored its credits"), std::string::npos);
  EXPECT_EQ(r.next_slot(), 0u);
  r.on_consume();
  EXPECT_EQ(r.next_slot(), 1u);
  EXPECT_TRUE(r.credit_due());
  EXPECT_EQ(r.on_credit_posted(), 1u);
  EXPECT_FALSE(r.credit_due());
  ASSERT_TRUE(r.on_arrival().ok());
}

// An in-memory model of the slot-ring protocol as VerbsMesh runs it: chunks are copied into
// staging slots, "written" into the receiver's slot of the same index with an immediate, consumed
// in order into the posted receive, and the consumed counter is written back as credit. Events
// (post, local completion, delivery, consumption, credit write) happen in random interleavings;
// every message must arrive intact and no slot may be overwritten before it is consumed.
TEST(Credits, ModelStreamsRandomMessagesIntact) {
  std::mt19937_64 rng(42);
  for (uint32_t slots : {1u, 2u, 5u}) {
    const size_t slot_bytes = 7;
    std::vector<uint8_t> staging(slots * slot_bytes), remote(slots * slot_bytes);
    std::vector<bool> remote_full(slots, false);
    SendWindow sw(slots);
    RecvWindow rw(slots);
    std::deque<uint32_t> in_flight_slots;  // posted writes not yet delivered (in order)
    std::deque<uint32_t> in_flight_imm;
    std::deque<uint32_t> arrived;
    uint64_t pending_local = 0;  // writes delivered, completion not yet seen
    uint64_t credit_word = 0;    // the sender's, written by the receiver
    std::vector<std::vector<uint8_t>> msgs;
    for (int m = 0; m < 40; ++m) {
      std::vector<uint8_t> v(rng() % 40);  // 0 .. 39 bytes: 0 .. 6 chunks
      for (auto& b : v) b = static_cast<uint8_t>(rng());
      msgs.push_back(std::move(v));
    }
    size_t send_msg = 0, send_chunk = 0, recv_msg = 0, recv_chunk = 0;
    std::vector<std::vector<uint8_t>> got(msgs.size());
    for (size_t i = 0; i < msgs.size(); ++i) got[i].resize(msgs[i].size());
    int steps = 0;
    while (recv_msg < msgs.size()) {
      ASSERT_LT(++steps, 100000) << "no progress (deadlock) with " << slots << " slots";
      switch (rng() % 5) {
        case 0:  // post a chunk
          ASSERT_TRUE(sw.on_remote_consumed(credit_word).ok());
          if (send_msg < msgs.size() && sw.can_post()) {
            const auto& msg = msgs[send_msg];
            const size_t len = chunk_length(msg.size(), slot_bytes, send_chunk);
            const bool last = send_chunk + 1 == chunk_count(msg.size(), slot_bytes);
            const uint32_t s = sw.next_slot();
            if (len != 0)
              std::memcpy(staging.data() + s * slot_bytes, msg.data() + send_chunk * slot_bytes,
                          len);
            in_flight_slots.push_back(s);
            in_flight_imm.push_back(encode_imm(len, last));
            sw.on_post();
            if (last) {
              ++send_msg;
              send_chunk = 0;
            } else {
              ++send_chunk;
            }
          }
          break;
        case 1:  // the NIC delivers the oldest write
          if (!in_flight_slots.empty()) {
            const uint32_t s = in_flight_slots.front();
            ASSERT_FALSE(remote_full[s]) << "slot " << s << " overwritten before consumption";
            std::memcpy(remote.data() + s * slot_bytes, staging.data() + s * slot_bytes,
                        slot_bytes);
            remote_full[s] = true;
            ASSERT_TRUE(rw.on_arrival().ok());
            arrived.push_back(in_flight_imm.front());
            in_flight_slots.pop_front();
            in_flight_imm.pop_front();
            ++pending_local;
          }
          break;
        case 2:  // the local completion
          if (pending_local > 0) {
            --pending_local;
            ASSERT_TRUE(sw.on_local_complete().ok());
          }
          break;
        case 3:  // the receiver consumes into the posted receive
          if (!arrived.empty()) {
            const auto& msg = msgs[recv_msg];
            const ChunkImm c = decode_imm(arrived.front());
            ASSERT_TRUE(check_chunk(c, msg.size(), slot_bytes, recv_chunk, "rank 0").ok());
            const uint32_t s = rw.next_slot();
            ASSERT_TRUE(remote_full[s]);
            if (c.length != 0)
              std::memcpy(got[recv_msg].data() + recv_chunk * slot_bytes,
                          remote.data() + s * slot_bytes, c.length);
            remote_full[s] = false;
            rw.on_consume();
            arrived.pop_front();
            if (c.last) {
              EXPECT_EQ(got[recv_msg], msg) << "message " << recv_msg;
              ++recv_msg;
              recv_chunk = 0;
            } else {
              ++recv_chunk;
            }
          }
          break;
        case 4:  // the credit write lands
          if (rw.credit_due()) credit_word = rw.on_credit_posted();
          break;
      }
    }
    EXPECT_EQ(send_msg, msgs.size());
  }
}

TEST(HostTransport, Choice) {
  auto t = choose_host_transport(HostTransport::kAuto, true, true, "devices: mlx5_0");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, HostTransport::kVerbs);
  t = choose_host_transport(HostTransport::kAuto, true, false,
                            "no RDMA device: ibv_get_device_list found 0");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, HostTransport::kTcp);
  t = choose_host_transport(HostTransport::kAuto, false, false, "configure with -Drdma=enabled");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, HostTransport::kTcp);
  t = choose_host_transport(HostTransport::kTcp, true, true, "devices: mlx5_0");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, HostTransport::kTcp);
  t = choose_host_transport(HostTransport::kVerbs, true, false,
                            "no RDMA device: ibv_get_device_list found 0");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.status().message(),
            "INA_HOST_TRANSPORT=verbs: RDMA verbs unavailable: no RDMA device: ibv_get_device_list "
            "found 0");
  t = choose_host_transport(HostTransport::kVerbs, false, false, "configure with -Drdma=enabled");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("built without the rdma feature"), std::string::npos);
  EXPECT_STREQ(host_transport_name(HostTransport::kVerbs), "verbs");
}

TEST(VerbsSelection, StrictParsing) {
  auto s = parse_verbs_selection(nullptr, nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->device, "");
  EXPECT_EQ(s->port, 0);
  EXPECT_EQ(s->gid_index, 0);
  s = parse_verbs_selection("mlx5_0", "3");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->device, "mlx5_0");
  EXPECT_EQ(s->port, 0);
  EXPECT_EQ(s->gid_index, 3);
  s = parse_verbs_selection("rxe0:2", "");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->device, "rxe0");
  EXPECT_EQ(s->port, 2);
  for (const char* bad : {":1", "mlx5_0:", "mlx5_0:0", "mlx5_0:256", "mlx5_0:x", "a b"}) {
    s = parse_verbs_selection(bad, nullptr);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(
        s.status().message().find("INA_VERBS_DEVICE=\"" + std::string(bad) + "\" is not valid"),
        std::string::npos)
        << s.status().message();
  }
  for (const char* bad : {"-1", "256", "1x", " 1"}) {
    s = parse_verbs_selection(nullptr, bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("expected an integer in [0, 255]"), std::string::npos);
  }
}

TEST(HostTransport, RanksAgree) {
  using T = HostTransport;
  for (const TransportVote& v :
       {TransportVote{T::kVerbs, T::kAuto}, TransportVote{T::kTcp, T::kVerbs},
        TransportVote{T::kTcp, T::kTcp}}) {
    auto d = decode_vote(encode_vote(v), "rank 1's host transport");
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->chosen, v.chosen);
    EXPECT_EQ(d->requested, v.requested);
  }
  EXPECT_EQ(encode_vote({T::kVerbs, T::kAuto}), "verbs/auto");
  for (const char* bad : {"", "verbs", "auto/auto", "rdma/auto", "verbs/auto/x", "tcp/"}) {
    auto d = decode_vote(bad, "rank 1's host transport");
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("rank 1's host transport"), std::string::npos);
  }
  // All alike: that one.
  auto a = agree_host_transport({{T::kVerbs, T::kAuto}, {T::kVerbs, T::kVerbs}});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, T::kVerbs);
  // A rank without a device under auto: everyone on tcp.
  a = agree_host_transport({{T::kVerbs, T::kAuto}, {T::kVerbs, T::kAuto}, {T::kTcp, T::kAuto}});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, T::kTcp);
  a = agree_host_transport({{T::kVerbs, T::kAuto}, {T::kTcp, T::kTcp}});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, T::kTcp);
  // verbs demanded on one rank, tcp on another: a clear error naming both.
  a = agree_host_transport({{T::kTcp, T::kAuto}, {T::kVerbs, T::kAuto}, {T::kVerbs, T::kVerbs}});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(
      a.status().message(),
      "host transport mismatch: rank 2 uses verbs (INA_HOST_TRANSPORT=verbs), rank 0 tcp (auto)");
}

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    if (old != nullptr) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~EnvGuard() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(HostTransport, StrictEnvParsing) {
  EnvGuard rank("INA_RANK", "0");
  EnvGuard world("INA_WORLD_SIZE", "1");
  {
    auto c = Config::from_env();
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->host_transport, HostTransport::kAuto);
  }
  const std::pair<const char*, HostTransport> good[] = {{"auto", HostTransport::kAuto},
                                                        {"tcp", HostTransport::kTcp},
                                                        {"verbs", HostTransport::kVerbs}};
  for (const auto& [text, want] : good) {
    EnvGuard t("INA_HOST_TRANSPORT", text);
    auto c = Config::from_env();
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->host_transport, want) << text;
  }
  for (const char* bad : {"rdma", "TCP", "verbs ", "tcp,verbs", "1"}) {
    EnvGuard t("INA_HOST_TRANSPORT", bad);
    auto c = Config::from_env();
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("INA_HOST_TRANSPORT="), std::string::npos)
        << c.status().message();
    EXPECT_NE(c.status().message().find("expected auto, tcp or verbs"), std::string::npos)
        << c.status().message();
  }
}

}  // namespace
}  // namespace ina::rdma
