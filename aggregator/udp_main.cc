// The `--backend udp` path of ina-aggregator (see udp_main.h).
#include "aggregator/udp_main.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "aggregator/port_file.h"
#include "aggregator/stamp.h"
#include "ina/base/log.h"

namespace ina::agg {

int run_udp_aggregator(const UdpCliOptions& o, const std::atomic<bool>& stop) {
  auto agg = UdpAggregator::create(o.udp, o.jobs);
  if (!agg.ok()) {
    INA_ERROR("aggregator", "%s", agg.status().to_string().c_str());
    return 1;
  }
  UdpAggregator& a = **agg;
  if (!o.port_file.empty() && !write_port_file(o.port_file, a.port())) {
    INA_ERROR("aggregator", "cannot write --port-file %s: %s", o.port_file.c_str(),
              std::strerror(errno));
    return 1;
  }
#if INA_HAVE_CONTROLLER
  std::unique_ptr<ControlAgent> control;
  if (o.agent) {
    AgentOptions ao = o.agent->agent;
    ao.data_port = a.port();
    control = agent_with_port_file(ControlAgent::start(ao, &a), o.agent->http_port_file);
    if (control == nullptr) return 1;
  }
#endif
  // The start lines on stdout carry the log lines' time stamp too.
  char stamp[ina::log::kTimestampLen + 1];
  format_now(stamp);
  const char* gro = a.gro_enabled() ? "on" : "off";
  const char* gso = a.gso_enabled() ? "on" : "off";
  if (o.jobs.empty()) {
    std::printf(
        "%s ina-aggregator listening on %s:%u jobs from the controller, block %u gro %s "
        "gso %s threads %u\n",
        stamp, o.udp.bind_host.c_str(), unsigned{a.port()}, o.udp.max_payload_bytes / 4, gro, gso,
        a.threads());
  } else {
    const JobConfig& job = o.jobs.front();
    std::printf(
        "%s ina-aggregator listening on %s:%u job %u world %u slots %u block %u gro %s gso %s "
        "threads %u\n",
        stamp, o.udp.bind_host.c_str(), unsigned{a.port()}, unsigned{job.job}, job.slots.world_size,
        job.slots.num_slots, job.slots.max_payload_bytes / 4, gro, gso, a.threads());
    if (job.is_leaf()) {
      std::printf("%s tree leaf %u of parent %s: global ranks [%u, %u)\n", stamp,
                  job.tree.child_index, job.tree.parent.c_str(), job.tree.rank_base,
                  job.tree.rank_base + job.tree.local_ranks);
    }
  }
  std::fflush(stdout);

  const Status st = a.run(stop);
  std::printf("%s", a.format_counters().c_str());
  std::fflush(stdout);
  if (!st.ok()) {
    INA_ERROR("aggregator", "%s", st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace ina::agg
