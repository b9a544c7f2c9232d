// A free loopback TCP port for the tests (0 when none could be had, which the tests assert
// against): ina::host::free_tcp_port on 127.0.0.1.
#pragma once

#include <cstdint>

#include "worker/host/socket.h"

namespace ina::testing {

inline uint16_t free_loopback_port() {
  const Result<uint16_t> p = host::free_tcp_port("127.0.0.1");
  return p.ok() ? p.value() : 0;
}

}  // namespace ina::testing
