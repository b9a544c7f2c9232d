// ina-floor-bench: the kernel's CPU cost for the bytes of one INA AllReduce (udp_floor.h): a
// UDP_SEGMENT sender and a UDP_GRO receiver on loopback move the datagrams the collective moves,
// datagrams of the job's size (40-byte header + --block-elems 4-byte words), and the tool prints
// the CPU seconds (user + system) per datagram, per GB moved and per GB reduced, for the ranks
// (each sends D and receives D) and for the aggregator (receives N D, sends N D). ina-bench
// measures the same floor and prints its own CPU per GB reduced beside it.
//
//   ina-floor-bench [--workers 4] [--bytes 16M] [--block-elems 2048] [--iters 16]
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <string>

#include "bench_common.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#include "udp_floor.h"

int main(int argc, char** argv) {
  int workers = 4;
  std::string bytes_text = "16M";
  uint32_t block_elems = 2048;
  int iters = 16;
  CLI::App app{"ina-floor-bench: the kernel's CPU per GB for an INA AllReduce's datagrams"};
  app.set_version_flag("--version", "ina-floor-bench " INA_VERSION);
  app.add_option("--workers", workers, "ranks N")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--bytes", bytes_text, "the AllReduce's size D (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("--block-elems", block_elems, "4-byte words per datagram (1..16384)")
      ->check(CLI::Range(1u, 16384u))
      ->capture_default_str();
  app.add_option("--iters", iters, "AllReduces' worth of datagrams moved")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  size_t bytes = 0;
  if (bench_parse_size(bytes_text.c_str(), &bytes) != 0 || bytes == 0) {
    std::fprintf(stderr, "ina-floor-bench: bad --bytes '%s'\n", bytes_text.c_str());
    return 1;
  }
  const size_t payload = size_t{block_elems} * 4;
  const size_t datagram = ina::wire::kHeaderSize + payload;
  const uint64_t per_rank = bench::datagrams_per_rank(bytes, payload);
  // One direction of the collective (N ranks' datagrams up); the other moves as many.
  const uint64_t count = per_rank * static_cast<uint64_t>(workers) * static_cast<uint64_t>(iters);
  const bench::UdpFloor f = bench::measure_udp_floor(datagram, count);
  if (!f.error.empty()) {
    std::fprintf(stderr, "ina-floor-bench: %s\n", f.error.c_str());
    return 1;
  }
  const double gb_reduced = static_cast<double>(bytes) * iters / 1e9;
  // Ranks: each sends and receives per_rank datagrams per AllReduce; the aggregator the same
  // N times over.
  const double side = f.per_datagram_s() * static_cast<double>(per_rank) * workers / (bytes / 1e9);
  std::printf(
      "# ina-floor-bench: %d ranks, AllReduce of %zu B, %u words per datagram (%zu B), "
      "%d AllReduces' worth (%.3f GB reduced)\n",
      workers, bytes, block_elems, datagram, iters, gb_reduced);
  std::printf("# loopback, UDP_SEGMENT %s, UDP_GRO %s; datagrams sent %llu, received %llu\n",
              f.gso ? "on" : "off", f.gro ? "on" : "off", static_cast<unsigned long long>(f.sent),
              static_cast<unsigned long long>(f.received));
  std::printf("# CPU: send %.3f s, receive %.3f s; %.3f us per datagram; %.3f s per GB moved\n",
              f.send_cpu_s, f.recv_cpu_s, f.per_datagram_s() * 1e6, f.per_gb_s());
  std::printf("# floor, CPU s per GB reduced: ranks %.3f, aggregator %.3f, total %.3f\n", side,
              side, 2 * side);
  return f.received == f.sent ? 0 : 1;
}
