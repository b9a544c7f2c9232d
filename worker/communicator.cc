// ina::Communicator: validates arguments at the API boundary, then runs each AllReduce on the path
// the path policy (path_policy.h: in-network, or the host path after a failure), and the host
// collectives on a TCP or RDMA verbs mesh (INA_HOST_TRANSPORT; host only, the fallback of a lost
// aggregator, and the collectives no aggregator does: allgather, reduce_scatter, broadcast,
// barrier, alltoall(v)).
//
// The host mesh is connected in mesh_connect.cc; the kernel UDP transports to the aggregators are
// made in transport/udp_factory.cc, the kernel-bypass ones by their plugins (plugin_loader.h).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ina/base/half.h"
#include "ina/base/log.h"
#include "ina/ina.hpp"
#include "ina/protocol/codec.h"
#include "ina/protocol/fp8.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#include "worker/admission.h"
#include "worker/communicator_impl.h"
#include "worker/config_internal.h"
#include "worker/device/async_communicator.h"
#include "worker/host/allgather.h"
#include "worker/host/allreduce.h"
#include "worker/host/alltoall.h"
#include "worker/host/barrier.h"
#include "worker/host/broadcast.h"
#include "worker/host/reduce_scatter.h"
#include "worker/host/select.h"
#include "worker/host/store.h"
#include "worker/inc_engine.h"
#include "worker/mesh_connect.h"
#include "worker/path_policy.h"
#include "worker/plugin/plugin_loader.h"
#include "worker/sharded_engine.h"
#include "worker/transport/fault_transport.h"
#include "worker/transport/udp_factory.h"

namespace ina {
namespace worker {
namespace {

bool overlap_partially(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  if (x == y) return false;
  return x < y ? y - x < bytes : x - y < bytes;
}

Status no_mesh(const char* what) {
  return failed_precondition(std::string(what) +
                             ": host collectives need the host mesh: set INA_STORE=host:port or "
                             "MASTER_ADDR and MASTER_PORT (Config::store)");
}

Status check_dtype(const char* what, DType dtype) {
  if (!is_valid_dtype(static_cast<uint8_t>(dtype))) {
    return invalid_argument(std::string(what) + ": unknown dtype " +
                            std::to_string(static_cast<int>(dtype)) +
                            " (int32=1, float32=2, float16=3, bfloat16=4, float8_e4m3=5, "
                            "float8_e5m2=6)");
  }
  return ok_status();
}

Status check_op(const char* what, ReduceOp op) {
  if (!is_valid_op(static_cast<uint8_t>(op))) {
    return invalid_argument(std::string(what) + ": unknown op " +
                            std::to_string(static_cast<int>(op)) + " (sum=1, min=2, max=3)");
  }
  return ok_status();
}

// The float types narrower than float32 (16- and 8-bit), which the host path reduces in float32.
bool is_narrow_float(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || is_float8(t);
}

// n float16/bfloat16/float8 elements of `in` as float32 (exact) in *out.
void widen(const void* in, size_t n, DType t, std::vector<float>* out) {
  out->resize(n);
  const auto* h = static_cast<const uint16_t*>(in);
  const auto* b = static_cast<const uint8_t*>(in);
  float* f = out->data();
  if (t == DType::kFloat16) {
    for (size_t i = 0; i < n; ++i) f[i] = half_to_float(h[i]);
  } else if (t == DType::kBFloat16) {
    for (size_t i = 0; i < n; ++i) f[i] = bf16_to_float(h[i]);
  } else if (t == DType::kFloat8E4M3) {
    for (size_t i = 0; i < n; ++i) f[i] = e4m3_to_float(b[i]);
  } else {
    for (size_t i = 0; i < n; ++i) f[i] = e5m2_to_float(b[i]);
  }
}

// n float32 rounded to float16/bfloat16/float8 (to nearest even; e4m3 saturates, fp8.h) into
// `out`.
void narrow(const float* in, size_t n, DType t, void* out) {
  auto* h = static_cast<uint16_t*>(out);
  auto* b = static_cast<uint8_t*>(out);
  if (t == DType::kFloat16) {
    for (size_t i = 0; i < n; ++i) h[i] = float_to_half(in[i]);
  } else if (t == DType::kBFloat16) {
    for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16(in[i]);
  } else if (t == DType::kFloat8E4M3) {
    for (size_t i = 0; i < n; ++i) b[i] = float_to_e4m3(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) b[i] = float_to_e5m2(in[i]);
  }
}

Status check_count(const char* what, size_t count, size_t blocks, DType dtype) {
  const size_t esize = dtype_size(dtype);
  if (blocks == 0) blocks = 1;
  if (count > SIZE_MAX / esize / blocks) {
    return invalid_argument(std::string(what) + ": count " + std::to_string(count) + " overflows");
  }
  return ok_status();
}

// Exact mode's host AllReduce moves its words in chunks of at most this many elements (whole
// blocks): 2 MiB of int64 words and 3 MiB of float32's limbs (4 MiB beyond 1024 ranks).
constexpr size_t kExactChunkElems = size_t{1} << 18;

// The communicator: argument checks, the host collectives, and the path policy (path_policy.h)
// that runs each AllReduce in-network or on the host mesh.
class CommunicatorImpl final : public Communicator {
 public:
  // `transports`: one per aggregator of the job in shard order (empty: host only).
  CommunicatorImpl(const Config& cfg, std::vector<std::unique_ptr<Transport>> transports,
                   std::unique_ptr<host::TcpStore> store, std::unique_ptr<host::Context> mesh,
                   const std::string& not_served)
      : cfg_(cfg),
        store_(std::move(store)),
        mesh_(std::move(mesh)),
        policy_(
            cfg,
            transports.empty() ? nullptr
                               : std::make_unique<ShardedEngine>(cfg, std::move(transports)),
            mesh_.get(),
            [this](const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
              return host_allreduce(send, recv, count, dtype, op);
            },
            [this](size_t bytes) { return algo(bytes); }, not_served) {}

  ~CommunicatorImpl() override {
    worker::release(cfg_);  // best effort: frees the job's slots once every rank is done
    const CommStats& s = stats();
    INA_DEBUG("worker",
              "rank %d closes: %" PRIu64 " collectives, %" PRIu64 " packets sent, %" PRIu64
              " received, %" PRIu64 " retransmits, %" PRIu64 " duplicate results, %" PRIu64
              " malformed, %" PRIu64 " bad tags, %" PRIu64 " error reports, %" PRIu64
              " on the host path, %" PRIu64 " fallbacks",
              cfg_.rank, s.collectives, s.packets_sent, s.packets_received, s.retransmits,
              s.duplicate_results, s.malformed, s.bad_tag, s.error_reports, s.host_collectives,
              s.fallbacks);
  }

  // Measures the host cost model, then joins the aggregator (path_policy.h).
  Status start() {
    INA_RETURN_IF_ERROR(setup_cost_model());
    return policy_.start();
  }

  Status allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    INA_RETURN_IF_ERROR(check_dtype("allreduce", dtype));
    INA_RETURN_IF_ERROR(check_op("allreduce", op));
    if (count > 0 && (send == nullptr || recv == nullptr)) {
      return invalid_argument(std::string("allreduce: ") + (send == nullptr ? "send" : "recv") +
                              " is null with count " + std::to_string(count));
    }
    INA_RETURN_IF_ERROR(check_count("allreduce", count, 1, dtype));
    const size_t bytes = count * dtype_size(dtype);
    if (overlap_partially(send, recv, bytes)) {
      return invalid_argument(
          "allreduce: send and recv overlap without being equal (in place needs send == recv)");
    }
    return policy_.allreduce(send, recv, count, dtype, op);
  }

  // The asynchronous form lives in the wrapper every communicator comes in
  // (device/async_communicator.cc); this object only ever runs blocking collectives.
  Result<std::unique_ptr<Request>> allreduce_async(const void*, void*, size_t, DType, ReduceOp,
                                                   void*) override {
    return internal_error("allreduce_async reached the host communicator without its wrapper");
  }

  uint32_t block_elems() const override { return policy_.block_elems(); }

  Status allgather(const void* send, void* recv, size_t count, DType dtype) override {
    if (!mesh_) return no_mesh("allgather");
    INA_RETURN_IF_ERROR(check_dtype("allgather", dtype));
    INA_RETURN_IF_ERROR(
        check_count("allgather", count, static_cast<size_t>(cfg_.world_size), dtype));
    INA_RETURN_IF_ERROR(count_host());
    return host::allgather(*mesh_, send, recv, count, dtype);
  }

  Status reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                        ReduceOp op) override {
    if (!mesh_) return no_mesh("reduce_scatter");
    INA_RETURN_IF_ERROR(check_dtype("reduce_scatter", dtype));
    INA_RETURN_IF_ERROR(check_op("reduce_scatter", op));
    INA_RETURN_IF_ERROR(
        check_count("reduce_scatter", count, static_cast<size_t>(cfg_.world_size), dtype));
    INA_RETURN_IF_ERROR(count_host());
    if (is_narrow_float(dtype) && count > 0) {
      // As float mode's AllReduce: in float32, one rounding at the end.
      if (send == nullptr || recv == nullptr) {
        return invalid_argument("reduce_scatter: null buffer");
      }
      widen(send, count * static_cast<size_t>(cfg_.world_size), dtype, &wide_);
      wide_out_.resize(count);
      INA_RETURN_IF_ERROR(
          host::reduce_scatter(*mesh_, wide_.data(), wide_out_.data(), count, DType::kFloat32, op));
      narrow(wide_out_.data(), count, dtype, recv);
      return ok_status();
    }
    return host::reduce_scatter(*mesh_, send, recv, count, dtype, op);
  }

  Status broadcast(void* buf, size_t count, DType dtype, int root) override {
    if (!mesh_) return no_mesh("broadcast");
    INA_RETURN_IF_ERROR(check_dtype("broadcast", dtype));
    INA_RETURN_IF_ERROR(check_count("broadcast", count, 1, dtype));
    if (root < 0 || root >= cfg_.world_size) {
      return invalid_argument("broadcast: root " + std::to_string(root) + " is not in [0, " +
                              std::to_string(cfg_.world_size) + ")");
    }
    if (count > 0 && buf == nullptr) return invalid_argument("broadcast: buf is null");
    INA_RETURN_IF_ERROR(count_host());
    host::BroadcastOptions o;
    o.root = root;
    return host::broadcast(*mesh_, buf, count, dtype, o);
  }

  Status barrier() override {
    if (!mesh_) return no_mesh("barrier");
    INA_RETURN_IF_ERROR(count_host());
    return host::barrier(*mesh_);
  }

  Status alltoall(const void* send, void* recv, size_t count, DType dtype) override {
    if (!mesh_) return no_mesh("alltoall");
    INA_RETURN_IF_ERROR(check_dtype("alltoall", dtype));
    INA_RETURN_IF_ERROR(
        check_count("alltoall", count, static_cast<size_t>(cfg_.world_size), dtype));
    INA_RETURN_IF_ERROR(count_host());
    return host::alltoall(*mesh_, send, recv, count, dtype,
                          alltoall_options(count * dtype_size(dtype)));
  }

  Status alltoallv(const void* send, const size_t* send_counts, const size_t* send_displs,
                   void* recv, const size_t* recv_counts, const size_t* recv_displs,
                   DType dtype) override {
    if (!mesh_) return no_mesh("alltoallv");
    INA_RETURN_IF_ERROR(check_dtype("alltoallv", dtype));
    if (send_counts == nullptr || send_displs == nullptr || recv_counts == nullptr ||
        recv_displs == nullptr) {
      return invalid_argument("alltoallv: counts and displacements must not be null");
    }
    const auto n = static_cast<size_t>(cfg_.world_size);
    INA_RETURN_IF_ERROR(count_host());
    return host::alltoallv(*mesh_, send, {send_counts, n}, {send_displs, n}, recv, {recv_counts, n},
                           {recv_displs, n}, dtype);
  }

  bool on_host_path() const override { return policy_.on_host_path(); }
  int rank() const override { return cfg_.rank; }
  int size() const override { return cfg_.world_size; }
  const CommStats& stats() const override {
    stats_ = policy_.stats(host_stats_);
    return stats_;
  }

 private:
  // A host collective: first settles the path (a rank may be redoing an in-network AllReduce).
  Status count_host() {
    INA_RETURN_IF_ERROR(policy_.before_host_collective());
    ++host_stats_.collectives;
    policy_.count_host_collective();
    return ok_status();
  }

  // The host algorithms' cost model: Config::cost_model (INA_COST_MODEL) when given, else
  // measured on the mesh now (a collective: every rank runs it at the same point of start()).
  Status setup_cost_model() {
    if (!mesh_) return ok_status();
    if (!cfg_.cost_model.empty()) {
      INA_ASSIGN_OR_RETURN(cost_model_,
                           host::parse_cost_model(cfg_.cost_model, "cost_model (INA_COST_MODEL)"));
    } else if (cfg_.world_size > 1) {
      Result<host::CostModel> m = host::measure_cost_model(*mesh_);
      if (!m.ok())
        return Status(m.status().code(), "measuring the host cost model: " + m.status().message());
      cost_model_ = *m;
    }
    const int g = cfg_.alltoall_group;
    if (host::parse_alltoall_algorithm(cfg_.alltoall_algorithm) ==
            host::AlltoallAlgorithm::kHierarchical &&
        !host::alltoall_groups(cfg_.world_size, g))
      INA_WARN("host",
               "rank %d: INA_A2A_ALGO=hier needs nodes of G ranks, 1 < G < %d dividing the world "
               "size (INA_A2A_GROUP or LOCAL_WORLD_SIZE; have %d): AllToAll runs flat pairwise",
               cfg_.rank, cfg_.world_size, g);
    INA_DEBUG("host",
              "rank %d: cost model (%s): alpha %.1f us, beta %.3f ns/B, gamma %.3f ns/B; "
              "allreduce of 8 B: %s, 1 MiB: %s, 64 MiB: %s",
              cfg_.rank, cfg_.cost_model.empty() ? "measured" : "INA_COST_MODEL",
              cost_model_.alpha_s * 1e6, cost_model_.beta_s_per_byte * 1e9,
              cost_model_.gamma_s_per_byte * 1e9, host::algorithm_name(algo(8).algorithm).data(),
              host::algorithm_name(algo(1 << 20).algorithm).data(),
              host::algorithm_name(algo(64 << 20).algorithm).data());
    INA_DEBUG("host", "rank %d: alltoall of 64 B blocks: %s, 4 KiB: %s, 64 KiB: %s, 1 MiB: %s",
              cfg_.rank, a2a_name(64), a2a_name(4 << 10), a2a_name(64 << 10), a2a_name(1 << 20));
    return ok_status();
  }

  // AllToAll's algorithm for blocks of `block_bytes` (INA_A2A_ALGO, else the cost model).
  host::AlltoallOptions alltoall_options(size_t block_bytes) const {
    host::AlltoallOptions o;
    o.group_size = cfg_.alltoall_group;
    Result<host::AlltoallAlgorithm> a = host::select_alltoall(
        cost_model_, block_bytes, cfg_.world_size, o.group_size, cfg_.alltoall_algorithm);
    if (a.ok()) o.algorithm = *a;  // Config::validate checked alltoall_algorithm
    return o;
  }

  const char* a2a_name(size_t block_bytes) const {
    return host::alltoall_algorithm_name(alltoall_options(block_bytes).algorithm).data();
  }

  host::AllreduceOptions algo(size_t bytes) const {
    host::AllreduceOptions o;
    Result<host::AllreduceAlgorithm> a =
        host::select_allreduce(cost_model_, bytes, cfg_.world_size, cfg_.host_algorithm);
    if (a.ok()) o.algorithm = *a;  // Config::validate checked host_algorithm
    return o;
  }

  // AllReduce on the mesh. Exact mode reduces the in-network path's quantized words.
  Status host_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
    if (count == 0) return ok_status();
    if (cfg_.fallback == FallbackMode::kFloat && is_narrow_float(dtype)) {
      // Float mode, 16- and 8-bit types: widen to float32, reduce in float32, round once at the
      // end.
      // Reduced at their own width, every step would round the partial sum to 16 bits (up to
      // world_size - 1 roundings, each up to half an ulp of a partial sum that may be far larger
      // than the result). The cost: float32 words on the wire, twice (float8: four times) the
      // bytes.
      widen(send, count, dtype, &wide_);
      INA_RETURN_IF_ERROR(host::allreduce(*mesh_, wide_.data(), wide_.data(), count,
                                          DType::kFloat32, op, algo(count * 4)));
      narrow(wide_.data(), count, dtype, recv);
      return ok_status();
    }
    if (dtype == DType::kInt32 || cfg_.fallback == FallbackMode::kFloat) {
      return host::allreduce(*mesh_, send, recv, count, dtype, op, algo(count * dtype_size(dtype)));
    }
    // Exact mode: per block, what the aggregator computes (protocol/codec.h, the one codec both
    // use), so the host path returns the in-network path's bits. The block is the job's, in
    // bytes, over the element width. First the OR of the ranks' NONFINITE marks and (SUM) the
    // MAX of their block exponents, by one host MAX; then MIN/MAX reduce the order-preserving
    // keys, and SUM the fixed-point words quantized with the agreed E, in integers: int32 words
    // for the 16-bit types; float32's int64 words as limbs in int32 lanes, summed modulo 2^32:
    // three of 22 bits up to 1024 ranks (a limb sum stays below 1024 x 2^22 = 2^32; 12 bytes per
    // element), four of 16 bits beyond (65536 x 2^16; 16 bytes). The limbs recombine the int64
    // sum modulo 2^64, which is the exact sum since it fits. Then one conversion, as the
    // aggregator's.
    const size_t es = dtype_size(dtype);
    const size_t k = (size_t{policy_.block_elems()} * 4) / es;
    const size_t nb = (count + k - 1) / k;
    const bool sum = op == ReduceOp::kSum;
    const auto* in = static_cast<const uint8_t*>(send);
    auto* out = static_cast<uint8_t*>(recv);
    meta_.assign(sum ? 2 * nb : nb, 0);
    for (size_t b = 0; b < nb; ++b) {
      const size_t len = std::min(k, count - b * k);
      const codec::Scan scan = codec::scan(in + b * k * es, len, dtype, op);
      meta_[b] = scan.nonfinite ? 1 : 0;
      if (sum) meta_[nb + b] = scan.exp;
    }
    INA_RETURN_IF_ERROR(host::allreduce(*mesh_, meta_.data(), meta_.data(), meta_.size(),
                                        DType::kInt32, ReduceOp::kMax, algo(meta_.size() * 4)));
    const auto world = static_cast<uint32_t>(cfg_.world_size);
    const size_t limbs = !sum || wire::acc_bytes(dtype) != 8 ? 1 : world <= 1024 ? 3 : 4;
    const unsigned limb_bits = limbs == 3 ? 22 : 16;
    const uint64_t limb_mask = (uint64_t{1} << limb_bits) - 1;
    // The words go through the mesh in chunks of whole blocks, kExactChunkElems elements at most,
    // so that the scratch (acc_, q_: 8 + 4 x limbs bytes per element) stays bounded and warm
    // whatever the count: one 4 MiB float32 collective's words were 24 MiB of fresh memory, and
    // on a VM a first call spent most of its time in page faults (370 ms against 55 ms warm).
    const size_t chunk_blocks = std::max<size_t>(1, kExactChunkElems / k);
    for (size_t b0 = 0; b0 < nb; b0 += chunk_blocks) {
      const size_t b1 = std::min(nb, b0 + chunk_blocks);
      const size_t first = b0 * k;
      const size_t n = std::min(count, b1 * k) - first;
      if (sum) acc_.resize(std::max(acc_.size(), n));
      q_.resize(std::max(q_.size(), n * limbs));
      if (!sum) {
        // MIN/MAX: the order-preserving int32 keys, as the aggregator folds them.
        codec::keys32(in + first * es, n, dtype, q_.data());
        INA_RETURN_IF_ERROR(
            host::allreduce(*mesh_, q_.data(), q_.data(), n, DType::kInt32, op, algo(n * 4)));
      } else {
        for (size_t b = b0; b < b1; ++b) {
          const size_t len = std::min(k, count - b * k);
          codec::quantize(in + b * k * es, len, dtype, static_cast<int16_t>(meta_[nb + b]), world,
                          acc_.data() + (b - b0) * k);
        }
        for (size_t i = 0; i < n; ++i) {
          const auto u = static_cast<uint64_t>(acc_[i]);
          if (limbs == 1) {
            q_[i] = static_cast<int32_t>(acc_[i]);
          } else {
            for (size_t l = 0; l < limbs; ++l)
              q_[i * limbs + l] = static_cast<int32_t>((u >> (limb_bits * l)) & limb_mask);
          }
        }
        INA_RETURN_IF_ERROR(host::allreduce(*mesh_, q_.data(), q_.data(), n * limbs, DType::kInt32,
                                            ReduceOp::kSum, algo(n * limbs * 4)));
        for (size_t i = 0; i < n; ++i) {
          if (limbs == 1) {
            acc_[i] = q_[i];
          } else {
            uint64_t u = 0;
            for (size_t l = 0; l < limbs; ++l)
              u += uint64_t{static_cast<uint32_t>(q_[i * limbs + l])} << (limb_bits * l);
            acc_[i] = static_cast<int64_t>(u);
          }
        }
      }
      for (size_t b = b0; b < b1; ++b) {
        const size_t len = std::min(k, count - b * k);
        uint8_t* o = out + b * k * es;
        if (meta_[b] != 0) {
          codec::fill_nan(o, len, dtype);
        } else if (sum) {
          codec::dequantize(
              acc_.data() + (b - b0) * k, len, dtype,
              codec::scale_exponent(dtype, static_cast<int16_t>(meta_[nb + b]), world), o);
        } else {
          codec::from_keys32(q_.data() + (b - b0) * k, len, dtype, o);
        }
      }
    }
    return ok_status();
  }

  const Config cfg_;
  std::unique_ptr<host::TcpStore> store_;  // rank 0 serves the rendezvous while it lives
  std::unique_ptr<host::Context> mesh_;    // TcpMesh or VerbsMesh; null: no store configured
  host::CostModel cost_model_;             // agreed by every rank (setup_cost_model)
  PathPolicy policy_;                      // the in-network engine and the path of each AllReduce
  CommStats host_stats_;                   // collectives the communicator ran on the mesh
  mutable CommStats stats_;                // the policy's + host_stats_
  std::vector<int32_t> meta_;              // exact mode: per-block flags and exponents
  std::vector<int32_t> q_;                 // exact mode: the words on the host path (MIN/MAX: keys)
  std::vector<int64_t> acc_;               // exact mode: SUM's fixed-point words
  std::vector<float> wide_;      // float mode, reduce_scatter: 16-bit elements widened to float32
  std::vector<float> wide_out_;  // reduce_scatter of 16-bit elements: the float32 result
};

}  // namespace

Result<std::unique_ptr<Communicator>> create_communicator(const Config& cfg,
                                                          std::unique_ptr<Transport> transport) {
  return create_communicator(cfg, std::move(transport), make_cuda_device_ops());
}

Result<std::unique_ptr<Communicator>> create_communicator(const Config& cfg,
                                                          std::unique_ptr<Transport> transport,
                                                          std::unique_ptr<DeviceOps> device_ops) {
  std::vector<std::unique_ptr<Transport>> transports;
  if (transport) transports.push_back(std::move(transport));
  return create_communicator(cfg, std::move(transports), std::move(device_ops));
}

Result<std::unique_ptr<Communicator>> create_communicator(
    const Config& cfg, std::vector<std::unique_ptr<Transport>> transports,
    std::unique_ptr<DeviceOps> device_ops, const std::string& not_served) {
  INA_RETURN_IF_ERROR(cfg.validate());
  if (!transports.empty() && transports.size() != aggregator_list(cfg).size()) {
    return invalid_argument("create_communicator: " + std::to_string(transports.size()) +
                            " transports for " + std::to_string(aggregator_list(cfg).size()) +
                            " aggregators (Config::aggregators): one per shard expected");
  }
  for (size_t k = 0; k < transports.size(); ++k) {
    if (transports[k] == nullptr) {
      return invalid_argument("create_communicator: the transport of shard " + std::to_string(k) +
                              " is null");
    }
  }
  wrap_fault_injection(cfg, &transports);
  std::unique_ptr<host::TcpStore> store;
  std::unique_ptr<host::Context> mesh;
  if (!cfg.store.empty() || cfg.external_store != nullptr) {
    INA_ASSIGN_OR_RETURN(mesh, connect_mesh(cfg, &store));
  } else if (transports.empty()) {
    return invalid_argument(
        "no aggregator transport and no host mesh: set INA_STORE=host:port or MASTER_ADDR and "
        "MASTER_PORT");
  }
  if (!not_served.empty() && !cfg.require_inc) {
    INA_WARN("worker",
             "rank %d: INA is configured but not used: %s; every collective runs on the host "
             "mesh (INA_REQUIRE_INC=1 makes this an error)",
             cfg.rank, not_served.c_str());
  }
  auto comm = std::make_unique<CommunicatorImpl>(cfg, std::move(transports), std::move(store),
                                                 std::move(mesh), not_served);
  INA_RETURN_IF_ERROR(comm->start());
  return make_async_communicator(std::move(comm), std::move(device_ops), cfg);
}

}  // namespace worker

Result<std::unique_ptr<Communicator>> Communicator::create(const Config& given) {
  Config cfg = given;
  // Why this rank has no aggregator although one (or a controller) is configured: said once at
  // warning level (or, with INA_REQUIRE_INC=1, an error on every rank: PathPolicy::start).
  std::string not_served;
  if (cfg.host_only) {
    if (cfg.require_inc) {
      return failed_precondition(
          "INA_REQUIRE_INC=1, but every collective would run on the host mesh: " +
          host_only_reason(cfg));
    }
    INA_INFO("worker", "rank %d: every collective on the host mesh: %s", cfg.rank,
             host_only_reason(cfg).c_str());
  } else if (!cfg.controller_host.empty()) {
    INA_RETURN_IF_ERROR(cfg.validate());
    INA_RETURN_IF_ERROR(worker::admit(
        &cfg, std::min<std::chrono::milliseconds>(cfg.timeout, std::chrono::seconds(10)),
        &not_served));
  }
  INA_RETURN_IF_ERROR(cfg.validate());
  if (cfg.host_only) {
    return worker::create_communicator(cfg, {}, worker::make_cuda_device_ops(), not_served);
  }
  // Kernel-bypass transports are chosen by Config::transport (INA_TRANSPORT=dpdk|xdp) only: a
  // Config built in code keeps kAuto and never starts DPDK or binds AF_XDP by surprise.
  const bool want_dpdk = cfg.transport == AggregatorTransport::kDpdk;
  const bool want_xdp = cfg.transport == AggregatorTransport::kXdp;
  const char* kind = want_dpdk ? "dpdk" : "xdp";
  const std::vector<AggregatorAddress> aggregators = worker::aggregator_list(cfg);
  if ((want_dpdk || want_xdp) && aggregators.size() > 1) {
    // One kernel-bypass port (EAL, XSK) per process serves one aggregator today.
    return invalid_argument(std::string("INA_TRANSPORT=") + kind + ": a job sharded over " +
                            std::to_string(aggregators.size()) +
                            " aggregators (INA_AGGREGATOR list) needs INA_TRANSPORT=udp (or auto); "
                            "the " +
                            kind + " transport serves one aggregator");
  }
  if (want_dpdk || want_xdp) {
    // The options are built from cfg first (its fields were parsed from INA_LOCAL_IP ... by
    // Config::from_env and checked by validate), then the transport's plugin is loaded
    // (libina-dpdk.so, libina-xdp.so: plugin_loader.h); a plugin that cannot be loaded is an
    // error naming it (kFailedPrecondition: no silent move to the host path).
    Result<std::unique_ptr<worker::Transport>> t = unimplemented("");
    if (want_dpdk) {
      INA_ASSIGN_OR_RETURN(worker::DpdkTransportOptions o, worker::dpdk_options_from_config(cfg));
      t = worker::create_dpdk_transport(o);
    } else {
      INA_ASSIGN_OR_RETURN(worker::XdpTransportOptions o, worker::xdp_options_from_config(cfg));
      t = worker::create_xdp_transport(o);
    }
    if (!t.ok()) {
      if (cfg.store.empty() || t.status().code() != StatusCode::kUnavailable) return t.status();
      return worker::create_communicator(
          cfg, {}, worker::make_cuda_device_ops(),
          std::string(kind) + " transport unavailable: " + t.status().message());
    }
    INA_DEBUG("worker", "rank %d: transport %s to %s", cfg.rank, kind,
              t.value()->peer_name().c_str());
    return worker::create_communicator(cfg, std::move(t.value()));
  }
  // One kernel UDP socket per aggregator (shard).
  Result<std::vector<std::unique_ptr<worker::Transport>>> transports =
      worker::udp_transports(cfg.rank, aggregators);
  if (!transports.ok()) {
    if (cfg.store.empty() && cfg.external_store == nullptr) return transports.status();
    return worker::create_communicator(cfg, {}, worker::make_cuda_device_ops(),
                                       "no aggregator transport: " + transports.status().message());
  }
  return worker::create_communicator(cfg, std::move(transports).value(),
                                     worker::make_cuda_device_ops());
}

}  // namespace ina
