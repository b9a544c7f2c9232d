// libFuzzer harness: Engine::on_packet, the aggregator's packet logic, with three jobs served at
// once: a flat job, a tree leaf (with its parent's RESULT, WELCOME, ERROR and exponent answers)
// and a tree root (the leaves' PARTIAL packets).
//
// Input: a sequence of packets (layout: make_seeds.py). Each starts with a mode byte: bits 0-1
// pick the job (3: the flat one), bits 2-3 how the packet is made: 0 raw bytes as they are
// (decode errors, unknown jobs), 1 raw bytes sealed with the job's key, 2 and 3 a header built
// field by field from the input (valid enum values, a count matching the payload, small ranks,
// slots and sequence numbers) then sealed with the key a peer would use (peer_key: the job's,
// its current incarnation's or a leaf parent's), so most packets get past decode and the tag check
// into the join barrier and the slot table; 3 flips one byte after sealing (a bad tag). Then two
// bytes of clock advance in microseconds (telemetry).
//
// Invariants: no reply is larger than wire::max_packet_size of its job; every reply is about a
// served job, carries one of that job's keys, and encodes to a datagram that decodes (kOk) and
// carries that key's tag; sender_rank is -1 or a served rank of the sender's job; packets_in counts
// every packet. At the end the per-job views (stalled slots, loss window, straggler ranking) hold
// served ranks only.
#include <cstdint>
#include <cstring>
#include <vector>

#include "aggregator/engine.h"
#include "fuzz_check.h"
#include "fuzz_input.h"
#include "ina/protocol/wire.h"

using namespace ina;
using namespace ina::agg;

namespace {

constexpr JobId kFlat = 7, kLeaf = 9, kRoot = 11;

std::vector<JobConfig> jobs() {
  JobConfig flat;
  flat.job = kFlat;
  flat.key = Key128{0x1111, 0x2222};
  flat.slots.world_size = 3;
  flat.slots.num_slots = 4;
  flat.slots.max_payload_bytes = 64;
  flat.slot_base = 0;

  JobConfig leaf;  // global ranks [2, 4) of a world of 4, leaf 1 of 2
  leaf.job = kLeaf;
  leaf.key = Key128{0x3333, 0x4444};
  leaf.slots.world_size = 4;
  leaf.slots.num_slots = 4;
  leaf.slots.max_payload_bytes = 64;
  leaf.slot_base = 8;
  leaf.tree.role = TreeRole::kLeaf;
  leaf.tree.rank_base = 2;
  leaf.tree.local_ranks = 2;
  leaf.tree.child_index = 1;
  leaf.tree.parent_world = 2;
  leaf.tree.parent = "127.0.0.1:1";

  JobConfig root;  // two leaves
  root.job = kRoot;
  root.key = Key128{0x5555, 0x6666};
  root.slots.world_size = 2;
  root.slots.num_slots = 4;
  root.slots.max_payload_bytes = 64;
  root.slot_base = 16;
  root.tree.role = TreeRole::kRoot;
  return {flat, leaf, root};
}

const JobConfig* find(const std::vector<JobConfig>& js, JobId id) {
  for (const JobConfig& j : js) {
    if (j.job == id) return &j;
  }
  return nullptr;
}

constexpr uint8_t kFlagChoices[] = {0,
                                    wire::kFlagRetransmit,
                                    wire::kFlagNonFinite,
                                    wire::kFlagHello,
                                    wire::kFlagHello | wire::kFlagRetransmit,
                                    wire::kFlagPartial,
                                    wire::kFlagPartial | wire::kFlagRetransmit,
                                    wire::kFlagResult,
                                    wire::kFlagResult | wire::kFlagNonFinite,
                                    wire::kFlagHello | wire::kFlagResult,
                                    wire::kFlagError,
                                    wire::kFlagPartial | wire::kFlagResult};

// The key a peer of job `cfg` seals a packet with `flags` with (WIRE.md, "Incarnations"): a
// HELLO the job's key; at a leaf, its parent's RESULT and ERROR the parent incarnation's key;
// anything else the job's current incarnation's.
Key128 peer_key(const Engine& engine, const JobConfig& cfg, uint8_t flags) {
  if ((flags & wire::kFlagHello) != 0) return cfg.key;
  Key128 traffic, up;
  FUZZ_CHECK(engine.current_keys(cfg.job, &traffic, &up));
  if (cfg.is_leaf() && (flags & (wire::kFlagResult | wire::kFlagError)) != 0) return up;
  return traffic;
}

// A header of job `cfg` built from the input (layout: make_seeds.py), its payload and the seal.
std::vector<uint8_t> structured(fuzz::Reader& in, const JobConfig& cfg, const Engine& engine) {
  wire::Header h;
  h.job = cfg.job;
  const uint8_t fsel = in.u8();
  h.flags = fsel < 240 ? kFlagChoices[fsel % sizeof kFlagChoices]
                       : static_cast<uint8_t>(fsel & wire::kKnownFlags);
  const uint8_t seq = in.u8();
  h.seq = seq < 200 ? seq % 7 : in.u32();
  h.rank = in.u8() % 6;
  h.slot = in.u8() % 6;
  h.shadow = (in.u8() & 1) != 0;
  h.dtype = static_cast<DType>(1 + in.u8() % 6);
  h.op = static_cast<ReduceOp>(1 + in.u8() % 3);
  if (h.has(wire::kFlagPartial)) {
    if (h.dtype == DType::kInt32) h.dtype = DType::kFloat32;
    h.op = ReduceOp::kSum;
    h.exp = static_cast<int16_t>(in.u16());
  }
  h.coll = in.u8() % 4;
  h.elems = in.u8() % 41;
  const uint8_t root = in.u8();
  h.root = root == 0xFF ? wire::kNoRoot : root % 5;
  const size_t width = wire::payload_width(h.flags, h.dtype);
  const size_t max_words = (cfg.slots.max_payload_bytes * wire::kMaxPartialGrowth) / width + 2;
  h.count = static_cast<uint16_t>(in.u16() % (max_words + 1));
  std::vector<uint8_t> d(wire::packet_size(h));
  wire::encode_header(h, d.data());
  const std::vector<uint8_t> payload = in.bytes(d.size() - wire::kHeaderSize);
  if (!payload.empty()) std::memcpy(d.data() + wire::kHeaderSize, payload.data(), payload.size());
  // HELLO: bit 0 sets the one word to the world size (bit 1: a leaf's parent world), usually
  // the right one.
  const uint8_t fix = in.u8();
  if (h.has(wire::kFlagHello) && h.count >= 1 && (fix & 1) != 0) {
    const uint32_t world =
        (fix & 2) != 0 && cfg.is_leaf() ? cfg.tree.parent_world : cfg.slots.world_size;
    wire::put_le32(d.data() + wire::kHeaderSize, world);
  }
  wire::seal(d, peer_key(engine, cfg, h.flags));
  return d;
}

void check_reply(const Reply& r, const std::vector<JobConfig>& js, const Engine& engine) {
  if (r.target == Reply::Target::kNone) return;
  const JobConfig* cfg = find(js, r.hdr.job);
  FUZZ_CHECK(cfg != nullptr);
  // Sealed with a key of this job: its own, its current incarnation's or (to a leaf's parent)
  // the parent incarnation's.
  Key128 traffic, up;
  FUZZ_CHECK(engine.current_keys(cfg->job, &traffic, &up));
  FUZZ_CHECK(r.key == cfg->key || r.key == traffic || r.key == up);
  FUZZ_CHECK(r.target != Reply::Target::kParent || cfg->is_leaf());
  const size_t n = r.packet_size();
  FUZZ_CHECK(n <= wire::max_packet_size(cfg->slots.max_payload_bytes, cfg->slots.world_size));
  FUZZ_CHECK(r.payload_bytes() == 0 || r.payload != nullptr);
  std::vector<uint8_t> d(n);
  wire::encode_header(r.hdr, d.data());
  if (r.payload_bytes() > 0)
    std::memcpy(d.data() + wire::kHeaderSize, r.payload, r.payload_bytes());
  wire::seal(d, r.key);
  wire::PacketView v;
  FUZZ_CHECK(wire::decode(d, &v) == wire::DecodeError::kOk);
  FUZZ_CHECK(wire::tag_ok(d, r.key));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<JobConfig> kJobs = jobs();
  Engine engine;
  engine.set_slot_capacity(64);
  for (const JobConfig& j : kJobs) FUZZ_CHECK(engine.add_job(j).ok());

  fuzz::Reader in(data, size);
  uint64_t now = 1'000'000;
  uint64_t packets = 0;
  while (in.remaining() > 0 && packets < 256) {
    const uint8_t mode = in.u8();
    const JobConfig* cfg = &kJobs[(mode & 3) % kJobs.size()];
    std::vector<uint8_t> d;
    const int how = (mode >> 2) & 3;
    if (how >= 2) {
      d = structured(in, *cfg, engine);
      if (how == 3) d[in.u16() % d.size()] ^= 0x40;  // a bad tag (or a bad header)
    } else {
      d = in.bytes(in.u16() % 601);
      if (how == 1 && d.size() >= wire::kHeaderSize) wire::seal(d, cfg->key);
    }
    now += uint64_t{in.u16()} * 1000;
    int32_t rank = -2;
    JobId job = 1;
    const Reply r = engine.on_packet(d, now, &rank, &job);
    ++packets;
    FUZZ_CHECK(rank >= -1);
    if (rank >= 0) {
      const JobConfig* sj = find(kJobs, job);
      FUZZ_CHECK(sj != nullptr && static_cast<uint32_t>(rank) < sj->served_ranks());
    } else {
      FUZZ_CHECK(job == 0);
    }
    check_reply(r, kJobs, engine);
  }
  FUZZ_CHECK(engine.counters().packets_in == packets);
  for (const JobConfig& j : kJobs) {
    for (const StalledSlot& s : engine.stalled_slots(j.job, now, 0)) {
      FUZZ_CHECK(s.slot < j.slots.num_slots);
      for (uint32_t m : s.missing) FUZZ_CHECK(m < j.slots.world_size);
    }
    for (uint32_t rank : engine.straggler_ranking(j.job)) FUZZ_CHECK(rank < j.served_ranks());
    (void)engine.loss_window(j.job, now);
    FUZZ_CHECK(engine.rank_counters(j.job).size() == j.served_ranks());
  }
  return 0;
}
