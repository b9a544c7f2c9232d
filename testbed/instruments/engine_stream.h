// What the in-process Engine benches (ina-engine-bench, ina-tree-engine-bench) feed the engine:
// job 1's configuration, a rank's HELLO, and the DATA packet stream: `rounds` blocks over a
// window of `slots` slots (alternating copies once the window wraps), one packet per rank per
// block, every payload `elems` words of 3. Every packet is sealed as a worker seals it: HELLO with
// the job's key, DATA with the incarnation's (WIRE.md, "Incarnations": incarnation_key_of); replies
// are sealed with theirs (encode_reply), as the backends seal them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <vector>

#include "aggregator/engine.h"
#include "ina/base/half.h"
#include "ina/protocol/codec.h"
#include "ina/protocol/fp8.h"
#include "ina/protocol/wire.h"

namespace ina::bench {

inline std::vector<uint8_t> encode_packet(const wire::Header& h, const int32_t* payload,
                                          const Key128& key) {
  std::vector<uint8_t> p(wire::packet_size(h.count, 4));
  wire::encode_header(h, p.data());
  if (h.count > 0) wire::store_words(p.data() + wire::kHeaderSize, payload, h.count);
  wire::seal(p, key);
  return p;
}
// The same with the payload as bytes already in wire order (the dtype streams below).
inline std::vector<uint8_t> encode_bytes(const wire::Header& h, const uint8_t* payload,
                                         size_t payload_bytes, const Key128& key) {
  std::vector<uint8_t> p(wire::kHeaderSize + payload_bytes);
  wire::encode_header(h, p.data());
  if (payload_bytes > 0) std::memcpy(p.data() + wire::kHeaderSize, payload, payload_bytes);
  wire::seal(p, key);
  return p;
}
// A reply as a backend sends it: header, payload (wire-order bytes), sealed with its job's key.
inline std::vector<uint8_t> encode_reply(const agg::Reply& r) {
  std::vector<uint8_t> p(r.packet_size());
  wire::encode_header(r.hdr, p.data());
  if (r.hdr.count > 0) std::memcpy(p.data() + wire::kHeaderSize, r.payload, r.payload_bytes());
  wire::seal(p, r.key);
  return p;
}

// Job 1 with `key`: `world` ranks, `slots` slots of up to `elems` elements.
inline agg::JobConfig job_config(uint32_t world, uint32_t slots, uint32_t elems, uint64_t key) {
  agg::JobConfig c;
  c.job = 1;
  c.key = Key128{key};
  c.slots.world_size = world;
  c.slots.num_slots = slots;
  c.slots.max_payload_bytes = static_cast<uint32_t>(static_cast<uint16_t>(elems)) * 4;
  return c;
}

// Rank `rank`'s HELLO to job 1 (incarnation nonce `seq`) for a job of `world` ranks.
inline std::vector<uint8_t> hello_packet(uint16_t rank, uint32_t world, uint64_t key,
                                         BlockSeq seq) {
  wire::Header h;
  h.job = 1;
  h.rank = rank;
  h.seq = seq;
  h.flags = wire::kFlagHello;
  h.count = 1;
  const auto w = static_cast<int32_t>(world);
  return encode_packet(h, &w, key);
}

// The key of the incarnation an engine (salt 0: EngineOptions' default) names when `world` ranks
// all HELLOed with `nonce`: what its workers seal DATA with (WIRE.md, "Incarnations").
inline Key128 incarnation_key_of(uint64_t key, uint32_t world, BlockSeq nonce) {
  const std::vector<BlockSeq> nonces(world, nonce);
  return wire::incarnation_key(Key128{key}, wire::incarnation_epoch(Key128{key}, 0, nonces));
}

// Round b's DATA header of rank r (int32 SUM of `elems` elements).
inline wire::Header data_header(uint32_t b, uint32_t r, uint32_t slots, uint32_t elems) {
  wire::Header h;
  h.job = 1;
  h.rank = static_cast<uint16_t>(r);
  h.slot = static_cast<uint16_t>(b % slots);
  h.shadow = (b / slots) % 2 == 1;
  h.seq = b + 1;
  h.count = static_cast<uint16_t>(elems);
  return h;
}

// Packet b * world + r is round b of rank r.
inline std::vector<std::vector<uint8_t>> data_stream(uint32_t rounds, uint32_t world,
                                                     uint32_t slots, uint32_t elems,
                                                     const Key128& key) {
  std::vector<std::vector<uint8_t>> pkts;
  pkts.reserve(size_t{rounds} * world);
  const std::vector<int32_t> payload(elems, 3);
  for (uint32_t b = 0; b < rounds; ++b) {
    for (uint32_t r = 0; r < world; ++r) {
      pkts.push_back(encode_packet(data_header(b, r, slots, elems), payload.data(), key));
    }
  }
  return pkts;
}

// The same stream in `dtype` (SUM): `elems` elements of the type per packet, the values a mix of
// magnitudes and signs (so a float block's exponent and rounding are exercised, not a constant).
inline std::vector<std::vector<uint8_t>> data_stream(uint32_t rounds, uint32_t world,
                                                     uint32_t slots, uint32_t elems, DType dtype,
                                                     const Key128& key) {
  std::vector<std::vector<uint8_t>> pkts;
  pkts.reserve(size_t{rounds} * world);
  const size_t esize = dtype_size(dtype);
  std::vector<uint8_t> payload(size_t{elems} * esize);
  for (uint32_t b = 0; b < rounds; ++b) {
    for (uint32_t r = 0; r < world; ++r) {
      for (uint32_t i = 0; i < elems; ++i) {
        const float x = static_cast<float>((i * 7 + r * 3 + b) % 41) * 0.37f - 7.0f;
        const int32_t v = static_cast<int32_t>((i * 7 + r * 3 + b) % 41) - 20;
        uint8_t* dst = payload.data() + size_t{i} * esize;
        switch (dtype) {
          case DType::kInt32: std::memcpy(dst, &v, 4); break;
          case DType::kFloat32: std::memcpy(dst, &x, 4); break;
          case DType::kFloat16: {
            const uint16_t h = float_to_half(x);
            std::memcpy(dst, &h, 2);
            break;
          }
          case DType::kBFloat16: {
            const uint16_t h = float_to_bf16(x);
            std::memcpy(dst, &h, 2);
            break;
          }
          case DType::kFloat8E4M3: dst[0] = float_to_e4m3(x); break;
          case DType::kFloat8E5M2: dst[0] = float_to_e5m2(x); break;
        }
      }
      wire::Header h = data_header(b, r, slots, elems);
      h.dtype = dtype;
      h.op = ReduceOp::kSum;
      h.elems = elems;
      pkts.push_back(encode_bytes(h, payload.data(), payload.size(), key));
    }
  }
  return pkts;
}

// Nanoseconds per call of tag(datagram) on a `bytes`-byte datagram that changes every call, the
// median of `reps` runs of `n` calls each.
template <typename Tag>
double ns_per_tag(size_t bytes, uint32_t n, uint32_t reps, Tag tag) {
  std::vector<uint8_t> d(bytes, 0x5A);
  std::vector<double> ns;
  uint64_t sink = 0;
  for (uint32_t rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t i = 0; i < n; ++i) {
      d[8] = static_cast<uint8_t>(i);  // a different datagram each time
      sink ^= tag(std::span<const uint8_t>(d));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ns.push_back(s * 1e9 / n);
  }
  volatile uint64_t keep = sink;  // the loop is not optimized away
  (void)keep;
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

inline constexpr Key128 kTagBenchKey{0x0123456789ABCDEFull, 0xFEDCBA9876543210ull};

// The packet tag's cost: wire::compute_tag (the key cache, the fastest path) when `path` is null,
// else packet_mac by that path under an expanded key.
inline double tag_ns_per_datagram(size_t bytes, const MacPath* path = nullptr, uint32_t n = 200000,
                                  uint32_t reps = 5) {
  if (path == nullptr) {
    return ns_per_tag(bytes, n, reps, [](auto d) { return wire::compute_tag(d, kTagBenchKey); });
  }
  const MacKey mk = expand_mac_key(kTagBenchKey);
  const MacPath p = *path;
  return ns_per_tag(bytes, n, reps,
                    [&](auto d) { return packet_mac(mk, d, wire::kOffTag / 8, p); });
}

// A received datagram's tag verified and its payload kept (the worker's RESULT into the user's
// buffer, the aggregator's float SUM words into slot storage, with their scan): nanoseconds per
// datagram of `bytes` bytes (float32 payload), the passes apart (tag, then codec::scan, then
// memcpy) or in one (wire::tag_ok_copy). The destination walks `dst_span` bytes (the size of a
// 1 KiB block: one block, in L1; 16 MiB: a collective's buffer, cold as at a rank). The thread's
// CPU time (not the wall clock: steadier on a shared machine), median of `reps` runs, the five
// ways alternated run by run (the fifth: the one pass told that its destination is a stream).
struct ReceivePassNs {
  double separate_copy = 0, fused_copy = 0, separate_scan = 0, fused_scan = 0;
  double stream_copy = 0;  // fused_copy into a stream (CopyDst::kStream: prefetched stores)
};
// The median of the runs' figures (the upper one of an even count).
inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
inline double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
inline ReceivePassNs receive_pass_ns(size_t bytes, size_t dst_span, uint32_t n = 20000,
                                     uint32_t reps = 41) {
  const size_t payload = bytes - wire::kHeaderSize;
  std::vector<uint8_t> d(bytes, 0x3A);  // finite float32 payload words
  std::vector<uint8_t> dst(std::max(dst_span, payload));
  const size_t slots = dst.size() / payload;
  std::vector<double> ns[5];
  uint64_t sink = 0;
  for (uint32_t rep = 0; rep < reps; ++rep) {
    for (int way = 0; way < 5; ++way) {
      const double t0 = thread_cpu_s();
      for (uint32_t i = 0; i < n; ++i) {
        d[8] = static_cast<uint8_t>(i);  // a different datagram each time
        uint8_t* out = dst.data() + (i % slots) * payload;
        const std::span<const uint8_t> dg(d);
        switch (way) {
          case 0:
            sink += wire::tag_ok(dg, kTagBenchKey);
            std::memcpy(out, d.data() + wire::kHeaderSize, payload);
            break;
          case 1: sink += wire::tag_ok_copy(dg, kTagBenchKey, out); break;
          case 2: {
            sink += wire::tag_ok(dg, kTagBenchKey);
            const codec::Scan sc = codec::scan(d.data() + wire::kHeaderSize, payload / 4,
                                               DType::kFloat32, ReduceOp::kSum);
            sink += static_cast<uint64_t>(sc.exp);
            std::memcpy(out, d.data() + wire::kHeaderSize, payload);
            break;
          }
          case 3: {
            MagnitudeCodes codes;
            sink += wire::tag_ok_copy(dg, kTagBenchKey, out, &codes);
            sink += static_cast<uint64_t>(
                codec::scan_of_codes(DType::kFloat32, codes.top, codes.nonfinite).exp);
            break;
          }
          case 4: sink += wire::tag_ok_copy(dg, kTagBenchKey, out, CopyDst::kStream); break;
        }
      }
      ns[way].push_back((thread_cpu_s() - t0) * 1e9 / n);
    }
  }
  volatile uint64_t keep = sink + dst[dst.size() / 2];
  (void)keep;
  return {median_of(ns[0]), median_of(ns[1]), median_of(ns[2]), median_of(ns[3]), median_of(ns[4])};
}

// A DATA datagram sealed over its payload in place (the worker: the header's tag over the user's
// buffer, then the kernel's copy of the same bytes), the payload at consecutive offsets of a
// `src_span`-byte buffer: nanoseconds per datagram of the seal alone, of a memcpy of the payload
// alone (what the kernel's copy costs when it is the first to read the bytes) and of the seal then
// the memcpy. Thread CPU time, median of `reps` runs, the three alternated.
struct SealWalkNs {
  double seal = 0, copy = 0, seal_then_copy = 0;
};
inline SealWalkNs seal_walk_ns(size_t payload, size_t src_span, uint32_t n = 20000,
                               uint32_t reps = 21) {
  std::vector<uint8_t> src(std::max(src_span, payload), 0x3A);
  std::vector<uint8_t> head(wire::kHeaderSize, 0x11), out(payload);
  const size_t slots = src.size() / payload;
  const MacKey mk = expand_mac_key(kTagBenchKey);
  std::vector<double> ns[3];
  uint64_t sink = 0;
  for (uint32_t rep = 0; rep < reps; ++rep) {
    for (int way = 0; way < 3; ++way) {
      const double t0 = thread_cpu_s();
      for (uint32_t i = 0; i < n; ++i) {
        const std::span<const uint8_t> body(src.data() + (i % slots) * payload, payload);
        if (way != 1) {
          head[8] = static_cast<uint8_t>(i);
          sink += packet_mac_parts(mk, head, body, wire::kOffTag / 8, best_mac_path());
        }
        if (way != 0) {
          std::memcpy(out.data(), body.data(), payload);
          sink += out[i % payload];
        }
      }
      ns[way].push_back((thread_cpu_s() - t0) * 1e9 / n);
    }
  }
  volatile uint64_t keep = sink;
  (void)keep;
  return {median_of(ns[0]), median_of(ns[1]), median_of(ns[2])};
}

// SipHash-2-4 over the whole datagram: wire v3's tag, for comparison.
inline double siphash_ns_per_datagram(size_t bytes, uint32_t n = 200000, uint32_t reps = 5) {
  return ns_per_tag(bytes, n, reps,
                    [](auto d) { return siphash24_zeroed(kTagBenchKey, d, wire::kOffTag / 8); });
}

}  // namespace ina::bench
