// Config::validate: the range and consistency checks every Config passes before a communicator
// is built (from the environment, the C ABI or code), each error naming the field, its INA_*
// variable, the value and the range. The parsing of the environment is config.cc's.
#include <string>

#include "ina/ina.hpp"
#include "ina/protocol/wire.h"
#include "worker/config_internal.h"
#include "worker/host/allreduce.h"
#include "worker/host/alltoall.h"
#include "worker/host/select.h"
#include "worker/rdma/verbs_proto.h"

namespace ina {

namespace worker {

Status validate_bypass(const Config& cfg, AggregatorTransport kind) {
  const bool dpdk = kind == AggregatorTransport::kDpdk;
  const std::string which = dpdk ? "INA_TRANSPORT=dpdk" : "INA_TRANSPORT=xdp";
  if (dpdk && cfg.dpdk_args.empty()) {
    return invalid_argument(
        "INA_TRANSPORT=dpdk needs INA_DPDK_ARGS (dpdk_args): the EAL arguments, e.g. \"--no-huge "
        "-m 256 --no-shconf --no-pci -l 0 --file-prefix w0 "
        "--vdev=net_memif0,role=client,socket=/run/ina.sock\"");
  }
  if (!dpdk && cfg.xdp_iface.empty()) {
    return invalid_argument(
        "INA_TRANSPORT=xdp needs INA_XDP_IFACE (xdp_iface): the interface to bind");
  }
  if (cfg.local_ip == 0) {
    return invalid_argument(which +
                            " needs INA_LOCAL_IP (local_ip): this worker's IPv4 address a.b.c.d " +
                            (dpdk ? "on the port"
                                  : "(not configured on the kernel interface; the transport "
                                    "answers ARP for it)"));
  }
  if (cfg.local_port == 0) {
    return invalid_argument(range_error("local_port", "INA_LOCAL_PORT", "0", "[1, 65535]"));
  }
  if (cfg.rank >= 0 &&
      static_cast<unsigned>(cfg.local_port) + static_cast<unsigned>(cfg.rank) > 65535) {
    return invalid_argument("INA_LOCAL_PORT=" + std::to_string(cfg.local_port) + " + rank " +
                            std::to_string(cfg.rank) + " exceeds 65535");
  }
  return ok_status();
}

}  // namespace worker

namespace {

using worker::kMaxBlockElems;
using worker::kMaxRetransmitUs;
using worker::kMaxTimeoutMs;
using worker::kMaxWindow;
using worker::kMaxWorldSize;
using worker::range_error;

}  // namespace

Status Config::validate() const {
  if (world_size < 1 || static_cast<uint32_t>(world_size) > kMaxWorldSize) {
    return invalid_argument(range_error("world_size", "INA_WORLD_SIZE", std::to_string(world_size),
                                        "[1, " + std::to_string(kMaxWorldSize) + "]"));
  }
  if (rank < 0 || rank >= world_size) {
    return invalid_argument(
        range_error("rank", "INA_RANK", std::to_string(rank),
                    "[0, world_size) = [0, " + std::to_string(world_size) + ")"));
  }
  if (aggregator_host.empty()) {
    return invalid_argument(
        "invalid aggregator_host \"\": must name the aggregator (INA_AGGREGATOR)");
  }
  if (aggregator_port == 0) {
    return invalid_argument(range_error("aggregator_port", "INA_AGGREGATOR", "0", "[1, 65535]"));
  }
  if (aggregators.size() > worker::kMaxShards) {
    return invalid_argument(range_error("aggregators (shards)", "INA_AGGREGATOR",
                                        std::to_string(aggregators.size()),
                                        "[0, " + std::to_string(worker::kMaxShards) + "]"));
  }
  for (size_t i = 0; i < aggregators.size(); ++i) {
    const AggregatorAddress& a = aggregators[i];
    const std::string field = "aggregators[" + std::to_string(i) + "]";
    if (a.host.empty()) {
      return invalid_argument("invalid " + field +
                              ".host \"\": must name the aggregator of shard " + std::to_string(i) +
                              " (INA_AGGREGATOR)");
    }
    if (a.port == 0) {
      return invalid_argument(range_error(field + ".port", "INA_AGGREGATOR", "0", "[1, 65535]"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (aggregators[j].host == a.host && aggregators[j].port == a.port) {
        return invalid_argument("invalid " + field + " " + a.host + ":" + std::to_string(a.port) +
                                ": the same aggregator as aggregators[" + std::to_string(j) +
                                "] (each shard needs its own; INA_AGGREGATOR)");
      }
    }
  }
  if (block_elems < 1 || block_elems > kMaxBlockElems) {
    return invalid_argument(range_error("block_elems", "INA_BLOCK_ELEMS",
                                        std::to_string(block_elems),
                                        "[1, " + std::to_string(kMaxBlockElems) + "]"));
  }
  if (window < 1 || window > kMaxWindow) {
    return invalid_argument(range_error("window", "INA_WINDOW", std::to_string(window),
                                        "[1, " + std::to_string(kMaxWindow) + "]"));
  }
  if (timeout.count() <= 0 || static_cast<uint64_t>(timeout.count()) > kMaxTimeoutMs) {
    return invalid_argument(range_error("timeout", "INA_TIMEOUT_MS",
                                        std::to_string(timeout.count()) + " ms",
                                        "[1, " + std::to_string(kMaxTimeoutMs) + "] ms"));
  }
  if (retransmit.count() <= 0 || static_cast<uint64_t>(retransmit.count()) > kMaxRetransmitUs) {
    return invalid_argument(range_error("retransmit", "INA_RETRANSMIT_US",
                                        std::to_string(retransmit.count()) + " us",
                                        "[1, " + std::to_string(kMaxRetransmitUs) + "] us"));
  }
  if (device_chunk_elems > (uint64_t{1} << 32)) {
    return invalid_argument(range_error("device_chunk_elems", "INA_DEVICE_CHUNK_ELEMS",
                                        std::to_string(device_chunk_elems),
                                        "0 (default) or [1, 2^32]"));
  }
  if (device_buffers < 1 || device_buffers > 16) {
    return invalid_argument(range_error("device_buffers", "INA_DEVICE_BUFFERS",
                                        std::to_string(device_buffers), "[1, 16]"));
  }
  if (host_only && store.empty() && external_store == nullptr) {
    return invalid_argument(
        "host_only (INA_TRANSPORT=host) needs a rendezvous store: set INA_STORE=host:port or "
        "MASTER_ADDR and MASTER_PORT");
  }
  if (fallback != FallbackMode::kExact && fallback != FallbackMode::kFloat) {
    return invalid_argument("invalid fallback: must be exact or float (INA_FALLBACK)");
  }
  if (!cost_model.empty())
    INA_RETURN_IF_ERROR(host::parse_cost_model(cost_model, "cost_model (INA_COST_MODEL)").status());
  if (transport > AggregatorTransport::kHost) {
    return invalid_argument("invalid transport " + std::to_string(static_cast<int>(transport)) +
                            ": must be auto, udp, dpdk, xdp or host (INA_TRANSPORT)");
  }
  if (!host_algorithm.empty() && !host::parse_algorithm(host_algorithm)) {
    return invalid_argument("invalid host_algorithm \"" + host_algorithm +
                            "\": must be ring, hd or tree, or empty for the cost model (INA_ALGO)");
  }
  if (!alltoall_algorithm.empty() && !host::parse_alltoall_algorithm(alltoall_algorithm)) {
    return invalid_argument("invalid alltoall_algorithm \"" + alltoall_algorithm +
                            "\": must be pairwise, bruck or hier, or empty for the cost model "
                            "(INA_A2A_ALGO)");
  }
  if (alltoall_group < 0) {
    return invalid_argument("invalid alltoall_group " + std::to_string(alltoall_group) +
                            ": must be >= 0 (INA_A2A_GROUP)");
  }
  if (!verbs_device.empty()) {
    Result<rdma::VerbsSelection> sel = rdma::parse_verbs_selection(verbs_device.c_str(), nullptr);
    if (!sel.ok()) {
      return invalid_argument("invalid verbs_device \"" + verbs_device +
                              "\": must be an RDMA device name, optionally with :port (1 .. 255), "
                              "e.g. mlx5_0 or mlx5_0:1 (INA_VERBS_DEVICE)");
    }
  }
  if (verbs_gid_index < 0 || verbs_gid_index > 255) {
    return invalid_argument(range_error("verbs_gid_index", "INA_VERBS_GID_INDEX",
                                        std::to_string(verbs_gid_index), "[0, 255]"));
  }
  // What the kernel-bypass transport needs, unless the job never uses it (host_only).
  if (!host_only &&
      (transport == AggregatorTransport::kDpdk || transport == AggregatorTransport::kXdp)) {
    INA_RETURN_IF_ERROR(worker::validate_bypass(*this, transport));
  }
  struct Pct {
    const char* field;
    const char* env;
    double v;
  };
  for (const Pct& p :
       {Pct{"fault.drop_send_percent", "INA_TEST_DROP_PERCENT", fault.drop_send_percent},
        Pct{"fault.drop_recv_percent", "INA_TEST_DROP_PERCENT", fault.drop_recv_percent},
        Pct{"fault.dup_send_percent", "INA_TEST_DUP_PERCENT", fault.dup_send_percent},
        Pct{"fault.straggle_percent", "INA_TEST_STRAGGLE", fault.straggle_percent}}) {
    if (!(p.v >= 0.0 && p.v <= 100.0)) {
      return invalid_argument(range_error(p.field, p.env, std::to_string(p.v), "[0, 100]"));
    }
  }
  return ok_status();
}

}  // namespace ina
