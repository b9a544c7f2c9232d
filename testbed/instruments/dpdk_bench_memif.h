// ina-dpdk-bench's two-process mode over net_memif (see dpdk_bench_memif.cc): a generator process
// (memif client) drives a device under test (memif server) that is either the DPDK aggregator
// (this binary in its aggregator role) or dpdk-testpmd forwarding (io or macswap); each process on
// its own CPU. The DUT copies every frame in and out of the shared buffers; the generator does so
// too only in copy mode (--gen-copy, or without hugepages), else it runs memif's zero-copy client.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "aggregator/dpdk_backend.h"

namespace ina::bench {

// Arguments of the child roles (ina-dpdk-bench --role gen|agg ...), also the sweep's settings.
struct MemifArgs {
  std::string sock;  // memif control socket path
  uint16_t elems = 256;
  uint32_t world = 4;
  uint32_t slots = 128;
  double seconds = 1.0;          // measured window of the generator
  int cpu = 0;                   // the CPU this process's lcores are pinned to
  std::string mem = "auto";      // huge | nohuge | auto
  uint16_t bsize = 0;            // memif buffer size; 0: the frame size rounded up to 128 B (one
                                 // buffer per frame), at least 2048
  bool to_agg = true;            // generator: the peer is the aggregator (join first) or testpmd
  std::string results = "auto";  // aggregator: results as chains, copies or auto (--results)
  std::string dtype = "int32";   // the DATA frames' type: int32 or float32
  bool no_tag = false;           // aggregator: skip the tag check (its cost: --no-tag)
  bool stages = false;           // aggregator: cycles per frame by stage (--stages)
  bool gen_zero_copy = true;     // generator: memif zero-copy client where it can be (hugepages):
                                 // the server copies, the generator does not
};

// --results and --dtype as the aggregator and the frames take them.
agg::DpdkOptions::Fanout parse_fanout(const std::string& s);
DType parse_dtype(const std::string& s);

// The roles; each returns the process exit status.
int memif_generator(const MemifArgs& a);
int memif_aggregator(const MemifArgs& a);

struct MemifRow {
  bool ok = false;
  std::string error;
  double seconds = 0;     // generator's measured window
  uint64_t sent = 0;      // frames the generator sent in the window
  uint64_t received = 0;  // frames it received back (results, or forwarded frames)
  double full_share = 0;  // share of the generator's tx bursts that found the ring full
  double gen_cpu_s = 0;   // generator thread CPU in the window
  double dut_cpu_s = -1;  // DUT lcore thread CPU in the window (from /proc)
  // Aggregator DUT only: its own counters over its whole run.
  uint64_t dut_packets_in = 0, dut_completed = 0, dut_tx = 0, dut_tx_dropped = 0, dut_no_mbuf = 0;
  uint64_t dut_idle_polls = 0, dut_polls = 0, dut_malformed = 0;
  uint64_t dut_hellos = 0;  // HELLOs among dut_packets_in (repeated until answered)
  int dut_chains = -1;      // aggregator: 1 results as chains, 0 as copies (DpdkOptions::fanout)
  // TSC cycles per frame of the DUT's busy loop iterations (rx to tx, bursts that had frames):
  // the aggregator's own count, testpmd's --record-core-cycles; -1 when not known.
  double dut_cycles = -1;
  // Aggregator DUT with --stages: TSC cycles per received frame in its rx bursts, its processing
  // and its tx bursts (DpdkLoopCounters::rx_tsc, work_tsc, tx_tsc).
  double dut_rx_cycles = -1, dut_work_cycles = -1, dut_tx_cycles = -1;
};

// One measurement: spawns the DUT ("agg" or a testpmd forward mode: "io", "macswap"), then the
// generator (argv0 is this binary), collects both. `testpmd` is the testpmd binary.
MemifRow memif_measure(const std::string& argv0, const std::string& testpmd, const std::string& dut,
                       MemifArgs a, int gen_cpu, int dut_cpu);

size_t memif_frame_len(uint16_t elems);
// testpmd's "CPU cycles/packet" (--record-core-cycles) from its log; -1 when absent.
double testpmd_cycles_per_packet(const std::string& log);
uint16_t memif_bsize(const MemifArgs& a);
// Whether the generator runs memif's zero-copy client: asked for and on hugepages (the mode shares
// its hugepage files with the server).
bool memif_gen_zero_copy(const MemifArgs& a);

}  // namespace ina::bench
