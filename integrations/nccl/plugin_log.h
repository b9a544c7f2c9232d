// Logging of the NCCL plugins through NCCL's logger (set by init()), or stderr for warnings
// before init.
#pragma once

#include <cstdio>

#include "integrations/nccl/collnet_v8.h"

namespace ina::nccl {

inline ncclDebugLogger_t& nccl_logger() {
  static ncclDebugLogger_t log = nullptr;
  return log;
}

}  // namespace ina::nccl

#define INA_NCCL_LOG(level, ...)                                  \
  do {                                                            \
    ncclDebugLogger_t ina_log_ = ::ina::nccl::nccl_logger();      \
    if (ina_log_ != nullptr) {                                    \
      ina_log_(level, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); \
    } else if (level == NCCL_LOG_WARN) {                          \
      std::fprintf(stderr, "NCCL WARN ");                         \
      std::fprintf(stderr, __VA_ARGS__);                          \
      std::fprintf(stderr, "\n");                                 \
    }                                                             \
  } while (0)
#define INA_NCCL_WARN(...) INA_NCCL_LOG(NCCL_LOG_WARN, __VA_ARGS__)
#define INA_NCCL_INFO(...) INA_NCCL_LOG(NCCL_LOG_INFO, __VA_ARGS__)
