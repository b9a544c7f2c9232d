// The C ABI (ina/ina.h) over the C++ API: opaque handles, result codes, messages kept per
// communicator (and per thread for ina_comm_create). No exception crosses this boundary: every
// entry point catches, and std::bad_alloc becomes INA_NO_MEMORY.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "ina/ina.h"
#include "ina/ina.hpp"
#include "ina_config.h"
#include "worker/config_internal.h"
#include "worker/device/device_ops.h"

struct ina_comm {
  std::unique_ptr<ina::Communicator> comm;
  std::string last_error;
};

struct ina_request {
  std::unique_ptr<ina::Request> req;
  std::string error;
};

namespace {

// The only mutable global state of the library: the message of this thread's last failed
// ina_comm_create (there is no handle to keep it in).
thread_local std::string t_create_error;

// Assigning a message may itself run out of memory; the boundary must not throw, so it then
// keeps no message rather than a wrong one.
void set_message(std::string& dst, const char* msg) noexcept {
  try {
    dst = msg;
  } catch (...) {
    dst.clear();
  }
}
void set_message(std::string& dst, const std::string& msg) noexcept {
  set_message(dst, msg.c_str());
}

ina_result_t to_result(ina::StatusCode code) {
  using ina::StatusCode;
  switch (code) {
    case StatusCode::kOk: return INA_SUCCESS;
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists: return INA_INVALID_ARGUMENT;
    case StatusCode::kDeadlineExceeded: return INA_TIMEOUT;
    case StatusCode::kUnavailable: return INA_UNAVAILABLE;
    case StatusCode::kAborted:
    case StatusCode::kDataLoss: return INA_REMOTE_ERROR;
    case StatusCode::kResourceExhausted: return INA_NO_MEMORY;
    case StatusCode::kUnimplemented: return INA_NOT_SUPPORTED;
    case StatusCode::kInternal: return INA_INTERNAL_ERROR;
  }
  return INA_INTERNAL_ERROR;
}

ina_result_t fail(std::string& dst, const ina::Status& s) noexcept {
  set_message(dst,
              s.message().empty() ? std::string(ina::status_code_name(s.code())) : s.message());
  return to_result(s.code());
}

// Runs `body` and turns an escaping exception into a result code and message.
template <typename F>
ina_result_t guarded(std::string& err, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    set_message(err, "out of memory");
    return INA_NO_MEMORY;
  } catch (const std::exception& e) {
    set_message(err, std::string("internal error: ") + e.what());
    return INA_INTERNAL_ERROR;
  } catch (...) {
    set_message(err, "internal error: unknown exception");
    return INA_INTERNAL_ERROR;
  }
}

// A C enum's value as the caller stored it. A C caller may pass any int, and loading a C++ enum
// object outside its range is undefined (UBSan's -fsanitize=enum): read the bytes instead.
template <class E>
int raw_enum(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized here");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// Range-checks a C enum as an int: a cast to the 8-bit C++ enum would wrap 257 to 1.
bool c_dtype(std::string& err, const char* fn, const ina_dtype_t& dtype, ina::DType* out) {
  const int d = raw_enum(dtype);
  if (!(d >= 1 && d <= 6)) {
    set_message(err, std::string(fn) + ": unknown dtype " + std::to_string(d) +
                         " (INA_INT32, INA_FLOAT32, INA_FLOAT16, INA_BFLOAT16, INA_FLOAT8_E4M3, "
                         "INA_FLOAT8_E5M2)");
    return false;
  }
  *out = static_cast<ina::DType>(d);
  return true;
}

bool c_op(std::string& err, const char* fn, const ina_op_t& op, ina::ReduceOp* out) {
  const int o = raw_enum(op);
  if (!(o >= 1 && o <= 3)) {
    set_message(err, std::string(fn) + ": unknown op " + std::to_string(o) +
                         " (INA_SUM, INA_MIN, INA_MAX)");
    return false;
  }
  *out = static_cast<ina::ReduceOp>(o);
  return true;
}

ina_result_t result_of(std::string& err, const ina::Status& s) noexcept {
  return s.ok() ? INA_SUCCESS : fail(err, s);
}

// Config::from_env (from_env_with_store when the application brings the store) overlaid with
// the non-zero (non-NULL, rank != -1) fields of `c`.
ina::Result<ina::Config> merge_config(const ina_config_t* c, bool own_store) {
  INA_ASSIGN_OR_RETURN(ina::Config cfg,
                       own_store ? ina::Config::from_env_with_store() : ina::Config::from_env());
  if (c == nullptr) return cfg;
  // struct_size first: it is the one field every version of the struct has at offset 0.
  if (c->struct_size < sizeof(ina_config_t)) {
    return ina::invalid_argument("config.struct_size is " + std::to_string(c->struct_size) +
                                 ", expected at least " + std::to_string(sizeof(ina_config_t)) +
                                 ": initialize the config with INA_CONFIG_INITIALIZER or "
                                 "ina_config_init()");
  }
  if (c->version != INA_CONFIG_VERSION) {
    return ina::invalid_argument("config.version is " + std::to_string(c->version) +
                                 ", this libina supports version " +
                                 std::to_string(INA_CONFIG_VERSION) +
                                 ": initialize the config with INA_CONFIG_INITIALIZER or "
                                 "ina_config_init()");
  }
  if (c->rank != -1) cfg.rank = c->rank;
  if (c->world_size != 0) cfg.world_size = c->world_size;
  if (c->aggregator != nullptr) {
    // One "host:port", or a comma-separated list (the job sharded over those aggregators).
    std::vector<ina::AggregatorAddress> list;
    INA_RETURN_IF_ERROR(
        ina::worker::parse_aggregator_list(c->aggregator, "config.aggregator", &list));
    ina::worker::set_aggregators(&cfg, std::move(list));
    // An aggregator named here: only INA_TRANSPORT=host keeps the job off it.
    cfg.host_only = cfg.transport == ina::AggregatorTransport::kHost;
  }
  if (c->job != 0) cfg.job = c->job;
  if (c->job_key != nullptr && !ina::parse_key_hex(c->job_key, &cfg.job_key)) {
    return ina::invalid_argument(
        "config.job_key is not valid: expected 32 hexadecimal digits, "
        "the job's 128-bit key (or NULL: INA_JOB_KEY or none)");
  }
  if (c->block_elems != 0) cfg.block_elems = c->block_elems;
  if (c->window != 0) cfg.window = c->window;
  if (c->timeout_ms != 0) cfg.timeout = std::chrono::milliseconds(c->timeout_ms);
  if (c->retransmit_us != 0) cfg.retransmit = std::chrono::microseconds(c->retransmit_us);
  return cfg;
}

// The C ABI's ina_store_t as the C++ API's ExternalStore.
class CStore final : public ina::ExternalStore {
 public:
  explicit CStore(const ina_store_t& s) : s_(s) {}

  ina::Status set(const std::string& key, const std::vector<uint8_t>& value) override {
    const ina_result_t r = s_.set(s_.ctx, key.c_str(), value.data(), value.size());
    if (r == INA_SUCCESS) return ina::ok_status();
    return ina::unavailable("ina_store_t.set('" + key + "') failed: " + ina_result_string(r));
  }

  ina::Result<std::vector<uint8_t>> get(const std::string& key,
                                        std::chrono::milliseconds timeout) override {
    const auto ms = static_cast<uint32_t>(
        std::clamp<int64_t>(timeout.count(), 0, std::numeric_limits<uint32_t>::max()));
    std::vector<uint8_t> value(256);
    for (int attempt = 0; attempt < 4; ++attempt) {
      size_t size = 0;
      const ina_result_t r = s_.get(s_.ctx, key.c_str(), ms, value.data(), value.size(), &size);
      if (r == INA_TIMEOUT) {
        return ina::deadline_exceeded("ina_store_t.get: key '" + key + "' not set within " +
                                      std::to_string(ms) + " ms");
      }
      if (r != INA_SUCCESS) {
        return ina::unavailable("ina_store_t.get('" + key + "') failed: " + ina_result_string(r));
      }
      if (size <= value.size()) {
        value.resize(size);
        return value;
      }
      value.resize(size);  // too small: again with the size it asked for
    }
    return ina::internal_error("ina_store_t.get('" + key +
                               "'): the value kept growing beyond the buffer");
  }

 private:
  ina_store_t s_;
};

ina_result_t create_comm(const ina_config_t* config, const ina_store_t* store, ina_comm_t** comm) {
  return guarded(t_create_error, [&]() -> ina_result_t {
    const char* fn = store != nullptr ? "ina_comm_create_with_store" : "ina_comm_create";
    if (comm == nullptr) {
      set_message(t_create_error, std::string(fn) + ": comm (the output pointer) is NULL");
      return INA_INVALID_ARGUMENT;
    }
    *comm = nullptr;
    ina::Result<ina::Config> cfg = merge_config(config, store != nullptr);
    if (!cfg.ok()) return fail(t_create_error, cfg.status());
    std::unique_ptr<CStore> external;
    if (store != nullptr) {
      if (store->set == nullptr || store->get == nullptr) {
        set_message(t_create_error,
                    std::string(fn) + ": store->set and store->get must both be set");
        return INA_INVALID_ARGUMENT;
      }
      external = std::make_unique<CStore>(*store);
      cfg->external_store = external.get();
    }
    ina::Result<std::unique_ptr<ina::Communicator>> c = ina::Communicator::create(*cfg);
    if (!c.ok()) return fail(t_create_error, c.status());
    auto handle = std::make_unique<ina_comm>();
    handle->comm = std::move(c.value());
    *comm = handle.release();
    return INA_SUCCESS;
  });
}

}  // namespace

extern "C" {

void ina_config_init(ina_config_t* config) {
  if (config == nullptr) return;
  const ina_config_t init = INA_CONFIG_INITIALIZER;
  *config = init;
}

ina_result_t ina_comm_create(const ina_config_t* config, ina_comm_t** comm) {
  return create_comm(config, nullptr, comm);
}

ina_result_t ina_comm_create_with_store(const ina_config_t* config, const ina_store_t* store,
                                        ina_comm_t** comm) {
  if (store == nullptr) {
    set_message(t_create_error, "ina_comm_create_with_store: store is NULL");
    if (comm != nullptr) *comm = nullptr;
    return INA_INVALID_ARGUMENT;
  }
  return create_comm(config, store, comm);
}

void ina_comm_destroy(ina_comm_t* comm) { delete comm; }

int ina_comm_rank(const ina_comm_t* comm) { return comm == nullptr ? -1 : comm->comm->rank(); }

int ina_comm_size(const ina_comm_t* comm) { return comm == nullptr ? -1 : comm->comm->size(); }

ina_result_t ina_allreduce(ina_comm_t* comm, const void* send, void* recv, size_t count,
                           ina_dtype_t dtype, ina_op_t op) {
  if (comm == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(comm->last_error, [&]() -> ina_result_t {
    ina::DType d{};
    ina::ReduceOp o{};
    if (!c_dtype(comm->last_error, "ina_allreduce", dtype, &d) ||
        !c_op(comm->last_error, "ina_allreduce", op, &o)) {
      return INA_INVALID_ARGUMENT;
    }
    return result_of(comm->last_error, comm->comm->allreduce(send, recv, count, d, o));
  });
}

ina_result_t ina_allreduce_async(ina_comm_t* comm, const void* send, void* recv, size_t count,
                                 ina_dtype_t dtype, ina_op_t op, void* cuda_stream,
                                 ina_request_t** req) {
  if (comm == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(comm->last_error, [&]() -> ina_result_t {
    if (req == nullptr) {
      set_message(comm->last_error, "ina_allreduce_async: req (the output pointer) is NULL");
      return INA_INVALID_ARGUMENT;
    }
    *req = nullptr;
    ina::DType d{};
    ina::ReduceOp o{};
    if (!c_dtype(comm->last_error, "ina_allreduce_async", dtype, &d) ||
        !c_op(comm->last_error, "ina_allreduce_async", op, &o)) {
      return INA_INVALID_ARGUMENT;
    }
    auto handle = std::make_unique<ina_request>();
    ina::Result<std::unique_ptr<ina::Request>> r =
        comm->comm->allreduce_async(send, recv, count, d, o, cuda_stream);
    if (!r.ok()) return fail(comm->last_error, r.status());
    handle->req = std::move(r.value());
    *req = handle.release();
    return INA_SUCCESS;
  });
}

ina_result_t ina_test(ina_request_t* req, int* done) {
  if (req == nullptr || done == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(req->error, [&]() -> ina_result_t {
    bool d = false;
    const ina::Status s = req->req->test(&d);
    *done = d ? 1 : 0;
    return result_of(req->error, s);
  });
}

ina_result_t ina_wait(ina_request_t* req) {
  if (req == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(req->error,
                 [&]() -> ina_result_t { return result_of(req->error, req->req->wait()); });
}

const char* ina_request_error(const ina_request_t* req) {
  return req == nullptr ? "" : req->error.c_str();
}

void ina_request_free(ina_request_t* req) { delete req; }

int ina_cuda_available(const char** why) {
  thread_local std::string t_why;
  try {
    const ina::Status s = ina::worker::make_cuda_device_ops()->available();
    set_message(t_why, s.message());
    if (why != nullptr) *why = t_why.c_str();
    return s.ok() ? 1 : 0;
  } catch (...) {
    if (why != nullptr) *why = "out of memory";
    return 0;
  }
}

ina_result_t ina_allgather(ina_comm_t* comm, const void* send, void* recv, size_t count,
                           ina_dtype_t dtype) {
  if (comm == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(comm->last_error, [&]() -> ina_result_t {
    ina::DType d{};
    if (!c_dtype(comm->last_error, "ina_allgather", dtype, &d)) return INA_INVALID_ARGUMENT;
    return result_of(comm->last_error, comm->comm->allgather(send, recv, count, d));
  });
}

ina_result_t ina_reduce_scatter(ina_comm_t* comm, const void* send, void* recv, size_t count,
                                ina_dtype_t dtype, ina_op_t op) {
  if (comm == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(comm->last_error, [&]() -> ina_result_t {
    ina::DType d{};
    ina::ReduceOp o{};
    if (!c_dtype(comm->last_error, "ina_reduce_scatter", dtype, &d) ||
        !c_op(comm->last_error, "ina_reduce_scatter", op, &o)) {
      return INA_INVALID_ARGUMENT;
    }
    return result_of(comm->last_error, comm->comm->reduce_scatter(send, recv, count, d, o));
  });
}

ina_result_t ina_broadcast(ina_comm_t* comm, void* buf, size_t count, ina_dtype_t dtype, int root) {
  if (comm == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(comm->last_error, [&]() -> ina_result_t {
    ina::DType d{};
    if (!c_dtype(comm->last_error, "ina_broadcast", dtype, &d)) return INA_INVALID_ARGUMENT;
    return result_of(comm->last_error, comm->comm->broadcast(buf, count, d, root));
  });
}

ina_result_t ina_barrier(ina_comm_t* comm) {
  if (comm == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(comm->last_error, [&]() -> ina_result_t {
    return result_of(comm->last_error, comm->comm->barrier());
  });
}

ina_result_t ina_alltoall(ina_comm_t* comm, const void* send, void* recv, size_t count,
                          ina_dtype_t dtype) {
  if (comm == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(comm->last_error, [&]() -> ina_result_t {
    ina::DType d{};
    if (!c_dtype(comm->last_error, "ina_alltoall", dtype, &d)) return INA_INVALID_ARGUMENT;
    return result_of(comm->last_error, comm->comm->alltoall(send, recv, count, d));
  });
}

ina_result_t ina_alltoallv(ina_comm_t* comm, const void* send, const size_t* send_counts,
                           const size_t* send_displs, void* recv, const size_t* recv_counts,
                           const size_t* recv_displs, ina_dtype_t dtype) {
  if (comm == nullptr) return INA_INVALID_ARGUMENT;
  return guarded(comm->last_error, [&]() -> ina_result_t {
    ina::DType d{};
    if (!c_dtype(comm->last_error, "ina_alltoallv", dtype, &d)) return INA_INVALID_ARGUMENT;
    return result_of(comm->last_error, comm->comm->alltoallv(send, send_counts, send_displs, recv,
                                                             recv_counts, recv_displs, d));
  });
}

int ina_comm_on_host_path(const ina_comm_t* comm) {
  return comm == nullptr ? -1 : (comm->comm->on_host_path() ? 1 : 0);
}

const char* ina_result_string(ina_result_t result) {
  switch (result) {
    case INA_SUCCESS: return "success";
    case INA_INVALID_ARGUMENT: return "invalid argument or configuration";
    case INA_TIMEOUT: return "collective deadline exceeded";
    case INA_UNAVAILABLE: return "aggregator unavailable";
    case INA_REMOTE_ERROR: return "the aggregator reported an error";
    case INA_NO_MEMORY: return "out of memory";
    case INA_NOT_SUPPORTED: return "not supported";
    case INA_INTERNAL_ERROR: return "internal error";
  }
  return "unknown ina_result_t";
}

const char* ina_comm_last_error(const ina_comm_t* comm) {
  return comm == nullptr ? "" : comm->last_error.c_str();
}

const char* ina_last_create_error(void) { return t_create_error.c_str(); }

const char* ina_version(void) { return INA_VERSION; }

}  // extern "C"
