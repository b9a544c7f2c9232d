// ina-tree-engine-bench: what a two-level aggregation tree costs in aggregator CPU, in process (no
// sockets): the same stream of 8-rank blocks through one flat Engine and through two leaf Engines
// (4 ranks each) and a root Engine, in one run (configurations interleaved, median of the
// repetitions). The tree's extra work is the leaves' partials to the root (encoded as the backend
// would), the root's result encoded back to each leaf and the leaves' multicast; every reply
// addressed to ranks is encoded once, as the UDP backend does. Reported per round (one block of
// every rank): total CPU of all aggregators, and the busiest single aggregator.
//
//   ina-tree-engine-bench [--elems 256] [--slots 64] [--rounds 4000] [--reps 5]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "aggregator/engine.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#include "testbed/instruments/engine_stream.h"

namespace {

using namespace ina;
using Clock = std::chrono::steady_clock;
constexpr uint64_t kKey = 0x0123456789ABCDEFull;
constexpr uint32_t kWorld = 8;
constexpr uint32_t kPerLeaf = 4;

// Encodes a reply into `buf` (reused: no allocation once it is large enough).
std::span<const uint8_t> encode_into(const agg::Reply& r, std::vector<uint8_t>& buf) {
  const size_t n = r.packet_size();
  if (buf.size() < n) buf.resize(n);
  wire::encode_header(r.hdr, buf.data());
  if (r.payload != nullptr)
    std::memcpy(buf.data() + wire::kHeaderSize, r.payload, r.payload_bytes());
  wire::seal(std::span<uint8_t>(buf.data(), n), r.key);  // as the backends seal every reply
  return {buf.data(), n};
}

std::vector<uint8_t> hello(uint16_t rank) {
  return bench::hello_packet(rank, kWorld, kKey, 77 + rank);
}

agg::JobConfig job(uint32_t world, uint32_t slots, uint32_t elems) {
  return bench::job_config(world, slots, elems, kKey);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-tree-engine-bench: aggregator CPU per round, flat vs a two-level tree"};
  app.set_version_flag("--version", "ina-tree-engine-bench " INA_VERSION);
  uint32_t elems = 256, slots = 64, rounds = 4000, reps = 5;
  app.add_option("--elems", elems)->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--slots", slots)->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--rounds", rounds, "block rounds per measurement")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--reps", reps)->check(CLI::Range(1, 100))->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  // The workers' packets: round b, rank r, sealed with the key of the incarnation they joined
  // (WIRE.md "Incarnations"; the engines' salt is 0): the flat job's (every rank's nonce), or in
  // the tree their leaf's (its ranks' nonces).
  std::vector<BlockSeq> nonces(kWorld);
  for (uint32_t r = 0; r < kWorld; ++r) nonces[r] = 77 + r;
  auto key_of = [&](std::span<const BlockSeq> n) {
    return wire::incarnation_key(Key128{kKey}, wire::incarnation_epoch(Key128{kKey}, 0, n));
  };
  const std::vector<std::vector<uint8_t>> pkts =
      bench::data_stream(rounds, kWorld, slots, elems, key_of(nonces));
  std::vector<std::vector<uint8_t>> tree_pkts = pkts;
  const Key128 leaf_key[2] = {key_of(std::span(nonces).first(kPerLeaf)),
                              key_of(std::span(nonces).subspan(kPerLeaf, kPerLeaf))};
  for (size_t i = 0; i < tree_pkts.size(); ++i) {
    wire::seal(tree_pkts[i], leaf_key[(i % kWorld) / kPerLeaf]);
  }
  std::vector<double> flat_ns, tree_total_ns, tree_leaf_ns, tree_root_ns;
  std::vector<uint8_t> buf, down;
  int32_t rank;
  JobId jid;
  for (uint32_t rep = 0; rep < reps; ++rep) {
    {  // flat
      agg::Engine e;
      if (!e.add_job(job(kWorld, slots, elems)).ok()) return 1;
      for (uint16_t r = 0; r < kWorld; ++r) e.on_packet(hello(r), &rank, &jid);
      const auto t0 = Clock::now();
      for (const auto& p : pkts) {
        const agg::Reply rep_ = e.on_packet(p, &rank, &jid);
        if (rep_.target != agg::Reply::Target::kNone) encode_into(rep_, buf);
      }
      const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      if (e.counters().completed != rounds) {
        std::fprintf(stderr, "bench: flat completed %llu of %u rounds\n",
                     static_cast<unsigned long long>(e.counters().completed), rounds);
        return 1;
      }
      flat_ns.push_back(ns / rounds);
    }
    {  // tree: leaves 0 and 1, root
      agg::Engine leaf[2];
      agg::Engine root;
      for (uint32_t c = 0; c < 2; ++c) {
        agg::JobConfig lc = job(kWorld, slots, elems);
        lc.tree.role = agg::TreeRole::kLeaf;
        lc.tree.rank_base = c * kPerLeaf;
        lc.tree.local_ranks = kPerLeaf;
        lc.tree.child_index = c;
        lc.tree.parent_world = 2;
        lc.tree.parent = "root:1";
        if (!leaf[c].add_job(lc).ok()) return 1;
      }
      if (!root.add_job(job(2, slots, elems)).ok()) return 1;
      // Join: leaves' HELLOs to the root, the root's WELCOME to both leaves.
      agg::Reply up[2];
      for (uint16_t r = 0; r < kWorld; ++r) {
        const agg::Reply x = leaf[r / kPerLeaf].on_packet(hello(r), &rank, &jid);
        if (x.target == agg::Reply::Target::kParent) up[r / kPerLeaf] = x;
      }
      std::vector<uint8_t> h0 = bench::encode_reply(up[0]);
      root.on_packet(h0, &rank, &jid);
      std::vector<uint8_t> h1 = bench::encode_reply(up[1]);
      const agg::Reply w = root.on_packet(h1, &rank, &jid);
      std::vector<uint8_t> wb = bench::encode_reply(w);
      // The root's notice: each leaf HELLOs again and adopts the WELCOME naming its HELLO.
      for (auto& l : leaf) {
        const agg::Reply again = l.on_packet(wb, &rank, &jid);
        std::vector<uint8_t> hb = bench::encode_reply(again);
        const agg::Reply own = root.on_packet(hb, &rank, &jid);
        std::vector<uint8_t> ob = bench::encode_reply(own);
        l.on_packet(ob, &rank, &jid);
      }
      if (!leaf[0].job_ready(1) || !leaf[1].job_ready(1)) {
        std::fprintf(stderr, "bench: the tree did not join\n");
        return 1;
      }
      double leaf_ns = 0, root_ns = 0;
      const auto t0 = Clock::now();
      for (uint32_t b = 0; b < rounds; ++b) {
        for (uint32_t c = 0; c < 2; ++c) {
          const auto tl = Clock::now();
          std::span<const uint8_t> partial;
          for (uint32_t r = c * kPerLeaf; r < (c + 1) * kPerLeaf; ++r) {
            const agg::Reply x = leaf[c].on_packet(tree_pkts[size_t{b} * kWorld + r], &rank, &jid);
            if (x.target == agg::Reply::Target::kParent) partial = encode_into(x, buf);
          }
          const auto tr = Clock::now();
          leaf_ns += std::chrono::duration<double, std::nano>(tr - tl).count();
          const agg::Reply res = root.on_packet(partial, &rank, &jid);
          if (res.target == agg::Reply::Target::kAllRanks) encode_into(res, down);
          root_ns += std::chrono::duration<double, std::nano>(Clock::now() - tr).count();
        }
        for (uint32_t c = 0; c < 2; ++c) {  // the root's result down, multicast by each leaf
          const auto tl = Clock::now();
          const agg::Reply m = leaf[c].on_packet(down, &rank, &jid);
          if (m.target == agg::Reply::Target::kAllRanks) encode_into(m, buf);
          leaf_ns += std::chrono::duration<double, std::nano>(Clock::now() - tl).count();
        }
      }
      const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      if (root.counters().completed != rounds || leaf[0].counters().parent_results != rounds ||
          leaf[1].counters().parent_results != rounds) {
        std::fprintf(stderr, "bench: tree completed %llu of %u rounds\n",
                     static_cast<unsigned long long>(root.counters().completed), rounds);
        return 1;
      }
      tree_total_ns.push_back(ns / rounds);
      tree_leaf_ns.push_back(leaf_ns / 2 / rounds);
      tree_root_ns.push_back(root_ns / rounds);
    }
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double f = med(flat_ns);
  const double t = med(tree_total_ns);
  std::printf("8 ranks, %u elements per packet, %u slots, %u rounds per run, median of %u\n", elems,
              slots, rounds, reps);
  std::printf("  flat: one aggregator           %8.0f ns/round\n", f);
  std::printf("  tree: all three aggregators    %8.0f ns/round  (%+5.1f%% vs flat)\n", t,
              (t / f - 1) * 100);
  std::printf("        one leaf (4 ranks)       %8.0f ns/round  (%+5.1f%% vs flat)\n",
              med(tree_leaf_ns), (med(tree_leaf_ns) / f - 1) * 100);
  std::printf("        root (2 leaves)          %8.0f ns/round  (%+5.1f%% vs flat)\n",
              med(tree_root_ns), (med(tree_root_ns) / f - 1) * 100);
  return 0;
}
