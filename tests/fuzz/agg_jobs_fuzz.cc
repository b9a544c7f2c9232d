// libFuzzer harness: the aggregator's job configuration parser, parse_heartbeat_jobs (the
// controller's answer to a heartbeat: the jobs to serve), and the engine that takes its jobs.
//
// Invariants: an accepted answer's jobs satisfy what the parser promises (leaf ranks inside the
// world, block size a multiple of 4 bytes); Engine::add_job accepts or refuses each without
// disturbing the others (a refused job leaves the served set unchanged, an accepted one is
// served with exactly its configuration); sealed HELLOs of a served job's ranks get replies no
// larger than wire::max_packet_size, sealed with the job's key.
#include <cstdint>
#include <string>
#include <vector>

#include "aggregator/control_agent.h"
#include "aggregator/engine.h"
#include "fuzz_check.h"
#include "ina/protocol/wire.h"

using namespace ina;
using namespace ina::agg;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  Result<std::vector<JobConfig>> r = parse_heartbeat_jobs(body);
  if (!r.ok()) {
    FUZZ_CHECK(!r.status().message().empty());
    return 0;
  }
  Engine engine;
  engine.set_slot_capacity(size % 2 == 0 ? 0 : 4096);
  for (const JobConfig& c : r.value()) {
    FUZZ_CHECK(c.slots.max_payload_bytes % 4 == 0);
    if (c.is_leaf()) {
      FUZZ_CHECK(c.tree.local_ranks >= 1);
      FUZZ_CHECK(uint64_t{c.tree.rank_base} + c.tree.local_ranks <= c.slots.world_size);
    }
    const size_t before = engine.jobs().size();
    const Status s = engine.add_job(c);
    if (!s.ok()) {
      FUZZ_CHECK(engine.jobs().size() == before);
      continue;
    }
    FUZZ_CHECK(engine.jobs().size() == before + 1);
    const JobConfig* served = engine.job_config(c.job);
    FUZZ_CHECK(served != nullptr && *served == c);
    // Every served rank joins (a few of them for a large world).
    for (uint32_t i = 0; i < c.served_ranks() && i < 4; ++i) {
      wire::Header h;
      h.flags = wire::kFlagHello;
      h.job = c.job;
      h.rank = static_cast<uint16_t>(c.first_rank() + i);
      h.seq = 1;
      h.count = 1;
      std::vector<uint8_t> d(wire::packet_size(h));
      wire::encode_header(h, d.data());
      wire::put_le32(d.data() + wire::kHeaderSize, c.slots.world_size);
      wire::seal(d, c.key);
      int32_t rank = -2;
      JobId job = 0;
      const Reply rep = engine.on_packet(d, &rank, &job);
      if (rep.target == Reply::Target::kNone) continue;
      FUZZ_CHECK(rep.key == c.key);
      FUZZ_CHECK(rep.packet_size() <=
                 wire::max_packet_size(c.slots.max_payload_bytes, c.slots.world_size));
    }
  }
  return 0;
}
