// INA_HOST_TRANSPORT in the communicator (suite rdma; runs with or without an RDMA device):
// threads as ranks create host-only communicators through a TcpStore on 127.0.0.1.
//   auto   works everywhere (verbs where a device exists, else TCP) and gives correct results;
//   tcp    always the TCP mesh;
//   verbs  without a device (or without the rdma feature) fails at creation naming the reason,
//          with one it runs the same collectives over verbs.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "../free_port.h"
#include "ina/ina.hpp"
#include "worker/plugin/probes.h"

namespace ina {
namespace {

Config host_config(int rank, int world, uint16_t store_port, HostTransport t) {
  Config c;
  c.rank = rank;
  c.world_size = world;
  c.store = "127.0.0.1:" + std::to_string(store_port);
  c.host_only = true;
  c.host_transport = t;
  c.timeout = std::chrono::milliseconds(20000);
  return c;
}

// Runs an AllReduce and an AllToAll on `world` host-only communicators; returns per-rank errors.
std::vector<std::string> run(int world, HostTransport t) {
  const uint16_t port = ina::testing::free_loopback_port();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = Communicator::create(host_config(r, world, port, t));
      if (!comm.ok()) {
        errors[r] = comm.status().to_string();
        return;
      }
      const size_t n = 70001;
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i % 13) * (r + 1));
      Status s = (*comm)->allreduce(v.data(), v.data(), n, DType::kFloat32, ReduceOp::kSum);
      if (!s.ok()) {
        errors[r] = "allreduce: " + s.to_string();
        return;
      }
      const float f = static_cast<float>(world * (world + 1) / 2);
      for (size_t i = 0; i < n; ++i)
        if (v[i] != static_cast<float>(i % 13) * f) {
          errors[r] = "allreduce: element " + std::to_string(i) + " wrong";
          return;
        }
      std::vector<int32_t> a(world * 3), b(world * 3, -1);
      for (int j = 0; j < world * 3; ++j) a[j] = r * 100 + j;
      s = (*comm)->alltoall(a.data(), b.data(), 3, DType::kInt32);
      if (!s.ok()) {
        errors[r] = "alltoall: " + s.to_string();
        return;
      }
      for (int j = 0; j < world; ++j)
        for (int i = 0; i < 3; ++i)
          if (b[j * 3 + i] != j * 100 + r * 3 + i) errors[r] = "alltoall: wrong block";
    });
  }
  for (auto& th : threads) th.join();
  return errors;
}

TEST(HostTransport, AutoAndTcpWorkEverywhere) {
  for (HostTransport t : {HostTransport::kAuto, HostTransport::kTcp}) {
    const auto errors = run(3, t);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }
}

TEST(HostTransport, VerbsRunsOrNamesWhyNot) {
  const features::Probe rdma = features::probe_rdma();
  const auto errors = run(2, HostTransport::kVerbs);
  if (rdma.built && rdma.usable) {
    for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
    return;
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("INA_HOST_TRANSPORT=verbs: RDMA verbs unavailable: "),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find(rdma.detail), std::string::npos) << errors[r];
  }
  std::printf("verbs unavailable here, as expected: %s\n", errors[0].c_str());
}

}  // namespace
}  // namespace ina
