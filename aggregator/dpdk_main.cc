// The `--backend dpdk` path of ina-aggregator (see dpdk_main.h).
#include "aggregator/dpdk_main.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "aggregator/dpdk_backend.h"
#include "aggregator/stamp.h"
#include "ina/base/log.h"
#include "ina/protocol/frame.h"

namespace ina::agg {

int run_dpdk_aggregator(const DpdkCliOptions& o, const std::atomic<bool>& stop) {
  DpdkOptions d;
  d.port = o.port;
  d.udp_port = o.udp_port;
  d.burst = o.burst;
  d.rx_queues = o.rx_queues;
  d.slot_capacity = o.slot_capacity;
  d.max_payload_bytes = o.max_payload_bytes;
  // Snapshots every 100 ms for the agent (heartbeats, /metrics); none without one.
  std::chrono::milliseconds snapshot_every{0};
#if INA_HAVE_CONTROLLER
  if (o.agent) {
    d.telemetry = true;
    snapshot_every = std::chrono::milliseconds(100);
  }
#endif
  auto ip = frame::parse_ipv4(o.ip);
  if (o.ip.empty() || !ip.ok()) {
    std::fprintf(stderr, "ina-aggregator: --ip: %s\n",
                 o.ip.empty() ? "required with --backend dpdk (our IPv4 address, a.b.c.d)"
                              : ip.status().to_string().c_str());
    return 1;
  }
  d.ip = *ip;
  if (!o.mac.empty()) {
    auto mac = frame::parse_mac(o.mac);
    if (!mac.ok()) {
      std::fprintf(stderr, "ina-aggregator: --mac: %s\n", mac.status().to_string().c_str());
      return 1;
    }
    d.mac = *mac;
    d.mac_set = true;
  }
  std::vector<std::string> eal = {"ina-aggregator"};
  eal.insert(eal.end(), o.eal_args.begin(), o.eal_args.end());
  const Status est = dpdk_eal_init(eal);
  if (!est.ok()) {
    INA_ERROR("aggregator", "%s", est.to_string().c_str());
    return est.code() == StatusCode::kUnavailable ? 77 : 1;
  }
  int code = 0;
  {
    auto agg = DpdkAggregator::create(d, o.jobs);
    if (!agg.ok()) {
      INA_ERROR("aggregator", "%s", agg.status().to_string().c_str());
      dpdk_eal_cleanup();
      return 1;
    }
    DpdkAggregator& a = **agg;
    const Status st = a.start();
    if (!st.ok()) {
      INA_ERROR("aggregator", "%s", st.to_string().c_str());
      code = 1;
    } else {
#if INA_HAVE_CONTROLLER
      std::unique_ptr<ControlAgent> agent;
      if (o.agent) {
        AgentOptions ao = o.agent->agent;
        ao.data_port = o.udp_port;
        if (ao.advertise_host.empty()) ao.advertise_host = o.ip;
        AgentTarget target;
        target.snapshot = [&a] { return a.snapshot(); };
        target.set_jobs = [&a](std::vector<JobConfig> jobs) { a.set_jobs(std::move(jobs)); };
        agent = agent_with_port_file(ControlAgent::start(ao, std::move(target)),
                                     o.agent->http_port_file);
        if (agent == nullptr) code = 1;
      }
#endif
      char stamp[ina::log::kTimestampLen + 1];
      format_now(stamp);
      if (o.jobs.empty()) {
        std::printf(
            "%s ina-aggregator (dpdk) on port %u %s %s:%u jobs from the controller, block %u "
            "lcores %u rx queues %u\n",
            stamp, unsigned{a.port_id()}, frame::format_mac(a.local().mac).c_str(),
            frame::format_ipv4(a.local().ip).c_str(), unsigned{a.local().udp_port},
            unsigned{o.max_payload_bytes / 4}, a.lcores(), unsigned{a.rx_queues()});
      } else {
        const JobConfig& job = o.jobs.front();
        std::printf(
            "%s ina-aggregator (dpdk) on port %u %s %s:%u job %u world %u slots %u block %u "
            "lcores %u rx queues %u\n",
            stamp, unsigned{a.port_id()}, frame::format_mac(a.local().mac).c_str(),
            frame::format_ipv4(a.local().ip).c_str(), unsigned{a.local().udp_port},
            unsigned{job.job}, job.slots.world_size, job.slots.num_slots,
            unsigned{job.slots.max_payload_bytes / 4}, a.lcores(), unsigned{a.rx_queues()});
      }
      std::fflush(stdout);
      using Clock = std::chrono::steady_clock;
      auto next = Clock::now() + std::chrono::milliseconds(o.stats_ms);
      while (code == 0 && !stop.load(std::memory_order_relaxed)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        a.service(snapshot_every);
        if (o.stats_ms > 0 && Clock::now() >= next) {
          next += std::chrono::milliseconds(o.stats_ms);
          std::printf("%s", a.format_lcore_counters().c_str());
          std::fflush(stdout);
        }
      }
#if INA_HAVE_CONTROLLER
      agent.reset();  // no more heartbeats or set_jobs
#endif
      a.stop();  // loops end, then the port stops
      std::printf("%s", a.format_counters().c_str());
      std::fflush(stdout);
    }
  }  // the port is closed and the pool freed here
  dpdk_eal_cleanup();
  return code;
}

}  // namespace ina::agg
